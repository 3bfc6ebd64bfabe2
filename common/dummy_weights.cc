#include "common/dummy_weights.h"

#include <sys/mman.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/bf16.h"
#include "common/codecs.h"
#include "common/load_progress.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "spdlog/spdlog.h"

namespace ss {
namespace {

// Every tensor is generated in chunks of this many bytes (the last one shorter), each from its
// own random stream keyed by (seed, name, chunk index): the unit of parallel work, and the reason
// the bytes do not depend on the thread count. tid2eid chunks are whole rows instead.
constexpr size_t kChunkBytes = size_t{1} << 20;
constexpr size_t kAlign = 64;  // every materialised tensor starts on a cache line

// Target code-unit std ranges: the tensor's std is sigma_code * 2^e with sigma_code in [lo, 2lo),
// about where a trained tensor's block-quantised codes sit (e4m3: amax of a 128x128 block near
// 4.5 sigma mapped below 448; e2m1: amax of 32 values near 2.5 sigma mapped below 6).
constexpr double kE4m3SigmaLo = 48.0;
constexpr double kE2m1SigmaLo = 1.25;

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

uint64_t Mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

bool Contains(std::string_view s, std::string_view part) { return s.find(part) != s.npos; }

uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

// splitmix64: a counter-based stream, one 64-bit word per call.
struct Stream {
  uint64_t s;
  uint64_t Next() { return Mix(s += kGolden); }
  uint64_t Below(uint64_t n) {  // (top 32 bits x n) >> 32; n < 2^32
    return ((Next() >> 32) * n) >> 32;
  }
};

#if defined(__x86_64__)
// GCC 12 flags the intrinsics' own "undefined" placeholder registers (_mm512_undefined_epi32).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
// The code lookup of FillChunk 64 bytes at a time: the same splitmix64 words (lane k of a step
// is word k), each byte mapped through the 256-entry table with two 128-entry byte permutes
// blended on the index's top bit. Gives exactly the scalar loop's bytes; returns how many it
// wrote (a multiple of 64) and advances the stream past the words it used.
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vbmi"))) size_t CodesAvx512(
    Stream* st, const uint8_t* table, uint8_t* p, size_t n) {
  const __m512i t0 = _mm512_loadu_si512(table), t1 = _mm512_loadu_si512(table + 64);
  const __m512i t2 = _mm512_loadu_si512(table + 128), t3 = _mm512_loadu_si512(table + 192);
  const __m512i c1 = _mm512_set1_epi64(static_cast<int64_t>(0xbf58476d1ce4e5b9ull));
  const __m512i c2 = _mm512_set1_epi64(static_cast<int64_t>(0x94d049bb133111ebull));
  const __m512i step = _mm512_set1_epi64(static_cast<int64_t>(8 * kGolden));
  __m512i s = _mm512_add_epi64(
      _mm512_set1_epi64(static_cast<int64_t>(st->s)),
      _mm512_set_epi64(static_cast<int64_t>(8 * kGolden), static_cast<int64_t>(7 * kGolden),
                       static_cast<int64_t>(6 * kGolden), static_cast<int64_t>(5 * kGolden),
                       static_cast<int64_t>(4 * kGolden), static_cast<int64_t>(3 * kGolden),
                       static_cast<int64_t>(2 * kGolden), static_cast<int64_t>(kGolden)));
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m512i x = s;
    x = _mm512_mullo_epi64(_mm512_xor_si512(x, _mm512_srli_epi64(x, 30)), c1);
    x = _mm512_mullo_epi64(_mm512_xor_si512(x, _mm512_srli_epi64(x, 27)), c2);
    x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 31));
    const __m512i low = _mm512_permutex2var_epi8(t0, x, t1);   // entries 0..127
    const __m512i high = _mm512_permutex2var_epi8(t2, x, t3);  // entries 128..255
    _mm512_storeu_si512(p + i, _mm512_mask_blend_epi8(_mm512_movepi8_mask(x), low, high));
    s = _mm512_add_epi64(s, step);
  }
  st->s += (i / 8) * kGolden;
  return i;
}
#pragma GCC diagnostic pop

