// The reference model's linears (common/model/linear.cc) against straightforward scalar loops
// written from their documented arithmetic: the tiled, batched kernels must give bit-identical
// results for every batch size and for output/input sizes that do not fill a tile or a block,
// in every vector-ISA variant the CPU can run, and a row's result must not depend on the other
// rows of its batch.
#include "common/model/linear.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/codecs.h"

namespace ss::model {
namespace {

constexpr int64_t kBlock = 128;

// bf16-valued activations in roughly the model's range.
std::vector<float> Activations(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = RoundBf16(normal(rng) * 2.0f);
  return x;
}

std::vector<uint8_t> Bytes(std::mt19937& rng, int64_t n, int lo, int hi) {
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<uint8_t> b(n);
  for (uint8_t& v : b) v = static_cast<uint8_t>(d(rng));
  return b;
}

// Per-row e4m3 quantisation in 1x128 blocks, as Linear8/Linear4 document.
void Quantise(const float* x, int64_t in, std::vector<float>& q, std::vector<float>& sa) {
  const int64_t nb = (in + kBlock - 1) / kBlock;
  std::vector<uint8_t> codes(in);
  sa.resize(nb);
  QuantizeActE4m3(x, in, kBlock, codes.data(), sa.data());
  q.resize(in);
  for (int64_t i = 0; i < in; ++i) q[i] = E4m3ToFloat(codes[i]);
}

// Scalar Linear8: per 128-block an exact double sum, then acc += float(part)·sa·sw in K order.
std::vector<float> Linear8Scalar(const Fp8Weight& w, const std::vector<float>& x, int64_t rows) {
  const int64_t nb = (w.in + kBlock - 1) / kBlock;
  std::vector<float> y(rows * w.out), q, sa;
  for (int64_t r = 0; r < rows; ++r) {
    Quantise(x.data() + r * w.in, w.in, q, sa);
    for (int64_t o = 0; o < w.out; ++o) {
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        double part = 0.0;
        for (int64_t i = b * kBlock; i < std::min(w.in, (b + 1) * kBlock); ++i) {
          part += static_cast<double>(q[i]) * E4m3ToFloat(w.w[o * w.in + i]);
        }
        acc += static_cast<float>(part) * sa[b] * Ue8m0ToFloat(w.s[(o / kBlock) * nb + b]);
      }
      y[r * w.out + o] = RoundBf16(acc);
    }
  }
  return y;
}

// Scalar Linear4: 32-wide exact sums times sa[k/128]·s_w in K order.
std::vector<float> Linear4Scalar(const Fp4Weight& w, const std::vector<float>& x, int64_t rows) {
  const int64_t ng = w.in / 32;
  std::vector<float> y(rows * w.out), q, sa;
  for (int64_t r = 0; r < rows; ++r) {
    Quantise(x.data() + r * w.in, w.in, q, sa);
    for (int64_t o = 0; o < w.out; ++o) {
      float acc = 0.0f;
      for (int64_t g = 0; g < ng; ++g) {
        double part = 0.0;
        for (int64_t i = g * 32; i < (g + 1) * 32; ++i) {
          const uint8_t b = w.w[o * (w.in / 2) + i / 2];
          part += static_cast<double>(q[i]) * E2m1ToFloat((i & 1) ? (b >> 4) : (b & 0xf));
        }
        acc += static_cast<float>(part) * sa[g * 32 / kBlock] * Ue8m0ToFloat(w.s[o * ng + g]);
      }
      y[r * w.out + o] = RoundBf16(acc);
    }
  }
  return y;
}

// Scalar LinearF32: DotF32's sequential double sum per output.
std::vector<float> LinearF32Scalar(const Bf16Matrix& w, const std::vector<float>& x, int64_t rows) {
  std::vector<float> y(rows * w.rows);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < w.rows; ++o) {
      double s = 0.0;
      for (int64_t i = 0; i < w.cols; ++i) s += static_cast<double>(x[r * w.cols + i]) * w.At(o, i);
      y[r * w.rows + o] = static_cast<float>(s);
    }
  }
  return y;
}

int64_t Mismatches(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  int64_t n = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  }
  return n;
}

// Every kernel variant this CPU can run (each must give the same bits); restores the CPU's own
// choice when it goes out of scope.
struct EachIsa {
  std::vector<LinearIsa> isas{LinearIsa::kSse2};
  EachIsa() {
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      isas.push_back(LinearIsa::kAvx2);
    }
  }
  ~EachIsa() { ForceLinearIsaForTesting(LinearIsa::kAuto); }
};
const char* Name(LinearIsa isa) {
  switch (isa) {
    case LinearIsa::kSse2:
      return "sse2";
    case LinearIsa::kAvx2:
      return "avx2";
    default:
      return "auto";
  }
}

// Runs linear(y) with every ISA variant and expects `want` in y, bit for bit.
template <typename F>
void ExpectEveryIsa(F&& linear, const std::vector<float>& want, const std::string& what) {
  EachIsa each;
  for (LinearIsa isa : each.isas) {
    ForceLinearIsaForTesting(isa);
    std::vector<float> y(want.size());
    linear(y.data());
    EXPECT_EQ(Mismatches(y, want), 0) << Name(isa) << " " << what;
  }
}
std::string What(int64_t out, int64_t in, int64_t rows) {
  return "out " + std::to_string(out) + " in " + std::to_string(in) + " rows " +
         std::to_string(rows);
}

