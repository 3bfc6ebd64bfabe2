// Shared by the routed-expert kernel tests (mxfp4_moe_test, mxfp4_moe_decode_test): random MXFP4
// experts on the host, their device copy in Mxfp4ExpertLayout (parts, tiling, padded w2 scales),
// random routings and the CPU reference's routed sum (model::RoutedSum).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "common/model/moe.h"
#include "common/model/weights.h"
#include "common/model_config.h"
#include "gpu_worker/kernels/mxfp4_moe.h"
#include "gtest/gtest.h"

namespace ss::cuda::testing_util {

// A layer's experts in the checkpoint's layout on the host.
struct HostExperts {
  int64_t dim = 0, inter = 0;
  int E = 0;
  std::vector<std::vector<uint8_t>> w1, w1s, w3, w3s, w2, w2s;  // per expert
};

inline HostExperts RandomExperts(int64_t dim, int64_t inter, int E, uint64_t seed) {
  HostExperts h;
  h.dim = dim;
  h.inter = inter;
  h.E = E;
  std::mt19937_64 rng(seed);
  const auto bytes = [&](int64_t n) {
    std::vector<uint8_t> v(n);
    for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
    return v;
  };
  // Scales 2^-10 .. 2^-6 keep the gate/up sums near 1 for unit inputs.
  const auto scales = [&](int64_t n) {
    std::vector<uint8_t> v(n);
    for (uint8_t& b : v) b = static_cast<uint8_t>(117 + rng() % 5);
    return v;
  };
  for (int e = 0; e < E; ++e) {
    h.w1.push_back(bytes(inter * dim / 2));
    h.w1s.push_back(scales(inter * dim / 32));
    h.w3.push_back(bytes(inter * dim / 2));
    h.w3s.push_back(scales(inter * dim / 32));
    h.w2.push_back(bytes(dim * inter / 2));
    h.w2s.push_back(scales(dim * inter / 32));
  }
  return h;
}

inline model::MoeWeights ReferenceWeights(const HostExperts& h) {
  model::MoeWeights w;
  for (int e = 0; e < h.E; ++e) {
    model::ExpertWeights x;
    x.w1 = {h.w1[e].data(), h.w1s[e].data(), h.inter, h.dim};
    x.w3 = {h.w3[e].data(), h.w3s[e].data(), h.inter, h.dim};
    x.w2 = {h.w2[e].data(), h.w2s[e].data(), h.dim, h.inter};
    w.experts.push_back(x);
  }
  return w;
}

// rows x row_bytes into the tiled order of Mxfp4ExpertLayout::tile_rows (0: as is).
inline std::vector<uint8_t> Tiled(const std::vector<uint8_t>& m, int64_t rows, int64_t rb,
                                  int64_t tr) {
  if (tr == 0) return m;
  std::vector<uint8_t> out(m.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t kb = 0; kb < rb / 64; ++kb) {
      std::memcpy(out.data() + (r / tr) * tr * rb + kb * tr * 64 + (r % tr) * 64,
                  m.data() + r * rb + kb * 64, 64);
    }
  }
  return out;
}

// The device copy of experts [e0, e1): per expert `parts` ranges of part_inter intermediate rows
// from row i0, tiled by tile_rows; w2's scales stay one full [dim, I/32] matrix with `pad` bytes
// either side of each row (so the parts read it through w2_scale_stride and w2_scale_col0).
struct DeviceStore {
  Mxfp4ExpertLayout layout;
  std::vector<uint8_t> bytes;
};

