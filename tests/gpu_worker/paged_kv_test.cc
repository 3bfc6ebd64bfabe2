// The paged KV kernels of gpu_worker/kernels/paged_kv.h (label gpu; skips without a CUDA device):
// the attention over plain bf16 records (nope = 0) is close to the reference's SparseAttendHead,
// records written at scattered addresses are byte for byte common/kv_record.h's (head_dim 512),
// attention over fp8 records equals the attention over plain bf16 records of the same entries
// bit for bit (head_dim 512: the shared-memory path; 128: the per-dim path) and the decode path's
// flash-decoding split stays within its rounding bound of it, MXFP4 keys of FP4-simulated values
// round-trip exactly through blocks named by a table, and the kernels run from compute_86 PTX.
#include "gpu_worker/kernels/paged_kv.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/bf16.h"
#include "common/golden/golden.h"
#include "common/kv_record.h"
#include "common/model/attention.h"
#include "gpu_worker/kernels/indexer.h"
#include "gpu_worker/kernels/rope.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/gpu_test_util.h"

namespace ss::cuda {
namespace {

using namespace testing_util;  // NOLINT: the shared GPU test helpers

class PagedKvTest : public testing_util::GpuTest {};

// n FP8-simulated 512-dim entries (the CPU codec's round trip of random values).
std::vector<float> SimEntries(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> e(n * kKvDim);
  std::vector<uint8_t> rec(kKvRecordBytes);
  for (int64_t i = 0; i < n; ++i) {
    float* x = e.data() + i * kKvDim;
    for (int k = 0; k < kKvDim; ++k) x[k] = RoundBf16(nd(rng) * (k < 64 ? 0.01f : 1.0f));
    EncodeKvRecord(x, rec.data());
    DecodeKvRecord(rec.data(), x);
  }
  return e;
}

// The split path (KvSparseAttention's flash-decoding, T ≤ kKvSplitMaxTokens) against the serial
// kernel's outputs of the same attention, element by element. With o the exact (double) output
// of a head, den its denominator and A = Σ_i p_i·|v_i| / den (≥ |o|), each path rounds every p to
// bf16 once (relative error ≤ 2^−8, bf16's 8-bit significand; the split path relative to its
// chunk's max, the serial one to the running max), which moves its output by ≤ 2^−8·A, and rounds
// the output to bf16 once (≤ 2^−8 relative); the rest (fp32 scores and sums in another order,
// expf) is ~2^−20·A. So |split − serial| ≤ 2^−7·(A + |o|), checked with 1 % of slack. An
// inverse-RoPE'd pair (last rope_dim dims, cos/sin [T, rope_dim / 2]) rotates those bounds
// (≤ |cos|·β_a + |sin|·β_b) and is rounded again by each path (2^−7·|x| between them).
struct SplitVsSerial {
  int64_t n = 0, identical = 0, over = 0;
  double worst = 0;                          // max |split − serial| / bound
  double rms_rel = 0;                        // ‖split − serial‖ / ‖serial‖
  double split_exact = 0, serial_exact = 0;  // ‖path − o‖ / ‖o‖, o the exact (double) output
};

SplitVsSerial CompareSplitToSerial(const std::vector<float>& q,
                                   const std::vector<std::vector<const float*>>& lists,
                                   const std::vector<float>& sink, int64_t H, int64_t D,
                                   float scale, int64_t rope_dim, const std::vector<float>& cs,
                                   const std::vector<float>& sn, const std::vector<uint16_t>& split,
                                   const std::vector<uint16_t>& serial) {
  const double u7 = std::ldexp(1.0, -7) * 1.01;
  SplitVsSerial r;
  double d2 = 0, s2 = 0, e_split = 0, e_serial = 0, o2 = 0;
  const int64_t T = static_cast<int64_t>(lists.size());
  std::vector<double> o(D), a(D), bound(D), p;
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<const float*>& list = lists[t];
    for (int64_t h = 0; h < H; ++h) {
      const float* qh = q.data() + (t * H + h) * D;
      p.assign(list.size(), 0.0);
      double m = -INFINITY;
      for (size_t i = 0; i < list.size(); ++i) {
        if (list[i] == nullptr) continue;
        double dot = 0;
        for (int64_t k = 0; k < D; ++k) dot += static_cast<double>(qh[k]) * list[i][k];
        p[i] = dot * scale;
        m = std::max(m, p[i]);
      }
      double den = std::exp(sink[h] - m);
      for (size_t i = 0; i < list.size(); ++i) {
        p[i] = list[i] == nullptr ? 0.0 : std::exp(p[i] - m);
        den += p[i];
      }
      std::fill(o.begin(), o.end(), 0.0);
      std::fill(a.begin(), a.end(), 0.0);
      for (size_t i = 0; i < list.size(); ++i) {
        if (list[i] == nullptr) continue;
        for (int64_t k = 0; k < D; ++k) {
          o[k] += p[i] * list[i][k];
          a[k] += p[i] * std::fabs(list[i][k]);
        }
      }
      for (int64_t k = 0; k < D; ++k) {
        o[k] /= den;
        bound[k] = u7 * (a[k] / den + std::fabs(o[k]));
      }
      for (int64_t k = D - rope_dim; k < D; k += 2) {  // inverse RoPE: s = −sin
        const int64_t i = t * (rope_dim / 2) + (k - (D - rope_dim)) / 2;
        const double c = cs[i], sv = -static_cast<double>(sn[i]);
        const double x = o[k] * c - o[k + 1] * sv, y = o[k] * sv + o[k + 1] * c;
        const double bx = 1.01 * (std::fabs(c) * bound[k] + std::fabs(sv) * bound[k + 1]);
        const double by = 1.01 * (std::fabs(sv) * bound[k] + std::fabs(c) * bound[k + 1]);
        o[k] = x;
        o[k + 1] = y;
        bound[k] = bx + u7 * std::fabs(x);
        bound[k + 1] = by + u7 * std::fabs(y);
      }
      for (int64_t k = 0; k < D; ++k) {
        const size_t e = static_cast<size_t>((t * H + h) * D + k);
        const double x = Bf16ToFloat(split[e]), y = Bf16ToFloat(serial[e]), d = std::fabs(x - y);
        ++r.n;
        r.identical += split[e] == serial[e];
        r.over += !(d <= bound[k]);
        if (bound[k] > 0) r.worst = std::max(r.worst, d / bound[k]);
        d2 += d * d;
        s2 += y * y;
        e_split += (x - o[k]) * (x - o[k]);
        e_serial += (y - o[k]) * (y - o[k]);
        o2 += o[k] * o[k];
      }
    }
  }
  r.rms_rel = s2 > 0 ? std::sqrt(d2 / s2) : 0.0;
  r.split_exact = o2 > 0 ? std::sqrt(e_split / o2) : 0.0;
  r.serial_exact = o2 > 0 ? std::sqrt(e_serial / o2) : 0.0;
  return r;
}

void PrintSplitVsSerial(const char* what, const SplitVsSerial& r) {
  std::printf(
      "%s: split path vs serial kernel: %lld of %lld outputs bit-identical, rms_rel "
      "%.2e, max |diff| / bound %.3f, %lld over the bound; rms_rel to the exact softmax: split "
      "%.2e, serial %.2e\n",
      what, static_cast<long long>(r.identical), static_cast<long long>(r.n), r.rms_rel, r.worst,
      static_cast<long long>(r.over), r.split_exact, r.serial_exact);
}

struct RefCase {
  const char* name;
  int64_t T, H, D, window, compressed, pool;
};

// KvSparseAttention (no rows scratch: the per-(token, head) kernels) over plain bf16 records
// (nope = 0) against the reference's SparseAttendHead, on candidate lists shaped like the
// reference's: `window` raw entries (positions before the query masked early on), then
// `compressed` entries with some masked.
void ReferenceCase(const RefCase& c) {
  std::mt19937_64 rng(c.H * 1000 + c.D);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(c.pool - 1));
  const int64_t C = c.window + c.compressed;
  std::vector<float> q(c.T * c.H * c.D), pool(c.pool * c.D), sink(c.H);
  for (float& v : q) v = RoundBf16(nd(rng));
  for (float& v : pool) v = RoundBf16(nd(rng));
  for (float& v : sink) v = nd(rng);
  std::vector<int32_t> cand(c.T * C);
  for (int64_t t = 0; t < c.T; ++t) {
    const int64_t valid_window = std::min<int64_t>(c.window, 1 + t * (c.window / 2));
    for (int64_t i = 0; i < C; ++i) {
      int32_t v = pick(rng);
      if (i < c.window && i >= valid_window) v = -1;
      if (i >= c.window && (i + t) % 7 == 0) v = -1;
      cand[t * C + i] = v;
    }
  }
  DeviceBuffer<uint16_t> dq(ToBf16(q)), dp(ToBf16(pool)), dout(q.size());
  DeviceBuffer<float> ds(sink);
  std::vector<uint64_t> cand_b(cand.size());
  for (size_t i = 0; i < cand.size(); ++i) {
    cand_b[i] = cand[i] < 0 ? 0 : reinterpret_cast<uint64_t>(dp.get()) + cand[i] * 2 * c.D;
  }
  DeviceBuffer<uint64_t> dc(cand_b);
  const float scale = static_cast<float>(std::pow(static_cast<double>(c.D), -0.5));
  CUDA_ASSERT_OK(KvSparseAttention({.q = AsBf16(dq.get()),
                                    .cand = dc.get(),
                                    .sink = ds.get(),
                                    .T = c.T,
                                    .n_heads = c.H,
                                    .head_dim = c.D,
                                    .nope = 0,
                                    .n_cand = C,
                                    .scale = scale,
                                    .out = AsBf16(dout.get())},
                                   nullptr));
  CUDA_ASSERT_OK(cudaDeviceSynchronize());
  const std::vector<uint16_t> ob = dout.Get();
  std::vector<float> got(ob.size()), ref(ob.size());
  for (size_t i = 0; i < ob.size(); ++i) got[i] = Bf16ToFloat(ob[i]);
  for (int64_t t = 0; t < c.T; ++t) {
    std::vector<const float*> list;
    for (int64_t i = 0; i < C; ++i) {
      const int32_t v = cand[t * C + i];
      list.push_back(v >= 0 ? pool.data() + v * c.D : nullptr);
    }
    for (int64_t h = 0; h < c.H; ++h) {
      model::SparseAttendHead(q.data() + (t * c.H + h) * c.D, list, c.D, scale, sink[h],
                              ref.data() + (t * c.H + h) * c.D);
    }
  }
  const golden::Closeness cl = golden::Compare(got.data(), ref.data(), ref.size());
  std::printf("%s T=%ld H=%ld D=%ld candidates=%ld: rms_rel=%.2e max_rel=%.2e bit_identical=%.4f\n",
              c.name, static_cast<long>(c.T), static_cast<long>(c.H), static_cast<long>(c.D),
              static_cast<long>(C), cl.rms_rel, cl.max_rel, cl.bit_identical);
  EXPECT_LE(cl.rms_rel, 2e-3) << c.name;
  EXPECT_GE(cl.bit_identical, 0.9) << c.name;
}

