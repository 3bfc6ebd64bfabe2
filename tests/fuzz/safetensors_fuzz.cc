// Fuzz target: a safetensors file image (common/safetensors.h, SafetensorsFile::FromBuffer), the
// first thing a wrong or damaged checkpoint reaches. Invariant: an error, or tensors whose bytes
// lie inside the data section of the image with nbytes = numel x dtype size; never a crash.
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A private copy: the parser keeps pointers into the buffer.
  const std::vector<uint8_t> image(data, data + size);
  auto f = ss::SafetensorsFile::FromBuffer(image.data(), image.size(), "fuzz.safetensors");
  if (!f.ok()) return 0;
  ss::fuzz::Require(size >= 8, "an image shorter than its length prefix was accepted");
  uint64_t header = 0;
  std::memcpy(&header, image.data(), sizeof header);
  const uint8_t* begin = image.data() + 8 + header;
  const uint8_t* end = image.data() + image.size();
  for (const auto& [name, t] : (*f)->tensors()) {
    ss::fuzz::Require(t.name == name, "a tensor filed under another name");
    ss::fuzz::Require(t.nbytes == static_cast<size_t>(t.numel()) * ss::DTypeSize(t.dtype),
                      "nbytes is not numel x dtype size");
    ss::fuzz::Require(t.nbytes == 0 || (t.data >= begin && t.data + t.nbytes <= end &&
                                        t.data + t.nbytes >= t.data),
                      "tensor bytes outside the data section");
    (void)(*f)->Find(name);
    (void)t.ShapeString();
  }
  return 0;
}
