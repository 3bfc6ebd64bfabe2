# Helpers that keep every component's CMakeLists.txt a few lines long.
#
#   ss_library(NAME SRCS a.cc b.cc DEPS dep1 dep2 [PUBLIC_DEPS pdep...])
#   ss_executable(NAME SRCS main.cc DEPS lib...)          -> <build>/bin/NAME
#   ss_test(NAME SRCS t.cc DEPS lib... LABELS unit|golden|e2e|gpu [WORKING_DIRECTORY dir])
#
# Our own code is compiled with warnings as errors. FP contraction is off everywhere:
# the reference model must round exactly where the official demo rounds, and a fused
# multiply-add changes the bits.

# SS_WERROR=OFF keeps the warnings but not as errors: for compilers newer than Debian 12's GCC 12
# whose false positives (e.g. GCC 13's -Warray-bounds inside fmt) are not ours to fix.
option(SS_WERROR "treat warnings as errors" ON)
set(SS_WARNINGS -Wall -Wextra -Wpedantic -Wno-unused-parameter)
if(SS_WERROR)
  list(APPEND SS_WARNINGS -Werror)
endif()
set(SS_CXX_FLAGS -ffp-contract=off)

function(_ss_common target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${SS_WARNINGS} ${SS_CXX_FLAGS}>)
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
endfunction()

function(ss_library name)
  cmake_parse_arguments(A "" "" "SRCS;DEPS;PUBLIC_DEPS" ${ARGN})
  add_library(${name} STATIC ${A_SRCS})
  _ss_common(${name})
  target_link_libraries(${name} PUBLIC ${A_PUBLIC_DEPS} PRIVATE ${A_DEPS})
endfunction()

function(ss_executable name)
  cmake_parse_arguments(A "" "" "SRCS;DEPS" ${ARGN})
  add_executable(${name} ${A_SRCS})
  _ss_common(${name})
  target_link_libraries(${name} PRIVATE ${A_DEPS})
endfunction()

include(GoogleTest)
function(ss_test name)
  cmake_parse_arguments(A "" "WORKING_DIRECTORY;TIMEOUT" "SRCS;DEPS;LABELS" ${ARGN})
  if(NOT A_WORKING_DIRECTORY)
    set(A_WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 600)
  endif()
  add_executable(${name} ${A_SRCS})
  _ss_common(${name})
  target_link_libraries(${name} PRIVATE ${A_DEPS} GTest::gtest GTest::gtest_main)
  gtest_discover_tests(${name}
    WORKING_DIRECTORY ${A_WORKING_DIRECTORY}
    PROPERTIES LABELS "${A_LABELS}" TIMEOUT ${A_TIMEOUT}
               SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]"
    DISCOVERY_TIMEOUT 60)
endfunction()

# ss_forbid_links(TARGET MATCHING regex...): a configure error when TARGET links a target whose
# name matches one of the regexes, directly or through our own (ss_*) libraries: the layering of
# tools/check_layering.py, for links. Call it once every target is defined (the top-level
# CMakeLists.txt's end).
function(ss_forbid_links target)
  cmake_parse_arguments(A "" "" "MATCHING" ${ARGN})
  set(seen)
  set(queue ${target})
  while(queue)
    list(POP_FRONT queue t)
    if(t IN_LIST seen OR NOT TARGET ${t})
      continue()
    endif()
    list(APPEND seen ${t})
    get_target_property(deps ${t} LINK_LIBRARIES)
    if(NOT deps)
      continue()
    endif()
    foreach(d IN LISTS deps)
      foreach(re IN LISTS A_MATCHING)
        if(d MATCHES "${re}")
          message(FATAL_ERROR "layering: ${target} links ${d} (through ${t}); it may not link "
                              "targets matching ${re} (cmake/splitserve.cmake ss_forbid_links)")
        endif()
      endforeach()
      if(d MATCHES "^ss_")
        list(APPEND queue ${d})
      endif()
    endforeach()
  endwhile()
endfunction()