TEST_F(PagedKvTest, AttentionMatchesTheReference) {
  ReferenceCase({"tiny-a", 5, 4, 128, 16, 8, 64});
  ReferenceCase({"flash-csa", 4, 64, 512, 128, 512, 2048});
  for (const int64_t H : {32, 16, 8}) ReferenceCase({"flash-tp", 2, H, 512, 128, 64, 1024});
}

TEST_F(PagedKvTest, AttentionRejectsUnsupportedHeadDim) {
  EXPECT_EQ(KvSparseAttention({.T = 1, .n_heads = 1, .head_dim = 100, .n_cand = 1, .scale = 1.0f},
                              nullptr),
            cudaErrorInvalidValue);
}

void AttentionCase(int64_t D, uint64_t seed) {
  const int64_t n = 300, T = 5, H = 4, n_cand = 150, nope = D - 64;
  std::vector<float> full = SimEntries(n, seed);
  // D = 512: the entries; D = 128: nope tile 0 and the rope dims.
  std::vector<float> ent(n * D);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t k = 0; k < nope; ++k) ent[i * D + k] = full[i * kKvDim + k];
    for (int64_t k = 0; k < 64; ++k) ent[i * D + nope + k] = full[i * kKvDim + kKvNopeDim + k];
  }
  const std::vector<uint16_t> bits = ToBf16(ent);
  const int64_t E = KvRecordBytes(nope, 64);
  // Records at scattered slots of a buffer twice the size.
  uint8_t* recs = nullptr;
  ASSERT_EQ(cudaMalloc(&recs, 2 * n * E), cudaSuccess);
  cudaMemset(recs, 0xff, 2 * n * E);
  std::vector<uint64_t> dst(n);
  for (int64_t i = 0; i < n; ++i)
    dst[i] = reinterpret_cast<uint64_t>(recs) + ((i * 7) % (2 * n)) * E;
  uint16_t* d_ent = ToDevice(bits);
  uint64_t* d_dst = ToDevice(dst);
  ASSERT_EQ(KvEncodeRecords(AsBf16(d_ent), d_dst, n, nope, 64, nullptr), cudaSuccess);
  if (D == kKvDim) {
    const std::vector<uint8_t> all = ToHost(recs, 2 * n * E);
    std::vector<uint8_t> want(kKvRecordBytes);
    int64_t same = 0;
    for (int64_t i = 0; i < n; ++i) {
      EncodeKvRecord(full.data() + i * kKvDim, want.data());
      same += std::memcmp(all.data() + ((i * 7) % (2 * n)) * E, want.data(), kKvRecordBytes) == 0;
    }
    EXPECT_EQ(same, n);
    std::printf("records equal to common/kv_record.h's: %lld of %lld\n",
                static_cast<long long>(same), static_cast<long long>(n));
  }
  // The same candidates as fp8 records (cand_p) and as plain bf16 records (nope = 0: the entries'
  // bf16 rows, KvRecordBytes(0, D) = 2·D bytes each) in d_ent (cand_b).
  std::mt19937_64 rng(seed + 1);
  std::vector<int32_t> cand(T * n_cand);
  std::vector<uint64_t> cand_p(T * n_cand), cand_b(T * n_cand);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < n_cand; ++j) {
      int32_t v = static_cast<int32_t>(rng() % n);
      if (j > 0 && rng() % 9 == 0) v = -1;
      cand[t * n_cand + j] = v;
      cand_p[t * n_cand + j] = v < 0 ? 0 : dst[v];
      cand_b[t * n_cand + j] = v < 0 ? 0 : reinterpret_cast<uint64_t>(d_ent) + v * 2 * D;
    }
  }
  const std::vector<float> qf = RandomBf16(T * H * D, 0.3f, seed + 2);
  const std::vector<uint16_t> q = ToBf16(qf);
  const std::vector<float> sink = {0.1f, -0.5f, 1.0f, 0.0f};
  uint16_t* d_q = ToDevice(q);
  uint64_t* d_cand_b = ToDevice(cand_b);
  uint64_t* d_cand_p = ToDevice(cand_p);
  float* d_sink = ToDevice(sink);
  uint16_t *o1 = nullptr, *o2 = nullptr;
  cudaMalloc(&o1, T * H * D * 2);
  cudaMalloc(&o2, T * H * D * 2);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  KvSparseAttentionParams ap = {.q = AsBf16(d_q),
                                .cand = d_cand_b,
                                .sink = d_sink,
                                .T = T,
                                .n_heads = H,
                                .head_dim = D,
                                .nope = 0,
                                .n_cand = n_cand,
                                .scale = scale,
                                .out = AsBf16(o1)};
  ASSERT_EQ(KvSparseAttention(ap, nullptr), cudaSuccess);
  ap.cand = d_cand_p;
  ap.nope = nope;
  ap.out = AsBf16(o2);
  ASSERT_EQ(KvSparseAttention(ap, nullptr), cudaSuccess);
  // The same with the candidates decoded once into rows (the decode path's scratch): at head_dim
  // 512 (T ≤ kKvSplitMaxTokens) the split path, within its rounding bound of the serial kernel.
  uint16_t *o3 = nullptr, *rows = nullptr;
  cudaMalloc(&o3, T * H * D * 2);
  cudaMalloc(&rows, KvSparseAttentionRowsBytes(T, n_cand, D, H));
  ap.out = AsBf16(o3);
  ap.rows = AsBf16(rows);
  ASSERT_EQ(KvSparseAttention(ap, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> a = ToHost(o1, T * H * D), b = ToHost(o2, T * H * D),
                              c = ToHost(o3, T * H * D);
  int64_t same = 0, same_rows = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    same += a[i] == b[i];
    same_rows += a[i] == c[i];
  }
  std::printf(
      "head_dim %lld: attention over fp8 vs plain bf16 records: %lld of %zu outputs "
      "bit-identical (decoded rows: %lld)\n",
      static_cast<long long>(D), static_cast<long long>(same), a.size(),
      static_cast<long long>(same_rows));
  EXPECT_EQ(same, static_cast<int64_t>(a.size()));
  if (D == 512) {
    std::vector<std::vector<const float*>> lists(T);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < n_cand; ++j) {
        const int32_t v = cand[t * n_cand + j];
        lists[t].push_back(v < 0 ? nullptr : ent.data() + v * D);
      }
    }
    const SplitVsSerial r = CompareSplitToSerial(qf, lists, sink, H, D, scale, 0, {}, {}, c, a);
    PrintSplitVsSerial("head_dim 512, decoded rows", r);
    EXPECT_EQ(r.over, 0);
  } else {
    EXPECT_EQ(same_rows, static_cast<int64_t>(a.size()));
  }
  cudaFree(o3);
  cudaFree(rows);
  for (void* p :
       {static_cast<void*>(recs), static_cast<void*>(d_ent), static_cast<void*>(d_dst),
        static_cast<void*>(d_q), static_cast<void*>(d_cand_b), static_cast<void*>(d_cand_p),
        static_cast<void*>(d_sink), static_cast<void*>(o1), static_cast<void*>(o2)}) {
    cudaFree(p);
  }
}

