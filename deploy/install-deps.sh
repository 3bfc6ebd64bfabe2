#!/usr/bin/env bash
# Installs every Debian 12 package splitserve's build and tests need (python3, clang-format and git
# also run deploy/test.sh's checks: tools/check_layering.py, tools/check_format.sh).
# Idempotent and non-interactive; run as root (or through sudo).
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libabsl-dev
  libspdlog-dev libfmt-dev
  nlohmann-json3-dev
  libpcre2-dev
  libhwloc-dev
  libgtest-dev libgmock-dev googletest
  libcpp-httplib-dev
  libgrpc++-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  prometheus-cpp-dev
  python3 clang-format
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node and npm run the `openai` npm client test (tests/e2e/openai_client). Checked as commands:
# a node installed otherwise (NodeSource's nodejs bundles npm and conflicts with Debian's npm)
# counts.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages, node and npm present"
  exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
