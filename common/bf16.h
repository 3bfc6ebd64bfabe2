// bfloat16 helpers. Activations of the reference model are held as float values that are
// exactly representable in bf16 (RoundBf16 after every op that the demo performs in bf16), so
// the arithmetic reads like the spec; storage as uint16_t is for files and kernels.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace ss {

inline float Bf16ToFloat(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round-to-nearest-even; NaN stays a (quiet) NaN, infinities stay infinite.
inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float RoundBf16(float f) { return Bf16ToFloat(FloatToBf16(f)); }

}  // namespace ss
