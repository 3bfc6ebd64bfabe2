// Rotary position embedding with YaRN, as the demo computes it (spec §3.5, §5.4 item 9).
//
// Interleaved pairs (v[2i], v[2i+1]) rotate by angle p·f_i. Frequencies are fp32:
// f_i = 1 / base^(2i/d), with YaRN (layers with compress ratio > 0) blending f_i and f_i/factor
// over the correction range. The angle is the fp32 product float(p)·f_i; cos/sin are taken of
// that fp32 angle. Nothing is tabulated per position, so any position up to 2^24 works.
#pragma once

#include <cstdint>
#include <vector>

#include "common/model_config.h"

namespace ss {

// rope_dim/2 fp32 frequencies. `yarn` is null for no YaRN.
std::vector<float> RopeFrequencies(int rope_dim, double base, const YarnConfig* yarn);

// The frequencies a layer with compression ratio `ratio` uses (0: rope_theta, no YaRN;
// > 0: compress_rope_theta with YaRN when the config has it).
std::vector<float> LayerRopeFrequencies(const ModelConfig& c, int64_t ratio);

// cos/sin of float(pos)·f_i for the rope_dim/2 pairs.
void RopeCosSin(const std::vector<float>& freqs, int64_t pos, float* cos_out, float* sin_out);

// Rotates v[0..2·pairs) in place by the given cos/sin (conjugate if `inverse`), fp32 math,
// result rounded to bf16.
void ApplyRope(float* v, int pairs, const float* cos_v, const float* sin_v, bool inverse);

}  // namespace ss
