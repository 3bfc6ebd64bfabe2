// The element types of the kernels' device buffers, distinct types of the same bits so that a
// bf16 buffer passed where e4m3 codes or ue8m0 scales are expected (or the other way round) does
// not compile. Each is a standard-layout wrapper of its bit pattern: a buffer of them has the
// layout of the raw bytes, and kernels read the bits.
#pragma once

#include <cstdint>
#include <type_traits>

namespace ss::cuda {

struct bf16_t {  // bfloat16: sign, 8 exponent bits, 7 mantissa bits
  uint16_t bits;
};
struct e4m3_t {  // FP8 e4m3 (OCP, no infinities; 0x7f/0xff are NaN)
  uint8_t bits;
};
struct ue8m0_t {  // an unsigned power-of-two scale 2^(bits − 127)
  uint8_t bits;
};

static_assert(sizeof(bf16_t) == 2 && alignof(bf16_t) == 2 && std::is_trivial_v<bf16_t>);
static_assert(sizeof(e4m3_t) == 1 && alignof(e4m3_t) == 1 && std::is_trivial_v<e4m3_t>);
static_assert(sizeof(ue8m0_t) == 1 && alignof(ue8m0_t) == 1 && std::is_trivial_v<ue8m0_t>);

// A raw buffer of those bits seen as the typed elements, for callers whose buffers are not typed
// (yet): the same address.
inline const bf16_t* AsBf16(const uint16_t* p) { return reinterpret_cast<const bf16_t*>(p); }
inline bf16_t* AsBf16(uint16_t* p) { return reinterpret_cast<bf16_t*>(p); }
inline const e4m3_t* AsE4m3(const uint8_t* p) { return reinterpret_cast<const e4m3_t*>(p); }
inline e4m3_t* AsE4m3(uint8_t* p) { return reinterpret_cast<e4m3_t*>(p); }
inline const ue8m0_t* AsUe8m0(const uint8_t* p) { return reinterpret_cast<const ue8m0_t*>(p); }

// The kernels' side: the raw bits of a typed buffer (the same address).
inline const uint16_t* Raw(const bf16_t* p) { return reinterpret_cast<const uint16_t*>(p); }
inline uint16_t* Raw(bf16_t* p) { return reinterpret_cast<uint16_t*>(p); }
inline const uint8_t* Raw(const e4m3_t* p) { return reinterpret_cast<const uint8_t*>(p); }
inline uint8_t* Raw(e4m3_t* p) { return reinterpret_cast<uint8_t*>(p); }
inline const uint8_t* Raw(const ue8m0_t* p) { return reinterpret_cast<const uint8_t*>(p); }

}  // namespace ss::cuda