bool HaveAvx512Vbmi() {
  static const bool have =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vbmi");
  return have;
}
#endif

uint64_t ChunkKey(uint64_t seed, std::string_view name, uint64_t chunk) {
  const uint64_t tensor = Mix(Mix(seed + kGolden) ^ Fnv1a(name));
  return Mix(tensor ^ Mix((chunk + 1) * 0x632be59bd9b4e019ull));
}

// Acklam's rational approximation of the standard normal quantile (|error| < 1.2e-9).
double NormalQuantile(double p) {
  static constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,
                                 -2.759285104469687e+02, 1.383577518672690e+02,
                                 -3.066479806614716e+01, 2.506628277459239e+00};
  static constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02,
                                 -1.556989798598866e+02, 6.680131188771972e+01,
                                 -1.328068155288572e+01};
  static constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01,
                                 -2.400758277161838e+00, -2.549671035506935e+00,
                                 4.374664141464968e+00,  2.938163982698783e+00};
  static constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01,
                                 2.445134137142996e+00, 3.754408661907416e+00};
  if (p < 0.02425) {
    const double q = std::sqrt(-2 * std::log(p));
    return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
           ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  if (p > 1 - 0.02425) return -NormalQuantile(1 - p);
  const double q = p - 0.5, r = q * q;
  return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
         (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
}

// The n equiprobable midpoint quantiles of N(0, 1), rescaled to unit rms.
std::vector<double> UnitQuantiles(int n) {
  std::vector<double> z(n);
  double ss = 0;
  for (int i = 0; i < n; ++i) {
    z[i] = NormalQuantile((i + 0.5) / n);
    ss += z[i] * z[i];
  }
  const double rms = std::sqrt(ss / n);
  for (double& v : z) v /= rms;
  return z;
}
const std::vector<double>& Quantiles256() {
  static const std::vector<double> z = UnitQuantiles(256);
  return z;
}
const std::vector<double>& Quantiles16() {
  static const std::vector<double> z = UnitQuantiles(16);
  return z;
}

// Codes for sigma * z_i whose decoded rms is closest to sigma (rounding to a coarse grid shrinks
// or grows the rms; a few multiplicative corrections bring it back).
template <typename Encode, typename Decode>
std::vector<uint8_t> CodeTable(const std::vector<double>& z, double sigma, Encode encode,
                               Decode decode) {
  std::vector<uint8_t> best, codes(z.size());
  double best_err = INFINITY, s = sigma;
  for (int iter = 0; iter < 8; ++iter) {
    double ss = 0;
    for (size_t i = 0; i < z.size(); ++i) {
      codes[i] = encode(static_cast<float>(s * z[i]));
      const double v = decode(codes[i]);
      ss += v * v;
    }
    const double rms = std::sqrt(ss / z.size());
    const double err = std::fabs(rms - sigma);
    if (err < best_err) {
      best_err = err;
      best = codes;
    }
    if (rms <= 0 || err < 1e-3 * sigma) break;
    s *= sigma / rms;
  }
  return best;
}

enum class Kind { kE4m3, kE2m1Pairs, kUe8m0, kBf16Normal, kF32Normal, kF32Uniform, kTid2eid };

// How one tensor is generated: normal(mean, std) / uniform[lo, hi) values, or codes with a
// power-of-two exponent `exp` (the block scale's, shared by the weight and its .scale).
struct Rule {
  Kind kind;
  double mean = 0, std = 0;  // normal; uniform: [mean, mean + std)
  int exp = 0;               // codes and scales: the block scale 2^exp
  size_t elem = 1;           // bytes per element (tid2eid: per row)
};

int ScaleExp(double std, double sigma_lo) {
  return static_cast<int>(std::floor(std::log2(std / sigma_lo)));
}

// std of an FP8 linear (N(0, 1/fan_in); the shared expert takes the routed experts' multipliers
// x8 for w1/w3 and x0.25 for w2, so its SwiGLU clamp fires as a trained model's does) and of an
// MXFP4 routed expert (w1/w3 N(0, 64/fan_in), w2 N(0, 0.0625/fan_in)).
double Fp8Std(std::string_view name, int64_t fan_in) {
  double mult = 1.0;
  if (Contains(name, "shared_experts.")) mult = Contains(name, ".w2.") ? 0.25 : 8.0;
  return mult / std::sqrt(static_cast<double>(fan_in));
}
double Fp4Std(std::string_view name, int64_t fan_in) {
  return (Contains(name, ".w2.") ? 0.25 : 8.0) / std::sqrt(static_cast<double>(fan_in));
}

absl::StatusOr<Rule> RuleFor(const ModelConfig& c, const ExpectedTensor& t) {
  auto no_rule = [&] {
    return absl::InternalError(absl::StrCat("dummy weights: no rule for ", t.name, " (",
                                            std::string(DTypeName(t.dtype)), ")"));
  };
  auto ends = [&](std::string_view s) { return std::string_view(t.name).ends_with(s); };
  const bool expert = Contains(t.name, "ffn.experts.");
  Rule r;
  switch (t.dtype) {
    case DType::kF8E4M3:
      if (t.shape.size() != 2) return no_rule();
      r.kind = Kind::kE4m3;
      r.std = Fp8Std(t.name, t.shape[1]);
      r.exp = ScaleExp(r.std, kE4m3SigmaLo);
      return r;
    case DType::kI8:
      if (t.shape.size() != 2 || !expert) return no_rule();
      r.kind = Kind::kE2m1Pairs;
      r.std = Fp4Std(t.name, 2 * t.shape[1]);
      r.exp = ScaleExp(r.std, kE2m1SigmaLo);
      return r;
    case DType::kF8E8M0:  // the partner weight's exponent; fan_in from the scale's columns
      if (t.shape.size() != 2 || !ends(".scale")) return no_rule();
      r.kind = Kind::kUe8m0;
      r.exp = expert ? ScaleExp(Fp4Std(t.name, 32 * t.shape[1]), kE2m1SigmaLo)
                     : ScaleExp(Fp8Std(t.name, 128 * t.shape[1]), kE4m3SigmaLo);
      if (r.exp < -127 || r.exp > 127) return no_rule();
      return r;
    case DType::kBF16:
      r.kind = Kind::kBf16Normal;
      r.elem = 2;
      if (t.name == "embed.weight") {
        r.std = 1.0;
      } else if (ends("norm.weight")) {
        r.mean = 1.0;
        r.std = 0.1;
      } else if (t.shape.size() == 2) {  // head (fan_in = dim), gate, compressor, weights_proj
        r.std = 1.0 / std::sqrt(static_cast<double>(t.shape[1]));
      } else {
        return no_rule();
      }
      return r;
    case DType::kF32:
      r.kind = Kind::kF32Normal;
      r.elem = 4;
      if (ends("_fn")) {
        r.std = 0.02;
      } else if (ends("_base")) {
        r.std = 0.5;
      } else if (ends("_scale")) {
        r.kind = Kind::kF32Uniform;
        r.mean = 0.5;
        r.std = 1.0;
      } else if (ends("attn_sink")) {
        r.std = 1.0;
      } else if (ends(".ape")) {
        r.std = 0.5;
      } else if (ends("gate.bias")) {
        r.std = 0.1;
      } else {
        return no_rule();
      }
      return r;
    case DType::kI64:
      if (!ends("gate.tid2eid") || t.shape.size() != 2 || t.shape[1] > c.n_routed_experts ||
          c.n_routed_experts >= (int64_t{1} << 32)) {
        return no_rule();
      }
      r.kind = Kind::kTid2eid;
      r.elem = 8 * static_cast<size_t>(t.shape[1]);
      return r;
    default:
      return no_rule();
  }
}

// The lookup tables of one rule (random byte -> value).
struct Tables {
  std::array<uint8_t, 256> code{};
  // [65536]: code2[a | b << 8] = code[a] | code[b] << 8, for the scalar loop (empty where
  // CodesAvx512 does the lookup).
  std::vector<uint16_t> code2;
  std::array<uint16_t, 256> bf16{};
  std::array<float, 256> f32{};
};

Tables MakeTables(const Rule& r) {
  Tables t;
  switch (r.kind) {
    case Kind::kE4m3: {
      const std::vector<uint8_t> c =
          CodeTable(Quantiles256(), std::ldexp(r.std, -r.exp), FloatToE4m3, E4m3ToFloat);
      std::copy(c.begin(), c.end(), t.code.begin());
      break;
    }
    case Kind::kE2m1Pairs: {  // two independent nibbles, element 2j low and 2j+1 high
      const std::vector<uint8_t> n =
          CodeTable(Quantiles16(), std::ldexp(r.std, -r.exp), FloatToE2m1, E2m1ToFloat);
      for (int b = 0; b < 256; ++b) t.code[b] = static_cast<uint8_t>(n[b & 15] | (n[b >> 4] << 4));
      break;
    }
    case Kind::kBf16Normal:
      for (int i = 0; i < 256; ++i) {
        t.bf16[i] = FloatToBf16(static_cast<float>(r.mean + r.std * Quantiles256()[i]));
      }
      break;
    case Kind::kF32Normal:
      for (int i = 0; i < 256; ++i) {
        t.f32[i] = static_cast<float>(r.mean + r.std * Quantiles256()[i]);
      }
      break;
    default:
      break;
  }
  bool vector_lookup = false;
#if defined(__x86_64__)
  vector_lookup = HaveAvx512Vbmi();
#endif
  if ((r.kind == Kind::kE4m3 || r.kind == Kind::kE2m1Pairs) && !vector_lookup) {  // 2 in 1
    t.code2.resize(65536);
    for (uint32_t i = 0; i < 65536; ++i) {
      t.code2[i] = static_cast<uint16_t>(t.code[i & 255] | (t.code[i >> 8] << 8));
    }
  }
  return t;
}

size_t ChunkElems(const Rule& r) { return std::max<size_t>(1, kChunkBytes / r.elem); }
size_t NumChunks(const Rule& r, size_t nbytes) {
  const size_t elems = nbytes / r.elem, per = ChunkElems(r);
  return std::max<size_t>(1, (elems + per - 1) / per);
}

bool IsGateBias(const ExpectedTensor& t) {
  return std::string_view(t.name).ends_with("ffn.gate.bias") && t.shape.size() == 1;
}

// Elements [e0, e1) of gate.bias `t` (p: element e0) += -skew * ln(1 + rank of the expert).
void AddRouterSkew(const ExpectedTensor& t, double skew, size_t e0, size_t e1, uint8_t* p) {
  const std::vector<int32_t> ranking = DummyRouterRanking(t.name, t.shape[0]);
  for (size_t r = 0; r < ranking.size(); ++r) {
    const size_t e = static_cast<size_t>(ranking[r]);
    if (e < e0 || e >= e1) continue;
    float v;
    std::memcpy(&v, p + 4 * (e - e0), 4);
    v += static_cast<float>(-skew * std::log1p(static_cast<double>(r)));
    std::memcpy(p + 4 * (e - e0), &v, 4);
  }
}

// Chunk `chunk` of tensor `t` into dst (the tensor's first byte).
void FillChunk(const ExpectedTensor& t, const Rule& r, const Tables& tab, int64_t n_routed,
               uint64_t seed, double router_skew, size_t chunk, uint8_t* dst, size_t nbytes) {
  const size_t per = ChunkElems(r), total = nbytes / r.elem;
  const size_t e0 = std::min(total, chunk * per), e1 = std::min(total, e0 + per);
  Stream st{ChunkKey(seed, t.name, chunk)};
  uint8_t* p = dst + e0 * r.elem;
  const size_t n = e1 - e0;
  switch (r.kind) {
    case Kind::kE4m3:
    case Kind::kE2m1Pairs: {
      // Byte j of a word is T[byte j of the random word], looked up two bytes at a time.
      const uint8_t* T = tab.code.data();
      const uint16_t* T2 = tab.code2.data();
      size_t i = 0;
#if defined(__x86_64__)
      if (HaveAvx512Vbmi()) i = CodesAvx512(&st, T, p, n);
#endif
      for (; i + 8 <= n; i += 8) {
        const uint64_t x = st.Next();
        const uint64_t w = uint64_t{T2[x & 0xffff]} | uint64_t{T2[(x >> 16) & 0xffff]} << 16 |
                           uint64_t{T2[(x >> 32) & 0xffff]} << 32 | uint64_t{T2[x >> 48]} << 48;
        std::memcpy(p + i, &w, 8);
      }
      for (uint64_t x = st.Next(); i < n; ++i, x >>= 8) p[i] = T[x & 255];
      break;
    }
    case Kind::kUe8m0:
      std::memset(p, 127 + r.exp, n);
      break;
    case Kind::kBf16Normal: {  // 8 bits pick the quantile, one more flips the last mantissa bit
      const uint16_t* T = tab.bf16.data();
      size_t i = 0;
      for (; i + 4 <= n; i += 4) {
        const uint64_t x = st.Next();
        const uint64_t j = x >> 32;
        const uint64_t w = uint64_t(T[x & 255] ^ (j & 1)) |
                           uint64_t(T[(x >> 8) & 255] ^ ((j >> 1) & 1)) << 16 |
                           uint64_t(T[(x >> 16) & 255] ^ ((j >> 2) & 1)) << 32 |
                           uint64_t(T[(x >> 24) & 255] ^ ((j >> 3) & 1)) << 48;
        std::memcpy(p + 2 * i, &w, 8);
      }
      for (uint64_t x = st.Next(); i < n; ++i, x >>= 8) {
        const uint16_t v = T[x & 255];
        std::memcpy(p + 2 * i, &v, 2);
      }
      break;
    }
    case Kind::kF32Normal:  // the quantile with its 16 low mantissa bits replaced at random
      for (size_t i = 0; i < n; ++i) {
        const uint64_t x = st.Next();
        uint32_t b;
        std::memcpy(&b, &tab.f32[x & 255], 4);
        b = (b & 0xffff0000u) | static_cast<uint32_t>((x >> 8) & 0xffff);
        std::memcpy(p + 4 * i, &b, 4);
      }
      if (router_skew > 0 && IsGateBias(t)) AddRouterSkew(t, router_skew, e0, e1, p);
      break;
    case Kind::kF32Uniform:
      for (size_t i = 0; i < n; ++i) {
        const float v =
            static_cast<float>(r.mean + r.std * static_cast<double>(st.Next() >> 40) * 0x1p-24);
        std::memcpy(p + 4 * i, &v, 4);
      }
      break;
    case Kind::kTid2eid: {  // each row: k distinct ids of [0, n_routed)
      const int64_t k = t.shape[1], experts = n_routed;
      std::vector<int64_t> perm;
      for (size_t row = 0; row < n; ++row) {
        int64_t ids[64];
        std::vector<int64_t> big;
        int64_t* out = ids;
        if (k > 64) {
          big.resize(k);
          out = big.data();
        }
        if (2 * k <= experts) {  // rejection: the expected draws stay below 2k
          for (int64_t j = 0; j < k;) {
            const int64_t v = static_cast<int64_t>(st.Below(experts));
            if (std::find(out, out + j, v) == out + j) out[j++] = v;
          }
        } else {  // partial Fisher-Yates
          perm.resize(experts);
          for (int64_t e = 0; e < experts; ++e) perm[e] = e;
          for (int64_t j = 0; j < k; ++j) {
            std::swap(perm[j], perm[j + static_cast<int64_t>(st.Below(experts - j))]);
            out[j] = perm[j];
          }
        }
        std::memcpy(p + row * r.elem, out, r.elem);
      }
      break;
    }
  }
}

size_t NumBytes(const ExpectedTensor& t) {
  size_t n = DTypeSize(t.dtype);
  for (int64_t d : t.shape) n *= static_cast<size_t>(d);
  return n;
}

// The materialised tensors and the shared zero page range, unmapped together.
struct Mappings {
  void* data = nullptr;
  size_t data_len = 0;
  void* zeros = nullptr;
  size_t zeros_len = 0;
  ~Mappings() {
    if (data != nullptr) ::munmap(data, data_len);
    if (zeros != nullptr) ::munmap(zeros, zeros_len);
  }
};

absl::StatusOr<void*> MapAnonymous(size_t len, int prot, const char* what) {
  void* p = ::mmap(nullptr, len, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("dummy weights: cannot map %.3f GB for %s", len / 1e9, what));
  }
  return p;
}

