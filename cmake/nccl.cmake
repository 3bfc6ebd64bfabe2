# NCCL for the cuda backend's tensor parallelism (gpu_worker/nccl_comm.h). Looked for under
# NCCL_ROOT (CMake or environment variable), next to the CUDA toolkit, then in the system's paths;
# a pip wheel's layout (nvidia/nccl/{include,lib} with only libnccl.so.2) is found through
# NCCL_ROOT too. Defines SS_HAVE_NCCL and, when found, the imported target ss::nccl.
#
# NCCL is optional: without it everything builds, the cuda backend runs TP = 1 and refuses
# TP > 1 with a clear error (CI compiles the CUDA code on machines that may lack NCCL).
# SS_WITH_NCCL=OFF skips the search (to check the build without NCCL).
option(SS_WITH_NCCL "link NCCL when found (tensor parallelism in the cuda backend)" ON)
set(SS_HAVE_NCCL OFF)
if(SS_WITH_NCCL)
  set(_ss_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_ROOT})
  find_path(NCCL_INCLUDE_DIR nccl.h
    HINTS ${_ss_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS}
    PATH_SUFFIXES include)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2
    HINTS ${_ss_nccl_hints} ${CUDAToolkit_LIBRARY_DIR}
    PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(SS_HAVE_NCCL ON)
    if(NOT TARGET ss::nccl)
      add_library(ss::nccl UNKNOWN IMPORTED)
      set_target_properties(ss::nccl PROPERTIES
        IMPORTED_LOCATION "${NCCL_LIBRARY}"
        INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
    endif()
    message(STATUS "splitserve: NCCL found (${NCCL_LIBRARY}); tensor parallelism builds")
  else()
    message(STATUS "splitserve: no NCCL (set NCCL_ROOT); the cuda backend builds for TP = 1 only")
  endif()
endif()
