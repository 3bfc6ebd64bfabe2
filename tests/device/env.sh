# The device machine's environment for scripts that run there (sourced by tests/device_suite.sh and
# bench/flash_e2e.sh): NCCL's settings, no proxy for loopback, `http`, the loader path of prebuilt
# binaries.
# NVLink multicast stays off (the device machines' rule; NCCL reads it when TP tests run).
export NCCL_NVLS_ENABLE=0
# Loopback requests must not go through a proxy the machine's environment may name.
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY all_proxy ALL_PROXY
export no_proxy='*' NO_PROXY='*'
# curl when present, else python3 (the accelerator image may lack curl): http GET|POST URL [BODY].
# Without the carried libraries on the loader path: the system's curl must not load Debian's
# libcurl.
http() {
  if command -v curl >/dev/null 2>&1; then
    if [ "$1" = GET ]; then
      env -u LD_LIBRARY_PATH curl -sf "$2"
    else
      env -u LD_LIBRARY_PATH curl -sf "$2" -H 'Content-Type: application/json' -d "$3"
    fi
  else
    env -u LD_LIBRARY_PATH python3 - "$@" <<'PY'
import sys, urllib.request
method, url = sys.argv[1], sys.argv[2]
data = sys.argv[3].encode() if len(sys.argv) > 3 else None
req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
try:
    sys.stdout.write(urllib.request.urlopen(req, timeout=120).read().decode())
except Exception as e:
    sys.stdout.write(str(e)); sys.exit(1)
PY
  fi
}
if [ -z "${NCCL_ROOT:-}" ] && ! ls /usr/local/cuda/include/nccl.h >/dev/null 2>&1; then
  h=$(find /usr /opt -name nccl.h -path '*include*' 2>/dev/null | head -1)
  [ -n "$h" ] && export NCCL_ROOT="$(dirname "$(dirname "$h")")"
fi

# The loader path for prebuilt binaries in $1 (SS_DEVICE_BIN): their shared libraries in $1/lib,
# CUDA's, and NCCL's (NCCL_ROOT's, else the Python wheel's, else any libnccl.so.2 found).
prebuilt_library_path() {
  [ -n "${NCCL_ROOT:-}" ] && export LD_LIBRARY_PATH="$NCCL_ROOT/lib:${LD_LIBRARY_PATH:-}"
  export LD_LIBRARY_PATH="$PWD/$1:$PWD/$1/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  local nccl
  nccl=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))" 2>/dev/null)
  [ -n "$nccl" ] || nccl=$(dirname "$(find / -name 'libnccl.so.2' 2>/dev/null | head -1)")
  export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$nccl"
}