inline DeviceStore BuildStore(const HostExperts& h, int e0, int e1, int64_t i0, int64_t part_inter,
                              int parts, int64_t tile_rows, int64_t pad) {
  DeviceStore s;
  Mxfp4ExpertLayout& L = s.layout;
  L.dim = h.dim;
  L.part_inter = part_inter;
  L.parts = parts;
  L.tile_rows = tile_rows;
  L.w2_scale_stride = h.inter / 32 + 2 * pad;
  L.w2_scale_col0 = pad + i0 / 32;
  const int64_t dim = h.dim;
  std::vector<uint8_t> one;  // one expert's bytes
  const auto put = [&](const std::vector<uint8_t>& v) {
    const int64_t off = static_cast<int64_t>(one.size());
    one.insert(one.end(), v.begin(), v.end());
    one.resize((one.size() + 15) / 16 * 16, 0);
    return off;
  };
  for (int e = e0; e < e1; ++e) {
    one.clear();
    for (int p = 0; p < parts; ++p) {
      const int64_t r0 = i0 + p * part_inter;
      const auto rows = [&](const std::vector<uint8_t>& m, int64_t rb) {
        return std::vector<uint8_t>(m.begin() + r0 * rb, m.begin() + (r0 + part_inter) * rb);
      };
      L.w1[p] = put(Tiled(rows(h.w1[e], dim / 2), part_inter, dim / 2, tile_rows));
      L.w1_scale[p] = put(rows(h.w1s[e], dim / 32));
      L.w3[p] = put(Tiled(rows(h.w3[e], dim / 2), part_inter, dim / 2, tile_rows));
      L.w3_scale[p] = put(rows(h.w3s[e], dim / 32));
      std::vector<uint8_t> w2(dim * part_inter / 2);
      for (int64_t n = 0; n < dim; ++n) {
        std::memcpy(w2.data() + n * part_inter / 2, h.w2[e].data() + n * h.inter / 2 + r0 / 2,
                    part_inter / 2);
      }
      L.w2[p] = put(Tiled(w2, dim, part_inter / 2, tile_rows));
    }
    std::vector<uint8_t> s2(dim * L.w2_scale_stride, 127);
    for (int64_t n = 0; n < dim; ++n) {
      std::memcpy(s2.data() + n * L.w2_scale_stride + pad, h.w2s[e].data() + n * h.inter / 32,
                  h.inter / 32);
    }
    const int64_t s2off = put(s2);
    for (int p = 0; p < parts; ++p) L.w2_scale[p] = s2off + p * part_inter / 32;
    if (e == e0) L.expert_bytes = static_cast<int64_t>(one.size());
    EXPECT_EQ(static_cast<int64_t>(one.size()), L.expert_bytes);
    s.bytes.insert(s.bytes.end(), one.begin(), one.end());
  }
  return s;
}

// Top-k of E distinct experts per token with weights in [0.2, 1.7).
inline model::RouterResult RandomRouting(int64_t T, int K, int E, uint64_t seed) {
  std::mt19937_64 rng(seed);
  model::RouterResult r;
  std::vector<int32_t> all(E);
  for (int64_t t = 0; t < T; ++t) {
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    for (int k = 0; k < K; ++k) {
      r.indices.push_back(all[k]);
      r.weights.push_back(0.2f + 1.5f * static_cast<float>(rng() % 1000) / 1000.0f);
    }
  }
  return r;
}

// The reference: RoutedSum over the routes to experts in [eb, ee) (others set to −1).
inline std::vector<float> Reference(const HostExperts& h, const std::vector<float>& x,
                                    model::RouterResult r, int64_t T, int K, int eb, int ee,
                                    float limit) {
  for (int32_t& id : r.indices) {
    if (id < eb || id >= ee) id = -1;
  }
  ModelConfig c;
  c.dim = h.dim;
  c.n_routed_experts = h.E;
  c.n_activated_experts = K;
  c.moe_inter_dim = h.inter;
  c.swiglu_limit = limit;
  std::vector<float> acc(T * h.dim);
  model::RoutedSum(ReferenceWeights(h), c, x.data(), r, T, acc.data());
  // The comparisons mean something only where the reference is not all zeros.
  if (eb < ee) {
    EXPECT_TRUE(std::any_of(acc.begin(), acc.end(), [](float v) { return v != 0.0f; }));
  }
  return acc;
}

inline bool BitIdentical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
}  // namespace ss::cuda::testing_util
