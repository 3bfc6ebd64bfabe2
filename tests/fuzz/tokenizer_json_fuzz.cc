// Fuzz target: loading a tokenizer.json (coordinator/tokenizer.h promises that nothing in the file
// can crash the process). The input is the file; an accepted tokenizer then encodes and decodes
// a fixed text, which must not crash either (its result may be an error).
#include <cstdint>
#include <string>

#include "coordinator/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto tok = ss::Tokenizer::FromJson(
      std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  if (!tok.ok()) return 0;
  auto ids = (*tok)->Encode("Hello, world! 123 héllo 中文 <｜end▁of▁sentence｜>\n\n  x");
  if (ids.ok()) (void)(*tok)->Decode(*ids);
  return 0;
}
