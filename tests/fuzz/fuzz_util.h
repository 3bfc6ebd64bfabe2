// Shared by the fuzz targets (tests/fuzz/README.md): a byte reader over the fuzzer's input and
// the invariant check that aborts (so libFuzzer records the input as a crash).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace ss::fuzz {

// Consumes the fuzzer's bytes front to back; past the end every read returns 0 / empty.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  uint8_t Byte() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  // Up to `max` bytes as text.
  std::string_view Take(size_t max) {
    const size_t k = max < n_ ? max : n_;
    std::string_view s(reinterpret_cast<const char*>(p_), k);
    p_ += k;
    n_ -= k;
    return s;
  }
  std::string_view Rest() { return Take(n_); }
  size_t left() const { return n_; }

 private:
  const uint8_t* p_;
  size_t n_;
};

// An invariant of the code under test; a violation aborts with the message.
inline void Require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz invariant violated: %s\n", what);
    std::abort();
  }
}

}  // namespace ss::fuzz
