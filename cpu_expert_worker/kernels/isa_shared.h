// Internal, for the ISA translation units only (avx2/, avx512/): code both SIMD variants share
// that needs no vector type. Everything is in an unnamed namespace ON PURPOSE: each ISA file
// compiles its own copy with its own -m flags and internal linkage, so no linker can hand the
// AVX-512 copy to the AVX2 kernel (see linear4.h).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu_expert_worker/kernels/linear4.h"

namespace ss::expert::internal {
namespace {

// The weight prefetch: which cache level the lines go to and how far ahead of their use, in
// 64-byte lines in consumption order (why each, measured per thread count: bench/RESULTS.md,
// "What limited the worker: the non-temporal prefetch" and "Session 37: the prefetch on Zen 4"):
//  - kNear: non-temporal into L1, 256 lines (16 KB, half a tile at k = 4096) ahead; a longer
//    distance into L1 evicts lines before their use (tuned on Zen 5, with T0 and NTA only).
//  - kFar: into L2 (T2), 1024 lines (64 KB) ahead, out of L1's way. Measured best on the Intel
//    Xeon hosts and on a Zen 4 EPYC (where T0 1024 lines ahead is no better than kNear, so T2
//    does not fill L1 there). Before Zen 4, AMD's T1/T2 fill L1 like T0, and a 64 KB lead then
//    evicts lines before their use.
struct PrefetchNear {
  static constexpr int kHint = _MM_HINT_NTA;
  static constexpr int64_t kLines = 256;
};
struct PrefetchFar {
  static constexpr int kHint = _MM_HINT_T2;
  static constexpr int64_t kLines = 1024;
};
// kFar on Intel CPUs and on Zen 4 (AMD family 19h with AVX-512; Zen 3, the same family, has
// none), kNear elsewhere: Zen 2 and 3 (see kFar) and Zen 5 (tuned with kNear; T2 not tried
// there). Decided once.
inline bool UseFarPrefetch() {
  static const bool far = __builtin_cpu_is("intel") ||
                          (__builtin_cpu_is("amdfam19h") && __builtin_cpu_supports("avx512f"));
  return far;
}

// Where the weights of rows [r0, r0 + kRows) start (r0 a multiple of kRows), and the byte steps
// between their rows and between their K blocks (64 bytes a row): row-major rows, or tiled
// (Linear4Args::w_tile_rows, a multiple of kRows).
struct WeightSteps {
  int64_t row, kb;
};
inline WeightSteps Steps(const Linear4Args& a) {
  return a.w_tile_rows != 0 ? WeightSteps{64, a.w_tile_rows * 64} : WeightSteps{a.w_stride, 64};
}
inline const uint8_t* TileBase(const Linear4Args& a, const uint8_t* w, int64_t r0) {
  if (a.w_tile_rows == 0) return w + r0 * a.w_stride;
  const int64_t t = a.w_tile_rows;
  return w + r0 / t * t * a.w_stride + r0 % t * 64;
}

// The byte step between the rows of a tile: 64 when the weights are tiled (kTiled), the row
// stride otherwise.
template <bool kTiled>
inline int64_t RowStep(const Linear4Args& a) {
  return kTiled ? 64 : Steps(a).row;
}

// The multi-row paths' wide record of one activation row and K block (each ISA file gives its
// layout; linear4.h reserves 512 bytes), and its meta.
constexpr int64_t kWideBytes = 384;
struct WideMeta {
  float scale;  // RecordScale
  int32_t low;  // nonzero where the record holds L values (a flag per span or per block: the
                // ISA file's layout)
};

// The software prefetch of one Linear4 call whose tiles are kRows rows: lines are consumed tile
// by tile, K block by K block, row by row, kRows lines a (tile, K block) step. Step(r0, kb),
// called before consuming each step in that order, requests the lines of the step
// Policy::kLines / kRows steps later (running on into Linear4Args::next_w after the last tile)
// and, while they last, one line of each scale row of the next tile. When the weights are tiled
// in exactly the kernel's tile height, consumption order is memory order and a step's lines are
// contiguous: the target is found by a running offset, without divisions.
template <int kRows, class Policy>
class Prefetch {
 public:
  static constexpr int64_t kBlocks = Policy::kLines / kRows;  // the distance in steps

