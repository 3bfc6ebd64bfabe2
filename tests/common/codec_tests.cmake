# Number formats, RoPE, and the tiny-a checkpoint's exactness (tests run from the repo root).
ss_test(codecs_test SRCS ${CMAKE_CURRENT_SOURCE_DIR}/codecs_test.cc DEPS ss_common LABELS unit)
ss_test(rope_test SRCS ${CMAKE_CURRENT_SOURCE_DIR}/rope_test.cc DEPS ss_common LABELS unit)
ss_test(tiny_a_weights_test SRCS ${CMAKE_CURRENT_SOURCE_DIR}/tiny_a_weights_test.cc
        DEPS ss_common absl::strings LABELS golden)
ss_test(kv_record_test SRCS ${CMAKE_CURRENT_SOURCE_DIR}/kv_record_test.cc DEPS ss_common LABELS unit)