struct Shape {
  int64_t out, in;
};
// Tile (8 outputs) and block (128 inputs) remainders included.
const Shape kShapes[] = {{128, 256}, {13, 384}, {7, 200}, {256, 128}, {33, 1000}};
const int64_t kRows[] = {1, 2, 3, 4, 5, 8, 9, 17};

TEST(Linear8, BitIdenticalToScalarLoopsForEveryBatchSize) {
  std::mt19937 rng(1);
  for (const Shape& sh : kShapes) {
    const int64_t nb = (sh.in + kBlock - 1) / kBlock;
    // e4m3 codes without NaN (0x7f/0xff), scales 2^-8..2^2.
    std::vector<uint8_t> codes = Bytes(rng, sh.out * sh.in, 0, 0x7e);
    const std::vector<uint8_t> signs = Bytes(rng, sh.out * sh.in, 0, 1);
    for (size_t i = 0; i < codes.size(); ++i) codes[i] |= signs[i] << 7;
    const std::vector<uint8_t> scales = Bytes(rng, ((sh.out + 127) / 128) * nb, 119, 129);
    const Fp8Weight w{codes.data(), scales.data(), sh.out, sh.in};
    for (int64_t rows : kRows) {
      const std::vector<float> x = Activations(rng, rows * sh.in);
      ExpectEveryIsa([&](float* y) { Linear8(w, x.data(), rows, y); }, Linear8Scalar(w, x, rows),
                     What(sh.out, sh.in, rows));
    }
  }
}

TEST(Linear4, BitIdenticalToScalarLoopsForEveryBatchSize) {
  std::mt19937 rng(2);
  for (const Shape& sh : {Shape{16, 256}, Shape{9, 384}, Shape{64, 96}}) {
    const std::vector<uint8_t> packed = Bytes(rng, sh.out * sh.in / 2, 0, 255);
    const std::vector<uint8_t> scales = Bytes(rng, sh.out * sh.in / 32, 120, 130);
    const Fp4Weight w{packed.data(), scales.data(), sh.out, sh.in};
    for (int64_t rows : kRows) {
      const std::vector<float> x = Activations(rng, rows * sh.in);
      ExpectEveryIsa([&](float* y) { Linear4(w, x.data(), rows, y); }, Linear4Scalar(w, x, rows),
                     What(sh.out, sh.in, rows));
    }
  }
}

TEST(LinearF32, BitIdenticalToSequentialDotsForEveryBatchSize) {
  std::mt19937 rng(3);
  for (const Shape& sh : kShapes) {
    const std::vector<float> wv = Activations(rng, sh.out * sh.in);
    std::vector<uint8_t> raw(2 * wv.size());
    for (size_t i = 0; i < wv.size(); ++i) {
      const uint16_t b = FloatToBf16(wv[i]);
      std::memcpy(raw.data() + 2 * i, &b, 2);
    }
    const Bf16Matrix w{raw.data(), sh.out, sh.in};
    for (int64_t rows : kRows) {
      const std::vector<float> x = Activations(rng, rows * sh.in);
      const std::vector<float> want = LinearF32Scalar(w, x, rows);
      ExpectEveryIsa([&](float* y) { LinearF32(w, x.data(), rows, y); }, want,
                     What(sh.out, sh.in, rows));
      // The same matrix as fp32 values.
      ExpectEveryIsa([&](float* y) { LinearRowsF32(wv.data(), sh.out, sh.in, x.data(), rows, y); },
                     want, "fp32 " + What(sh.out, sh.in, rows));
    }
  }
}

// A slice of an FP8 weight's rows against strided activations (the grouped output projection).
TEST(LinearFp8RowsF32, StridedSliceMatchesDotF32OfEachRow) {
  std::mt19937 rng(5);
  const int64_t out = 40, in = 256, rows = 5, ldx = 3 * in, o0 = 11, outs = 21, ldy = 30;
  std::vector<uint8_t> codes = Bytes(rng, out * in, 0, 0x7e);
  const std::vector<uint8_t> scales = Bytes(rng, 2, 124, 128);
  const Fp8Weight w{codes.data(), scales.data(), out, in};
  const std::vector<float> x = Activations(rng, rows * ldx);
  std::vector<float> y(rows * ldy, -1.0f), row(in);
  LinearFp8RowsF32(w, o0, outs, x.data() + in, ldx, rows, y.data(), ldy);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < ldy; ++o) {
      if (o >= outs) {
        EXPECT_EQ(y[r * ldy + o], -1.0f) << "wrote outside the slice";
        continue;
      }
      w.Row(o0 + o, row.data());
      const float want = DotF32(x.data() + r * ldx + in, row.data(), in);
      EXPECT_EQ(std::memcmp(&want, &y[r * ldy + o], sizeof want), 0) << r << " " << o;
    }
  }
}

// Row r of a batch equals that row alone: batching changes no sequence's arithmetic.
TEST(Linear8, RowOfABatchEqualsTheRowAlone) {
  std::mt19937 rng(4);
  std::vector<uint8_t> codes = Bytes(rng, 40 * 256, 0, 0x7e);
  const std::vector<uint8_t> scales = Bytes(rng, 2, 125, 127);
  const Fp8Weight w{codes.data(), scales.data(), 40, 256};
  const std::vector<float> x = Activations(rng, 7 * 256);
  std::vector<float> all(7 * 40), one(40);
  Linear8(w, x.data(), 7, all.data());
  for (int64_t r = 0; r < 7; ++r) {
    Linear8(w, x.data() + r * 256, 1, one.data());
    EXPECT_EQ(std::memcmp(one.data(), all.data() + r * 40, 40 * sizeof(float)), 0) << r;
  }
}

}  // namespace
}  // namespace ss::model
