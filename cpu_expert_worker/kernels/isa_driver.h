// Internal, for the ISA translation units only (avx2/, avx512/): the walk of one Linear4 call
// (or of a pair sharing activations) over its weight tiles, and the layout of its scratch, the
// same for both SIMD variants. In an unnamed namespace for the reason isa_shared.h gives.
//
// K, the ISA file's kernel, provides:
//   Vec                          its integer vector type
//   kRows                        weight rows a tile
//   kWideVecs                    Vecs of one tile's widened weights (one K block)
//   Scales(a, r0, st)            st[kb] = the tile's ue8m0 scales of K block kb, transposed
//   One<kTiled>(a, r0, st, pf)   the tile against one activation record (decode)
//   Many<kTiled>(a, r0, x, pf)   the tile against several, from the Scratch x's wide records
//   Widen(a, wide, meta)         every record of the call into wide records and their meta
// kTiled: the weights are in tiles (Linear4Args::w_tile_rows != 0); pf: isa_shared.h's Prefetch.
#pragma once

#include <cstdint>

#include "cpu_expert_worker/kernels/isa_shared.h"
#include "cpu_expert_worker/kernels/linear4.h"

namespace ss::expert::internal {
namespace {

// A call's scratch (Linear4Args::scratch, sized by Linear4ScratchFloats).
template <class K>
struct Scratch {
  using Vec = typename K::Vec;
  Vec* st;         // [k/128] transposed scales
  float* acc;      // [n][16] accumulators
  Vec* wv;         // [K::kWideVecs] one K block's widened weights
  uint8_t* wide;   // [k/128][n] wide records, kWideBytes each
  WideMeta* meta;  // [k/128][n]
  explicit Scratch(const Linear4Args& a)
      : st(reinterpret_cast<Vec*>(a.scratch)),
        acc(a.scratch + a.k / 128 * 16),
        wv(reinterpret_cast<Vec*>(acc + a.n * 16)),
        wide(reinterpret_cast<uint8_t*>(wv + K::kWideVecs)),
        meta(reinterpret_cast<WideMeta*>(wide + a.k / 128 * a.n * kWideBytes)) {}
};

// The rows of a, tile by tile; its records already widened into x.wide when it has several.
template <class K, class Policy>
void Linear4Tiles(const Linear4Args& a, const Scratch<K>& x) {
  Prefetch<K::kRows, Policy> pf(a);
  const bool tiled = a.w_tile_rows != 0;
  for (int64_t r0 = 0; r0 < a.rows; r0 += K::kRows) {
    K::Scales(a, r0, x.st);
    if (a.n == 1) {
      tiled ? K::template One<true>(a, r0, x.st, pf) : K::template One<false>(a, r0, x.st, pf);
    } else {
      tiled ? K::template Many<true>(a, r0, x, pf) : K::template Many<false>(a, r0, x, pf);
    }
  }
}

// a, then b if not null (b shares a's activations and scratch): the records are widened once.
template <class K>
void Linear4Pair(const Linear4Args& a, const Linear4Args* b) {
  const Scratch<K> x(a);
  if (a.n > 1) K::Widen(a, x.wide, x.meta);
  const bool far = UseFarPrefetch();
  far ? Linear4Tiles<K, PrefetchFar>(a, x) : Linear4Tiles<K, PrefetchNear>(a, x);
  if (b != nullptr) {
    far ? Linear4Tiles<K, PrefetchFar>(*b, x) : Linear4Tiles<K, PrefetchNear>(*b, x);
  }
}

}  // namespace
}  // namespace ss::expert::internal
