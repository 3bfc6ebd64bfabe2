#include "common/model/moe.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "common/bf16.h"
#include "common/model/linear.h"
#include "common/status.h"

namespace ss::model {

void SwiGlu(const float* gate, const float* up, int64_t n, float limit, float weight, bool weighted,
            float* a) {
  for (int64_t i = 0; i < n; ++i) {
    float g = gate[i], u = up[i];
    if (limit > 0.0f) {
      u = std::clamp(u, -limit, limit);
      g = std::min(g, limit);
    }
    float v = g / (1.0f + std::exp(-g)) * u;
    if (weighted) v = weight * v;
    a[i] = RoundBf16(v);
  }
}

RouterResult Route(const MoeWeights& w, const ModelConfig& c, const float* x,
                   const int64_t* token_ids, int64_t T) {
  const int64_t E = c.n_routed_experts, k = c.n_activated_experts;
  RouterResult r;
  r.indices.resize(T * k);
  r.weights.resize(T * k);
  std::vector<float> logits(T * E);
  LinearF32(w.gate, x, T, logits.data());
  std::vector<float> scores(E), biased(E);
  std::vector<int32_t> order(E);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      const float l = logits[t * E + e];
      scores[e] = std::sqrt(l > 20.0f ? l : std::log1p(std::exp(l)));
    }
    int32_t* idx = r.indices.data() + t * k;
    if (w.hash) {
      std::copy_n(w.tid2eid.data() + token_ids[t] * k, k, idx);
    } else {
      for (int64_t e = 0; e < E; ++e) biased[e] = scores[e] + w.bias[e];
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return biased[a] > biased[b]; });
      std::copy_n(order.begin(), k, idx);
    }
    float* wt = r.weights.data() + t * k;
    float sum = 0.0f;
    for (int64_t i = 0; i < k; ++i) {
      wt[i] = scores[idx[i]];
      sum += wt[i];
    }
    const float route_scale = static_cast<float>(c.route_scale);
    for (int64_t i = 0; i < k; ++i) wt[i] = wt[i] / sum * route_scale;
  }
  return r;
}

void RoutedExpert(const ExpertWeights& e, const float* x, const float* row_weights, int64_t n,
                  float limit, float* y) {
  const int64_t inter = e.w1.out;
  std::vector<float> g(n * inter), u(n * inter), a(n * inter);
  Linear4(e.w1, x, n, g.data());
  Linear4(e.w3, x, n, u.data());
  for (int64_t r = 0; r < n; ++r) {
    SwiGlu(g.data() + r * inter, u.data() + r * inter, inter, limit, row_weights[r], true,
           a.data() + r * inter);
  }
  Linear4(e.w2, a.data(), n, y);
}

void SharedExpert(const MoeWeights& w, const float* x, int64_t n, float limit, float* y) {
  const int64_t inter = w.shared_w1.out;
  std::vector<float> g(n * inter), u(n * inter), a(n * inter);
  Linear8(w.shared_w1, x, n, g.data());
  Linear8(w.shared_w3, x, n, u.data());
  for (int64_t r = 0; r < n; ++r) {
    SwiGlu(g.data() + r * inter, u.data() + r * inter, inter, limit, 1.0f, false,
           a.data() + r * inter);
  }
  Linear8(w.shared_w2, a.data(), n, y);
}

void RoutedSum(const MoeWeights& w, const ModelConfig& c, const float* x, const RouterResult& r,
               int64_t T, float* acc) {
  const int64_t dim = c.dim, k = c.n_activated_experts;
  const float limit = static_cast<float>(c.swiglu_limit);
  std::fill_n(acc, T * dim, 0.0f);
  std::vector<float> xs, ws, ys;
  for (int64_t e = 0; e < c.n_routed_experts; ++e) {
    std::vector<int64_t> rows;
    xs.clear();
    ws.clear();
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < k; ++i) {
        if (r.indices[t * k + i] != e) continue;
        rows.push_back(t);
        xs.insert(xs.end(), x + t * dim, x + (t + 1) * dim);
        ws.push_back(r.weights[t * k + i]);
      }
    }
    if (rows.empty()) continue;
    ys.resize(rows.size() * dim);
    RoutedExpert(w.experts[e], xs.data(), ws.data(), static_cast<int64_t>(rows.size()), limit,
                 ys.data());
    for (size_t i = 0; i < rows.size(); ++i) {
      for (int64_t d = 0; d < dim; ++d) acc[rows[i] * dim + d] += ys[i * dim + d];
    }
  }
}

void MoeForward(const MoeWeights& w, const ModelConfig& c, bool shared_expert_clamp, const float* x,
                const int64_t* token_ids, int64_t T, float* y, RouterResult* router) {
  // The local provider cannot fail.
  (void)MoeForward(w, c, shared_expert_clamp, /*layer=*/-1, x, token_ids, T, nullptr, y, router,
                   nullptr);
}

absl::Status MoeRouted(const MoeWeights& w, const ModelConfig& c, int64_t layer, const float* x,
                       const RouterResult& r, int64_t T, const RoutedExperts* experts, float* acc) {
  if (experts == nullptr) {
    RoutedSum(w, c, x, r, T, acc);
    return absl::OkStatus();
  }
  return experts->Compute(layer, T, x, r.indices.data(), r.weights.data(),
                          static_cast<int>(c.n_activated_experts), acc);
}

void MoeCombine(const float* acc, const float* shared, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = RoundBf16(acc[i] + shared[i]);
}

absl::Status MoeForward(const MoeWeights& w, const ModelConfig& c, bool shared_expert_clamp,
                        int64_t layer, const float* x, const int64_t* token_ids, int64_t T,
                        const RoutedExperts* experts, float* y, RouterResult* router,
                        MoeTimings* timings) {
  using Clock = std::chrono::steady_clock;
  const int64_t dim = c.dim;
  const float limit = static_cast<float>(c.swiglu_limit);
  const auto t0 = Clock::now();
  RouterResult r = Route(w, c, x, token_ids, T);
  const auto t1 = Clock::now();
  std::vector<float> acc(T * dim);
  RETURN_IF_ERROR(MoeRouted(w, c, layer, x, r, T, experts, acc.data()));
  const auto t2 = Clock::now();
  std::vector<float> sh(T * dim);
  SharedExpert(w, x, T, shared_expert_clamp ? limit : 0.0f, sh.data());
  MoeCombine(acc.data(), sh.data(), T * dim, y);
  if (router) *router = std::move(r);
  if (timings) {
    const auto t3 = Clock::now();
    timings->router_shared += std::chrono::duration<double>((t1 - t0) + (t3 - t2)).count();
    timings->routed += std::chrono::duration<double>(t2 - t1).count();
  }
  return absl::OkStatus();
}

}  // namespace ss::model
