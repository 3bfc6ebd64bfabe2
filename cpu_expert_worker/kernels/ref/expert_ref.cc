// The scalar definition of Linear4Rows: ss::model::Linear4 on pre-quantised activations, with
// each 32-group's exact partial sum formed in double and rounded to fp32 once.
#include <array>

#include "common/bf16.h"
#include "common/codecs.h"
#include "cpu_expert_worker/kernels/linear4.h"

namespace ss::expert::internal {
namespace {

struct Tables {
  std::array<float, 16> e2m1;
  std::array<float, 256> ue8m0;
  Tables() {
    for (int i = 0; i < 16; ++i) e2m1[i] = E2m1ToFloat(static_cast<uint8_t>(i));
    for (int i = 0; i < 256; ++i) ue8m0[i] = Ue8m0ToFloat(static_cast<uint8_t>(i));
  }
};
const Tables& Tab() {
  static const Tables t;
  return t;
}

}  // namespace

void Linear4Scalar(const Linear4Args& a) {
  const Tables& t = Tab();
  const int64_t ng = a.k / 32;
  float* wrow = a.scratch;
  for (int64_t r = 0; r < a.rows; ++r) {
    // Byte j of row r: row-major, or tiled (linear4.h: tile of T rows, K block j/64 of the
    // tile's row r % T at (j/64)·T·64 + (r % T)·64).
    const int64_t T = a.w_tile_rows;
    const uint8_t* packed =
        T == 0 ? a.w + r * a.w_stride : a.w + r / T * T * a.w_stride + r % T * 64;
    const int64_t kb_step = T == 0 ? 64 : T * 64;
    const uint8_t* sw = a.s + r * a.s_stride;
    for (int64_t j = 0; j < a.k / 2; ++j) {
      const uint8_t b = packed[j / 64 * kb_step + j % 64];
      wrow[2 * j] = t.e2m1[b & 0xf];
      wrow[2 * j + 1] = t.e2m1[b >> 4];
    }
    for (int64_t i = 0; i < a.n; ++i) {
      const float* q = a.q[i];
      float acc = 0.0f;
      for (int64_t g = 0; g < ng; ++g) {
        double part = 0.0;
        for (int64_t e = g * 32; e < (g + 1) * 32; ++e) part += static_cast<double>(q[e]) * wrow[e];
        acc += static_cast<float>(part) * a.sa[i][g / 4] * t.ue8m0[sw[g]];
      }
      float& y = a.y[i][r];
      switch (a.epilogue) {
        case Epilogue::kStoreBf16:
          y = RoundBf16(acc);
          break;
        case Epilogue::kAddF32:
          y += acc;
          break;
        case Epilogue::kAddBf16:
          y += RoundBf16(acc);
          break;
      }
    }
  }
}

}  // namespace ss::expert::internal