TEST_F(PagedKvTest, RecordsAndAttentionMatchPlainBf16Records) {
  AttentionCase(512, 11);
  AttentionCase(128, 12);
}

// The decode path (KvBuildCandidates decoding the rows, the split attention with the inverse
// RoPE in its combine) against the previous composition (candidates, then KvSparseAttention's
// own decode launch and ApplyRope: the same split kernels, so the same bits), itself again (the
// same bits: deterministic) and the per-head serial fast kernel (no rows) with ApplyRope (within
// the split path's rounding bound, CompareSplitToSerial), on a paged layer: ring and staged
// window records (partial windows masked, so whole chunks masked), indexer selections with −1, a
// ratio layer's every-complete-entry list, ragged candidate counts; decode batches and
// prefill-sized ones (several slices of kKvSplitMaxTokens tokens).
struct DecodeCase {
  int64_t D, T, H, n_comp;
};

void DecodePathCase(const DecodeCase& c) {
  const int64_t D = c.D, nope = D - 64, E = KvRecordBytes(nope, 64), W = 128;
  const int64_t n_entries = 1024, per_block = 64, blocks = 1 + n_entries / per_block;
  const int64_t T = c.T, H = c.H, n_cand = W + c.n_comp, block_bytes = W * E;
  KvGeom g;
  uint8_t* pool = nullptr;
  ASSERT_EQ(cudaMalloc(&pool, blocks * block_bytes + T * E), cudaSuccess);
  g.pool = reinterpret_cast<uint64_t>(pool);
  g.block_bytes = block_bytes;
  g.nope = static_cast<int32_t>(nope);
  g.rope = 64;
  g.record_bytes = static_cast<int32_t>(E);
  g.window = static_cast<int32_t>(W);
  g.win_per_block = static_cast<int32_t>(W);
  g.first_entry_block = 1;
  g.ratio = 4;
  g.entries_per_block = static_cast<int32_t>(per_block);
  std::vector<int32_t> table(blocks);
  for (int64_t b = 0; b < blocks; ++b) table[b] = static_cast<int32_t>(blocks - 1 - b);
  // Every record slot (the ring, the compressed entries, each token's staged record) encoded.
  std::vector<uint64_t> dst;
  for (int64_t i = 0; i < W; ++i) dst.push_back(g.pool + table[0] * block_bytes + i * E);
  for (int64_t j = 0; j < n_entries; ++j) {
    dst.push_back(g.pool + table[1 + j / per_block] * block_bytes + (j % per_block) * E);
  }
  for (int64_t t = 0; t < T; ++t) dst.push_back(g.pool + blocks * block_bytes + t * E);
  const int64_t n = static_cast<int64_t>(dst.size());
  uint16_t* d_ent = ToDevice(ToBf16(RandomBf16(n * D, 1.0f, 20 + D)));
  uint64_t* d_dst = ToDevice(dst);
  ASSERT_EQ(KvEncodeRecords(AsBf16(d_ent), d_dst, n, nope, 64, nullptr), cudaSuccess);
  int32_t* d_table = ToDevice(table);
  // Tokens: a full window, a partial one, every complete entry (no indexer), in turn.
  std::mt19937_64 rng(c.T * 100 + c.H + c.n_comp);
  std::vector<KvToken> tok(T);
  std::vector<int32_t> sel(T * c.n_comp);
  for (int64_t t = 0; t < T; ++t) {
    KvToken& k = tok[t];
    k.table = reinterpret_cast<uint64_t>(d_table);
    k.staging = dst[W + n_entries + t];
    k.n_table = static_cast<int32_t>(blocks);
    k.pos = t % 3 == 1 ? static_cast<int32_t>(40 + t) : static_cast<int32_t>(4000 + 37 * t);
    k.chunk_start = k.pos;
    k.chunk_end = k.pos + 1;
    k.win_width = static_cast<int32_t>(W);
    k.n_comp = static_cast<int32_t>(c.n_comp);
    k.sel_off = t % 3 == 2 ? -1 : static_cast<int32_t>(t * c.n_comp);
    for (int64_t m = 0; m < c.n_comp; ++m) {
      sel[t * c.n_comp + m] = rng() % 7 == 0 ? -1 : static_cast<int32_t>(rng() % n_entries);
    }
  }
  KvToken* d_tok = ToDevice(tok);
  int32_t* d_sel = ToDevice(sel);
  const std::vector<float> qf = RandomBf16(T * H * D, 0.3f, 30 + H), sink = RandomF32(H, 1.0f, 31);
  uint16_t* d_q = ToDevice(ToBf16(qf));
  float* d_sink = ToDevice(sink);
  std::vector<float> cs(T * 32), sn(T * 32);
  for (int64_t i = 0; i < T * 32; ++i) {
    const float a = static_cast<float>(rng() % 100000) * 1e-3f;
    cs[i] = std::cos(a);
    sn[i] = std::sin(a);
  }
  float* d_cos = ToDevice(cs);
  float* d_sin = ToDevice(sn);
  const size_t rows_bytes = KvSparseAttentionRowsBytes(T, n_cand, D, H);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  DeviceBuffer<uint64_t> cand_a(T * n_cand), cand_b(T * n_cand);
  DeviceBuffer<uint16_t> rows_a(rows_bytes / 2), rows_b(rows_bytes / 2);
  DeviceBuffer<uint16_t> out_a(T * H * D), out_b(T * H * D), out_c(T * H * D), out_d(T * H * D);
  ASSERT_EQ(
      KvBuildCandidates(g, d_tok, T, d_sel, n_cand, cand_a.get(), nullptr, AsBf16(rows_a.get())),
      cudaSuccess);
  const KvSparseAttentionParams fused = {.q = AsBf16(d_q),
                                         .cand = cand_a.get(),
                                         .sink = d_sink,
                                         .T = T,
                                         .n_heads = H,
                                         .head_dim = D,
                                         .nope = nope,
                                         .n_cand = n_cand,
                                         .scale = scale,
                                         .out = AsBf16(out_a.get()),
                                         .rows = AsBf16(rows_a.get()),
                                         .rows_decoded = true,
                                         .rope_cos = d_cos,
                                         .rope_sin = d_sin,
                                         .rope_dim = 64};
  ASSERT_EQ(KvSparseAttention(fused, nullptr), cudaSuccess);
  const std::vector<uint16_t> rows = rows_a.Get();  // the decoded candidates, for the bound
  KvSparseAttentionParams again = fused;
  again.out = AsBf16(out_d.get());
  ASSERT_EQ(KvSparseAttention(again, nullptr), cudaSuccess);
  ASSERT_EQ(KvBuildCandidates(g, d_tok, T, d_sel, n_cand, cand_b.get(), nullptr), cudaSuccess);
  KvSparseAttentionParams general = fused;
  general.cand = cand_b.get();
  general.out = AsBf16(out_b.get());
  general.rows = AsBf16(rows_b.get());
  general.rows_decoded = false;
  general.rope_cos = nullptr;
  general.rope_sin = nullptr;
  general.rope_dim = 0;
  ASSERT_EQ(KvSparseAttention(general, nullptr), cudaSuccess);
  ASSERT_EQ(ApplyRope(AsBf16(out_b.get()), T, H, D, 64, d_cos, d_sin, true, nullptr), cudaSuccess);
  KvSparseAttentionParams serial = fused;
  serial.cand = cand_b.get();
  serial.out = AsBf16(out_c.get());
  serial.rows = nullptr;
  serial.rows_decoded = false;
  ASSERT_EQ(KvSparseAttention(serial, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint64_t> ca = cand_a.Get();
  EXPECT_EQ(ca, cand_b.Get());
  const std::vector<uint16_t> a = out_a.Get(), b = out_b.Get(), o = out_c.Get(), d = out_d.Get();
  int64_t same_b = 0, same_d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    same_b += a[i] == b[i];
    same_d += a[i] == d[i];
  }
  std::vector<float> decoded(T * n_cand * D);  // rows [T, n_cand, D] (masked ones unused)
  for (size_t i = 0; i < decoded.size(); ++i) decoded[i] = Bf16ToFloat(rows[i]);
  std::vector<std::vector<const float*>> lists(T);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < n_cand; ++j) {
      lists[t].push_back(ca[t * n_cand + j] == 0 ? nullptr : decoded.data() + (t * n_cand + j) * D);
    }
  }
  const SplitVsSerial r = CompareSplitToSerial(qf, lists, sink, H, D, scale, 64, cs, sn, a, o);
  std::printf(
      "decode path D %lld T %lld H %lld n_cand %lld: %lld / %lld of %zu outputs equal to "
      "the two-call rows path / a second run\n",
      static_cast<long long>(D), static_cast<long long>(T), static_cast<long long>(H),
      static_cast<long long>(n_cand), static_cast<long long>(same_b),
      static_cast<long long>(same_d), a.size());
  PrintSplitVsSerial("  with ApplyRope", r);
  EXPECT_EQ(same_b, static_cast<int64_t>(a.size()));
  EXPECT_EQ(same_d, static_cast<int64_t>(a.size()));
  EXPECT_EQ(r.over, 0);
  for (void* p : {static_cast<void*>(pool), static_cast<void*>(d_ent), static_cast<void*>(d_dst),
                  static_cast<void*>(d_table), static_cast<void*>(d_tok), static_cast<void*>(d_sel),
                  static_cast<void*>(d_q), static_cast<void*>(d_sink), static_cast<void*>(d_cos),
                  static_cast<void*>(d_sin)}) {
    cudaFree(p);
  }
}