  // Requests the lines the running prefetch never covers: the first kBlocks steps.
  explicit Prefetch(const Linear4Args& a)
      : a_(a),
        nkb_(a.k / 128),
        steps_(Steps(a)),
        sequential_(a.w_tile_rows == kRows),
        len_(a.rows * a.k / 2),
        next_len_(a.next_w != nullptr ? a.next_rows * a.k / 2 : 0),
        row_(sequential_ ? 64 : steps_.row) {
    for (int64_t step = 0; step < kBlocks; ++step) Issue(step);
  }
  // Before consuming the step (tile r0, K block kb): aims at its targets; Targets().Row(r) then
  // requests row r's lines, interleaved with the rows' loads (decode tiles: issued together, as
  // Step does, they read slower; bench/RESULTS.md).
  void Aim(int64_t r0, int64_t kb) {
    p_ = Target(r0 / kRows * nkb_ + kb + kBlocks);
    sp_ = nullptr;
    if (kb * 64 < a_.k / 32) {
      sp_ = RowPtr(a_.s, a_.next_s, r0 + kRows, a_.s_stride);
      if (sp_ != nullptr) sp_ += kb * 64;
    }
  }
  // The aimed step's targets as values, for a row loop that keeps them in registers: Row(r)
  // requests weight line w + r·w_step (w is never null: past the rows it is the call's first
  // line, which costs a request and no traffic), and while they last scale line s + r·s_step.
  struct Rows {
    const uint8_t* w;
    int64_t w_step;
    const uint8_t* s;
    int64_t s_step;
    void Row(int r) const {
      Line(w + r * w_step);
      if (s != nullptr) Line(s + r * s_step);
    }
  };
  Rows Targets() const { return {p_ != nullptr ? p_ : a_.w, row_, sp_, a_.s_stride}; }
  // Aim and every row's requests at once.
  void Step(int64_t r0, int64_t kb) {
    Aim(r0, kb);
    const Rows t = Targets();
    for (int r = 0; r < kRows; ++r) t.Row(r);
  }

 private:
  // The hint's type is GCC's enum _mm_hint and clang's int: decltype names either.
  static void Line(const uint8_t* p) {
    _mm_prefetch(reinterpret_cast<const char*>(p),
                 static_cast<decltype(_MM_HINT_T0)>(Policy::kHint));
  }
  // The first line of step `step` (counted from this call's first tile), or null past the rows.
  const uint8_t* Target(int64_t step) const {
    if (sequential_) {
      const int64_t off = step * kRows * 64;
      return off < len_ ? a_.w + off : off - len_ < next_len_ ? a_.next_w + (off - len_) : nullptr;
    }
    const uint8_t* base = WeightRow(a_.w, a_.next_w, step / nkb_ * kRows);
    return base == nullptr ? nullptr : base + step % nkb_ * steps_.kb;
  }
  // Requests the kRows weight lines of step `step`.
  void Issue(int64_t step) const {
    const uint8_t* p = Target(step);
    if (p == nullptr) return;
    for (int r = 0; r < kRows; ++r) Line(p + r * row_);
  }
  // Row `row` (a multiple of kRows) of these rows followed by the next ones, or null past them.
  const uint8_t* RowPtr(const uint8_t* cur, const uint8_t* next, int64_t row,
                        int64_t stride) const {
    if (row < a_.rows) return cur + row * stride;
    if (next != nullptr && row - a_.rows < a_.next_rows) return next + (row - a_.rows) * stride;
    return nullptr;
  }
  // The same for the weights, in their layout.
  const uint8_t* WeightRow(const uint8_t* cur, const uint8_t* next, int64_t row) const {
    if (row < a_.rows) return TileBase(a_, cur, row);
    if (next != nullptr && row - a_.rows < a_.next_rows) return TileBase(a_, next, row - a_.rows);
    return nullptr;
  }
  const Linear4Args& a_;
  const int64_t nkb_;
  const WeightSteps steps_;
  const bool sequential_;
  const int64_t len_, next_len_;
  const int64_t row_;  // bytes between a step's rows
  const uint8_t* p_ = nullptr;
  const uint8_t* sp_ = nullptr;
};

// ss::QuantizeActE4m3's power-of-two scale of a block whose largest |x| (NaN skipped) is
// `amax`: from the fp32 bits of max(amax, 1e-4) · fp32(1/448), rounded up to a power of two
// (2^128 and beyond: inf, as ldexp gives).
inline float BlockScale(float amax) {
  if (amax < 1e-4f) amax = 1e-4f;
  const float prod = amax * (1.0f / 448.0f);
  uint32_t bits;
  std::memcpy(&bits, &prod, 4);
  uint32_t biased = ((bits >> 23) & 0xff) + ((bits & 0x7fffffu) != 0);
  if (biased > 255) biased = 255;
  const uint32_t sbits = biased << 23;
  float s;
  std::memcpy(&s, &sbits, 4);
  return s;
}

// The record's fp32 sa·2^-10, or NaN when the block holds a NaN code (linear4.h).
inline void StoreRecordScale(uint8_t* rec, float s, bool nan) {
  uint32_t bits = 0x7fc00000u;
  if (!nan) {
    const float sa = s * (1.0f / 1024.0f);
    std::memcpy(&bits, &sa, 4);
  }
  std::memcpy(rec + kScaleOffset, &bits, 4);
}

inline float RecordScale(const uint8_t* rec) {
  float s;
  std::memcpy(&s, rec + kScaleOffset, 4);
  return s;
}

inline const uint8_t* Record(const Linear4Args& a, int64_t i, int64_t kb) {
  return reinterpret_cast<const uint8_t*>(a.q[i]) + kb * kRecordBytes;
}

}  // namespace
}  // namespace ss::expert::internal
