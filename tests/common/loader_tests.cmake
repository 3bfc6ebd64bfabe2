# Loader tests: safetensors reader/writer, config.json parsing, checkpoint schema; whole-file writes.
ss_test(safetensors_test
  SRCS ${CMAKE_CURRENT_SOURCE_DIR}/safetensors_test.cc
  DEPS ss_common nlohmann_json::nlohmann_json LABELS unit)
ss_test(model_config_test
  SRCS ${CMAKE_CURRENT_SOURCE_DIR}/model_config_test.cc
  DEPS ss_common nlohmann_json::nlohmann_json LABELS unit)
ss_test(checkpoint_schema_test
  SRCS ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint_schema_test.cc
  DEPS ss_common nlohmann_json::nlohmann_json LABELS unit)
ss_test(file_write_test
  SRCS ${CMAKE_CURRENT_SOURCE_DIR}/file_write_test.cc
  DEPS ss_common LABELS unit)
ss_test(weight_source_test
  SRCS ${CMAKE_CURRENT_SOURCE_DIR}/weight_source_test.cc
  DEPS ss_common LABELS unit)