// "layers.12.ffn.x" -> 12 and "ffn.x"; false if `name` does not start with `prefix` + a number.
bool SplitIndexed(std::string_view name, std::string_view prefix, int64_t* index,
                  std::string_view* rest) {
  if (!name.starts_with(prefix)) return false;
  name.remove_prefix(prefix.size());
  const auto [ptr, ec] = std::from_chars(name.data(), name.data() + name.size(), *index);
  if (ec != std::errc() || ptr == name.data() || ptr == name.data() + name.size() || *ptr != '.') {
    return false;
  }
  *rest = name.substr(ptr - name.data() + 1);
  return true;
}

}  // namespace

TensorFilter StageTensors(const ModelConfig& c, int first_layer, int end_layer, bool embed,
                          bool head, bool mtp, bool routed_experts) {
  (void)c;
  return [=](std::string_view name) {
    int64_t index;
    std::string_view rest;
    if (SplitIndexed(name, "layers.", &index, &rest)) {
      return index >= first_layer && index < end_layer &&
             (routed_experts || !rest.starts_with("ffn.experts."));
    }
    if (SplitIndexed(name, "mtp.", &index, &rest)) {
      return mtp && (routed_experts || !rest.starts_with("ffn.experts."));
    }
    if (name == "embed.weight") return embed;
    return head && (name == "head.weight" || name == "norm.weight" || name.starts_with("hc_head_"));
  };
}

