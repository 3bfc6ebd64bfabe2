// Number formats of DeepSeek-V4 checkpoints and the demo's activation quantisation, bit-exact
// (spec §2.3, §2.4, §5). All functions are pure and thread-safe.
//
//  * e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits, max ±448, no inf, NaN = S.1111.111.
//  * ue8m0: unsigned exponent byte, value 2^(b-127); 255 is NaN.
//  * e2m1 : codes 0..15 = ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}, sign in bit 3.
//  * Power-of-two scales (ue8m0 "round_scale"): for a block with absolute maximum `amax`
//    (floored), s = 2^e with e read off the fp32 bits of amax * fp32(1/qmax):
//    e = biased_exponent - 127, plus one if the mantissa is non-zero. Exact powers of two keep
//    their exponent.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ss {

inline constexpr float kE4m3Max = 448.0f;
inline constexpr float kE2m1Max = 6.0f;
inline constexpr float kFp8AmaxFloor = 1e-4f;
// 6 * 2^-126: the FP4 simulation's amax floor.
inline constexpr float kFp4AmaxFloor = 6.0f * 1.1754943508222875e-38f;

float E4m3ToFloat(uint8_t code);
// Round-to-nearest-even, saturating to ±448 (the demo clamps before converting); NaN -> 0x7f.
uint8_t FloatToE4m3(float x);
inline float RoundE4m3(float x) { return E4m3ToFloat(FloatToE4m3(x)); }

// 2^(b-127); 255 -> NaN. Exact for every byte (subnormal powers of two included).
float Ue8m0ToFloat(uint8_t b);

float E2m1ToFloat(uint8_t code);  // low 4 bits are used
// Round-to-nearest-even on the e2m1 grid, saturating to ±6; -0 and +0 both map to code 0.
uint8_t FloatToE2m1(float x);

// The power-of-two scale for a block: 2^ceil(log2(max(amax, floor) * fp32(1/qmax))) with the
// exponent read from fp32 bits as described above.
float Pow2Scale(float amax, float amax_floor, float qmax);
// The ue8m0 byte of a power-of-two float (127 + log2(s)).
uint8_t Ue8m0FromPow2(float s);

// Activation quantisation before an FP8/FP4 GEMM (spec §5.2): per 1xblock block of x[0..n),
// s = Pow2Scale(amax, 1e-4, 448), q = e4m3(clamp(x/s, ±448)). `q` gets n codes, `scales` gets
// ceil(n/block) floats. n need not be a multiple of block (the last block is partial).
void QuantizeActE4m3(const float* x, size_t n, size_t block, uint8_t* q, float* scales);

// FP8sim (spec §5.3): in place over x[0..n) in blocks of `block`:
// x <- bf16(e4m3(clamp(x/s, ±448)) * s). With round_e4m3 = false (initial revision) the e4m3
// rounding is skipped: x <- bf16(clamp(x/s, ±448) * s).
void Fp8SimInplace(float* x, size_t n, size_t block, bool round_e4m3);

// FP4sim (spec §5.3): in place in blocks of `block` (32): amax floored at 6*2^-126,
// s = Pow2Scale(amax, floor, 6), x <- bf16(e2m1(clamp(x/s, ±6)) * s).
void Fp4SimInplace(float* x, size_t n, size_t block);

// The demo's rotate_activation (patched to pure torch): y = bf16((x · H_n) · n^-1/2) with H_n
// the Sylvester Walsh-Hadamard matrix; the sum is formed exactly (in double) and rounded to fp32
// once, as a fp32 GEMM with exact partial sums would. n must be a power of two. In place.
void HadamardInplace(float* x, size_t n);

}  // namespace ss