TEST_F(PagedKvTest, DecodePathMatchesTheGeneralPath) {
  for (const DecodeCase& c :
       {DecodeCase{512, 1, 64, 512}, DecodeCase{512, 3, 32, 64}, DecodeCase{512, 8, 16, 22},
        DecodeCase{512, 2, 8, 512}, DecodeCase{512, 4, 6, 100}, DecodeCase{256, 3, 64, 150},
        DecodeCase{512, 20, 64, 100}, DecodeCase{256, 11, 16, 40}}) {
    DecodePathCase(c);
  }
}

TEST_F(PagedKvTest, Mxfp4KeysRoundTripThroughATable) {
  const int64_t hd = 128, n = 100, per_block = 32, key_bytes = KvKeyBytes(hd);
  // FP4-simulated keys: e2m1 values times a power of two per 32-group (some groups all zero).
  std::mt19937_64 rng(5);
  const float grid[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  std::vector<float> keys(n * hd);
  for (int64_t g = 0; g < n * hd / 32; ++g) {
    const float s = std::ldexp(1.0f, static_cast<int>(rng() % 20) - 12);
    const bool zero = rng() % 17 == 0;
    for (int i = 0; i < 32; ++i) {
      const float v = grid[rng() % 8] * s * ((rng() & 1) ? -1.0f : 1.0f);
      keys[g * 32 + i] = zero ? 0.0f : v;
    }
  }
  // A table of 4 blocks (block 0 the windows' in the backend: skipped), blocks in reverse order.
  const int64_t blocks = (n + per_block - 1) / per_block, block_bytes = per_block * key_bytes + 40;
  std::vector<int32_t> table(1 + blocks);
  for (int64_t b = 0; b <= blocks; ++b) table[b] = static_cast<int32_t>(blocks - b);
  uint8_t* pool = nullptr;
  ASSERT_EQ(cudaMalloc(&pool, (blocks + 1) * block_bytes), cudaSuccess);
  KvGeom g;
  g.pool = reinterpret_cast<uint64_t>(pool);
  g.block_bytes = block_bytes;
  g.first_entry_block = 1;
  g.key_dim = static_cast<int32_t>(hd);
  g.keys_per_block = static_cast<int32_t>(per_block);
  g.key_off = 40;
  std::vector<uint64_t> dst(n);
  for (int64_t j = 0; j < n; ++j) {
    dst[j] =
        g.pool + table[1 + j / per_block] * block_bytes + g.key_off + (j % per_block) * key_bytes;
  }
  uint16_t* d_keys = ToDevice(ToBf16(keys));
  uint64_t* d_dst = ToDevice(dst);
  int32_t* d_table = ToDevice(table);
  uint16_t* out = nullptr;
  cudaMalloc(&out, n * hd * 2);
  ASSERT_EQ(KvEncodeKeys(AsBf16(d_keys), d_dst, n, hd, nullptr), cudaSuccess);
  ASSERT_EQ(KvGatherKeys(g, d_table, 1 + blocks, n, AsBf16(out), nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> back = FromBf16(ToHost(out, n * hd));
  int64_t same = 0;
  for (size_t i = 0; i < keys.size(); ++i) same += back[i] == keys[i];
  std::printf("MXFP4 keys (%lld bytes each): %lld of %zu values round-trip exactly\n",
              static_cast<long long>(key_bytes), static_cast<long long>(same), keys.size());
  EXPECT_EQ(same, static_cast<int64_t>(keys.size()));

  // Indexer scores read from the pool in place (KvIndexerScores) against IndexerScores over the
  // gathered bf16 keys, for tokens at several positions (columns past a token's eligible keys,
  // a partial last tile) and a table one block short (its keys read as 0).
  const int64_t T = 3, H = 64, ratio = 4, n_cols = n;
  const std::vector<uint16_t> q = ToBf16(RandomBf16(T * H * hd, 0.5f, 6));
  const std::vector<uint16_t> w = ToBf16(RandomBf16(T * H, 0.2f, 7));
  const std::vector<int64_t> pos = {4 * n - 1, 150, 37};
  uint16_t* d_q = ToDevice(q);
  uint16_t* d_w = ToDevice(w);
  int64_t* d_pos = ToDevice(pos);
  float *s1 = nullptr, *s2 = nullptr;
  cudaMalloc(&s1, T * n_cols * 4);
  cudaMalloc(&s2, T * n_cols * 4);
  for (const int64_t n_table : {1 + blocks, blocks}) {
    ASSERT_EQ(KvGatherKeys(g, d_table, n_table, n, AsBf16(out), nullptr), cudaSuccess);
    ASSERT_EQ(IndexerScores({.q = AsBf16(d_q),
                             .w = AsBf16(d_w),
                             .keys = AsBf16(out),
                             .positions = d_pos,
                             .T = T,
                             .heads = H,
                             .head_dim = hd,
                             .ratio = ratio,
                             .n_cols = n_cols,
                             .scores = s1},
                            nullptr),
              cudaSuccess);
    ASSERT_EQ(KvIndexerScores({.q = AsBf16(d_q),
                               .w = AsBf16(d_w),
                               .g = g,
                               .positions = d_pos,
                               .T = T,
                               .heads = H,
                               .ratio = ratio,
                               .n_cols = n_cols,
                               .scores = s2},
                              d_table, n_table, nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> a = ToHost(s1, T * n_cols), b = ToHost(s2, T * n_cols);
    int64_t same_scores = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      same_scores += std::memcmp(&a[i], &b[i], 4) == 0;
    }
    std::printf(
        "indexer scores from MXFP4 keys in place (table of %lld): %lld of %zu "
        "bit-identical\n",
        static_cast<long long>(n_table), static_cast<long long>(same_scores), a.size());
    EXPECT_EQ(same_scores, static_cast<int64_t>(a.size()));
  }
  for (void* p : {static_cast<void*>(d_q), static_cast<void*>(d_w), static_cast<void*>(d_pos),
                  static_cast<void*>(s1), static_cast<void*>(s2)}) {
    cudaFree(p);
  }
  cudaFree(pool);
  cudaFree(d_keys);
  cudaFree(d_dst);
  cudaFree(d_table);
  cudaFree(out);
}

TEST_F(PagedKvTest, KernelsRunFromComputeSm86Ptx) {
  ExpectCompute86Ptx({{"KvBuildCandidates", KvBuildCandidatesKernel()},
                      {"KvBuildCandidatesRows", KvBuildCandidatesRowsKernel()},
                      {"KvEncodeRecords", KvEncodeRecordsKernel()},
                      {"KvEncodeKeys", KvEncodeKeysKernel()},
                      {"KvGatherKeys", KvGatherKeysKernel()},
                      {"KvSparseAttention", KvSparseAttentionKernel()},
                      {"KvSparseAttentionFast", KvSparseAttentionFastKernel()},
                      {"KvDecodeRows", KvDecodeRowsKernel()},
                      {"KvSplitChunk", KvSplitChunkKernel()},
                      {"KvSplitCombine", KvSplitCombineKernel()},
                      {"KvIndexerScores", KvIndexerScoresKernel()}});
}

}  // namespace
}  // namespace ss::cuda