std::vector<int32_t> DummyRouterRanking(std::string_view gate_bias_name, int64_t n_experts) {
  if (n_experts <= 0) return {};
  std::vector<int32_t> ranking(static_cast<size_t>(n_experts));
  std::iota(ranking.begin(), ranking.end(), 0);
  // Fisher-Yates from a stream keyed by the name alone (not the seed).
  Stream st{Mix(Fnv1a(gate_bias_name) ^ 0x5bd1e9955bd1e995ull)};
  for (int64_t i = n_experts - 1; i > 0; --i) {
    std::swap(ranking[i], ranking[st.Below(static_cast<uint64_t>(i) + 1)]);
  }
  return ranking;
}

absl::Status ValidateDummyRouterSkew(double router_skew) {
  if (std::isfinite(router_skew) && router_skew >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--dummy-router-skew ", router_skew, ": must be a finite number >= 0"));
}

absl::Status FillDummyTensor(const ModelConfig& c, const ExpectedTensor& t, uint64_t seed,
                             uint8_t* dst, size_t nbytes, double router_skew) {
  RETURN_IF_ERROR(ValidateDummyRouterSkew(router_skew));
  if (nbytes != NumBytes(t)) {
    return absl::InvalidArgumentError(
        absl::StrCat("dummy weights: ", t.name, " needs ", NumBytes(t), " bytes, given ", nbytes));
  }
  ASSIGN_OR_RETURN(const Rule r, RuleFor(c, t));
  const Tables tab = MakeTables(r);
  const size_t chunks = NumChunks(r, nbytes);
  for (size_t k = 0; k < chunks; ++k)
    FillChunk(t, r, tab, c.n_routed_experts, seed, router_skew, k, dst, nbytes);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Checkpoint>> MakeDummyCheckpoint(const ModelConfig& c, uint64_t seed,
                                                                const TensorFilter& materialize,
                                                                ThreadPool* pool,
                                                                double router_skew) {
  RETURN_IF_ERROR(ValidateDummyRouterSkew(router_skew));
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<ExpectedTensor> expected = ExpectedTensors(c);
  struct Item {
    size_t offset = 0;  // into the data mapping
    bool generated = false;
    Rule rule;
    size_t table = 0;  // into `tables`: tensors of one rule share them
  };
  std::vector<Tables> tables;
  std::map<std::tuple<int, double, double, int>, size_t> table_of_rule;
  std::vector<Item> items(expected.size());
  size_t data_len = 0, zeros_len = 0, skipped = 0, to_generate = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const size_t n = NumBytes(expected[i]);
    Item& it = items[i];
    it.generated = materialize == nullptr || materialize(expected[i].name);
    if (!it.generated) {
      zeros_len = std::max(zeros_len, n);
      ++skipped;
      continue;
    }
    to_generate += n;
    ASSIGN_OR_RETURN(it.rule, RuleFor(c, expected[i]));
    const auto key =
        std::make_tuple(static_cast<int>(it.rule.kind), it.rule.mean, it.rule.std, it.rule.exp);
    auto [pos, added] = table_of_rule.emplace(key, tables.size());
    if (added) tables.push_back(MakeTables(it.rule));
    it.table = pos->second;
    it.offset = data_len;
    data_len += (n + kAlign - 1) / kAlign * kAlign;
  }

  auto maps = std::make_shared<Mappings>();
  if (data_len > 0) {
    ASSIGN_OR_RETURN(maps->data, MapAnonymous(data_len, PROT_READ | PROT_WRITE, "the weights"));
    maps->data_len = data_len;
    ::madvise(maps->data, data_len, MADV_HUGEPAGE);  // fewer faults while first-touching
  }
  if (zeros_len > 0) {
    ASSIGN_OR_RETURN(maps->zeros, MapAnonymous(zeros_len, PROT_READ, "the zero tensors"));
    maps->zeros_len = zeros_len;
  }
  uint8_t* const data = static_cast<uint8_t*>(maps->data);

  // Work units: (tensor, chunk), in tensor order; the pool hands them out dynamically.
  std::vector<std::pair<uint32_t, uint32_t>> units;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (!items[i].generated) continue;
    const size_t chunks = NumChunks(items[i].rule, NumBytes(expected[i]));
    for (size_t k = 0; k < chunks; ++k) units.emplace_back(i, k);
  }
  LoadProgress progress("generating dummy weights", static_cast<int64_t>(to_generate),
                        {.log_summary = false});
  const auto gen = [&](int64_t u, int) {
    const auto [i, k] = units[u];
    const Item& it = items[i];
    const size_t n = NumBytes(expected[i]), per = ChunkElems(it.rule) * it.rule.elem;
    FillChunk(expected[i], it.rule, tables[it.table], c.n_routed_experts, seed, router_skew, k,
              data + it.offset, n);
    progress.Add(static_cast<int64_t>(std::min(n, (k + 1) * per) - std::min(n, k * per)));
  };
  const auto t1 = std::chrono::steady_clock::now();
  if (pool != nullptr) {
    RETURN_IF_ERROR(pool->ParallelFor(static_cast<int64_t>(units.size()), gen));
  } else {
    for (size_t u = 0; u < units.size(); ++u) gen(static_cast<int64_t>(u), 0);
  }
  const double gen_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  progress.Done();
  if (data_len > 0) ::mprotect(maps->data, data_len, PROT_READ);

  std::vector<TensorView> views;
  views.reserve(expected.size());
  size_t generated = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    TensorView v;
    v.name = expected[i].name;
    v.dtype = expected[i].dtype;
    v.shape = expected[i].shape;
    v.nbytes = NumBytes(expected[i]);
    v.data = items[i].generated ? data + items[i].offset : static_cast<const uint8_t*>(maps->zeros);
    if (items[i].generated) generated += v.nbytes;
    if (v.nbytes == 0) v.data = data != nullptr ? data : static_cast<const uint8_t*>(maps->zeros);
    views.push_back(std::move(v));
  }
  const double total_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info(absl::StrFormat(
      "dummy weights (seed %d, router skew %g): generated %.3f GB (%d tensors; %d left as zeros) "
      "in %.2f s on %d thread(s): %.2f GB/s (%.2f s in all)",
      seed, router_skew, generated / 1e9, expected.size() - skipped, skipped, gen_s,
      pool != nullptr ? pool->size() : 1, generated / 1e9 / std::max(gen_s, 1e-9), total_s));
  return Checkpoint::FromMemory(absl::StrCat("dummy weights (seed ", seed, ")"), std::move(views),
                                std::move(maps));
}

}  // namespace ss
