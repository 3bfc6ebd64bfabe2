# Run at build time (cmake -P, from common/CMakeLists.txt's ss_build_commit target): writes OUT
# from IN with @SS_GIT_COMMIT@ set to SOURCE_DIR's git commit (short hash, "+dirty" when a
# tracked file differs from it), or "unknown" where SOURCE_DIR is not the top of a git work tree
# (a tarball) or git is missing. configure_file rewrites OUT only when its text changes, so a
# build at the same commit recompiles nothing.
#
#   cmake -DSOURCE_DIR=... -DIN=... -DOUT=... [-DGIT_EXECUTABLE=...] -P build_commit.cmake
set(SS_GIT_COMMIT unknown)
if(GIT_EXECUTABLE)
  execute_process(
    COMMAND ${GIT_EXECUTABLE} -C ${SOURCE_DIR} rev-parse --show-toplevel --short HEAD
    OUTPUT_VARIABLE out RESULT_VARIABLE rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(rc EQUAL 0)
    string(REPLACE "\n" ";" out "${out}")
    list(LENGTH out n)
    if(n EQUAL 2)
      list(GET out 0 top)
      list(GET out 1 hash)
      file(REAL_PATH "${top}" top)
      file(REAL_PATH "${SOURCE_DIR}" src)
      # A tarball unpacked inside some other repository is not that repository's commit.
      if(top STREQUAL src)
        set(SS_GIT_COMMIT ${hash})
        # --no-optional-locks: a build never takes the index lock a user's git command may want.
        execute_process(
          COMMAND ${GIT_EXECUTABLE} -C ${SOURCE_DIR} --no-optional-locks status --porcelain
                  --untracked-files=no
          OUTPUT_VARIABLE changes RESULT_VARIABLE rc ERROR_QUIET)
        if(NOT rc EQUAL 0 OR NOT changes STREQUAL "")
          string(APPEND SS_GIT_COMMIT "+dirty")
        endif()
      endif()
    endif()
  endif()
endif()
configure_file(${IN} ${OUT} @ONLY)
