#include "tests/tools/checkpoint_generator.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numbers>
#include <numeric>
#include <random>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/bf16.h"
#include "common/checkpoint_schema.h"
#include "common/codecs.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace ss {
namespace {

constexpr int64_t kFp8Block = 128;
constexpr int64_t kFp4Group = 32;

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// mt19937_64 with distributions of our own, so the stream is identical on every platform.
class Rng {
 public:
  Rng(uint64_t seed, const std::string& tensor) : gen_(SplitMix64(seed ^ Fnv1a(tensor))) {}

  double Uniform() { return static_cast<double>(gen_() >> 11) * 0x1p-53; }  // [0, 1)
  double Normal() {  // Box-Muller, both outputs used
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - Uniform();  // (0, 1]
    const double u2 = Uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2 * std::numbers::pi * u2);
    has_spare_ = true;
    return r * std::cos(2 * std::numbers::pi * u2);
  }
  uint64_t Below(uint64_t n) { return gen_() % n; }  // bias ~n/2^64: irrelevant here

 private:
  std::mt19937_64 gen_;
  bool has_spare_ = false;
  double spare_ = 0;
};

std::vector<float> Draw(Rng& rng, int64_t n, double mean, double std) {
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(mean + std * rng.Normal());
  return v;
}

template <typename T>
std::vector<uint8_t> Bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<uint8_t> ToBf16Bytes(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  std::transform(v.begin(), v.end(), h.begin(), FloatToBf16);
  return Bytes(h);
}

int64_t Numel(const std::vector<int64_t>& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

// The F32 init of spec §9.4, chosen by name; false for a tensor without a rule.
bool F32Values(const std::string& name, int64_t n, Rng& rng, std::vector<float>* out) {
  auto ends = [&](const char* s) { return absl::EndsWith(name, s); };
  if (ends("_fn")) {
    *out = Draw(rng, n, 0, 0.02);
  } else if (ends("_base")) {
    *out = Draw(rng, n, 0, 0.5);
  } else if (ends("_scale")) {
    out->resize(n);
    for (float& x : *out) x = static_cast<float>(0.5 + rng.Uniform());
  } else if (ends("attn_sink")) {
    *out = Draw(rng, n, 0, 1.0);
  } else if (ends(".ape")) {
    *out = Draw(rng, n, 0, 0.5);
  } else if (ends("gate.bias")) {
    *out = Draw(rng, n, 0, 0.1);
  } else {
    return false;
  }
  return true;
}

absl::Status Fill(const ModelConfig& cfg, const ExpectedTensor& t, uint64_t seed, TensorToWrite* w,
                  TensorToWrite* scale) {
  Rng rng(seed, t.name);
  const int64_t n = Numel(t.shape);
  auto no_rule = [&] {
    return absl::InternalError(
        absl::StrCat("no init rule for ", t.name, " (", std::string(DTypeName(t.dtype)), ")"));
  };
  auto need_scale = [&] {
    return scale != nullptr ? absl::OkStatus()
                            : absl::InternalError(absl::StrCat(t.name, " has no .scale partner"));
  };
  switch (t.dtype) {
    case DType::kF8E4M3: {
      RETURN_IF_ERROR(need_scale());
      const int64_t rows = t.shape[0], cols = t.shape[1];
      // The shared expert takes the routed experts' multipliers (as tiny-a does), so its
      // SwiGLU clamp fires and the shared-expert-clamp switch changes results.
      double mult = 1.0;
      if (absl::StrContains(t.name, "shared_experts.")) {
        mult = absl::StrContains(t.name, ".w2.") ? 0.25 : 8.0;
      }
      const std::vector<float> v = Draw(rng, n, 0, mult / std::sqrt(static_cast<double>(cols)));
      w->bytes.resize(n);
      scale->bytes.resize(Numel(scale->shape));
      QuantizeFp8Blocks(v.data(), rows, cols, w->bytes.data(), scale->bytes.data());
      return absl::OkStatus();
    }
    case DType::kI8: {
      RETURN_IF_ERROR(need_scale());
      const int64_t rows = t.shape[0], cols = 2 * t.shape[1];
      const double mult = absl::StrContains(t.name, ".w2.") ? 0.25 : 8.0;
      const std::vector<float> v =
          Draw(rng, rows * cols, 0, mult / std::sqrt(static_cast<double>(cols)));
      w->bytes.resize(n);
      scale->bytes.resize(Numel(scale->shape));
      QuantizeMxfp4(v.data(), rows, cols, w->bytes.data(), scale->bytes.data());
      return absl::OkStatus();
    }
    case DType::kBF16: {
      if (t.name == "embed.weight") {
        w->bytes = ToBf16Bytes(Draw(rng, n, 0, 1.0));
      } else if (absl::EndsWith(t.name, "norm.weight")) {
        w->bytes = ToBf16Bytes(Draw(rng, n, 1.0, 0.1));
      } else if (t.shape.size() == 2) {  // head (fan_in = dim) and the other BF16 matrices
        w->bytes = ToBf16Bytes(Draw(rng, n, 0, 1.0 / std::sqrt(static_cast<double>(t.shape[1]))));
      } else {
        return no_rule();
      }
      return absl::OkStatus();
    }
    case DType::kF32: {
      std::vector<float> v;
      if (!F32Values(t.name, n, rng, &v)) return no_rule();
      w->bytes = Bytes(v);
      return absl::OkStatus();
    }
    case DType::kI64: {
      if (!absl::EndsWith(t.name, "gate.tid2eid") || t.shape.size() != 2) return no_rule();
      const int64_t rows = t.shape[0], k = t.shape[1], experts = cfg.n_routed_experts;
      if (k > experts) return absl::InternalError(absl::StrCat(t.name, ": k > n_routed"));
      std::vector<int64_t> ids(n), perm(experts);
      for (int64_t r = 0; r < rows; ++r) {
        std::iota(perm.begin(), perm.end(), 0);
        for (int64_t j = 0; j < k; ++j) {  // partial Fisher-Yates: the first k are the row
          std::swap(perm[j], perm[j + rng.Below(experts - j)]);
          ids[r * k + j] = perm[j];
        }
      }
      w->bytes = Bytes(ids);
      return absl::OkStatus();
    }
    default:
      return no_rule();
  }
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f) return absl::InternalError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

absl::Status ClearModelFiles(const std::filesystem::path& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (absl::StartsWith(name, "model") &&
        (absl::EndsWith(name, ".safetensors") || name == "model.safetensors.index.json")) {
      std::filesystem::remove(e.path(), ec);
      if (ec) return absl::InternalError(absl::StrCat(e.path().string(), ": ", ec.message()));
    }
  }
  if (ec) return absl::InternalError(absl::StrCat(dir.string(), ": ", ec.message()));
  return absl::OkStatus();
}

}  // namespace

void QuantizeFp8Blocks(const float* w, int64_t rows, int64_t cols, uint8_t* codes,
                       uint8_t* scales) {
  const int64_t sb_cols = (cols + kFp8Block - 1) / kFp8Block;
  for (int64_t br = 0; br < rows; br += kFp8Block) {
    for (int64_t bc = 0; bc < cols; bc += kFp8Block) {
      const int64_t r1 = std::min(rows, br + kFp8Block), c1 = std::min(cols, bc + kFp8Block);
      float amax = 0;
      for (int64_t r = br; r < r1; ++r) {
        for (int64_t c = bc; c < c1; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
      }
      const float s = Pow2Scale(amax, 0.0f, kE4m3Max);
      scales[(br / kFp8Block) * sb_cols + bc / kFp8Block] = Ue8m0FromPow2(s);
      for (int64_t r = br; r < r1; ++r) {
        for (int64_t c = bc; c < c1; ++c) codes[r * cols + c] = FloatToE4m3(w[r * cols + c] / s);
      }
    }
  }
}

void QuantizeMxfp4(const float* w, int64_t rows, int64_t cols, uint8_t* packed, uint8_t* scales) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < cols; g += kFp4Group) {
      const float* x = w + r * cols + g;
      float amax = 0;
      for (int64_t j = 0; j < kFp4Group; ++j) amax = std::max(amax, std::fabs(x[j]));
      const float s = Pow2Scale(amax, 0.0f, kE2m1Max);
      scales[r * (cols / kFp4Group) + g / kFp4Group] = Ue8m0FromPow2(s);
      uint8_t* out = packed + (r * cols + g) / 2;
      for (int64_t j = 0; j < kFp4Group; j += 2) {
        out[j / 2] = static_cast<uint8_t>(FloatToE2m1(x[j] / s) | (FloatToE2m1(x[j + 1] / s) << 4));
      }
    }
  }
}

absl::Status GenerateCheckpoint(const ModelConfig& cfg, const std::string& config_json_text,
                                const std::string& out_dir, uint64_t seed, int shards) {
  const std::vector<ExpectedTensor> expected = ExpectedTensors(cfg);
  if (shards < 1 || static_cast<size_t>(shards) > expected.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shards ", shards, " must be in [1, ", expected.size(), "]"));
  }

  std::vector<TensorToWrite> all(expected.size());
  std::map<std::string, size_t> pos;
  for (size_t i = 0; i < expected.size(); ++i) {
    all[i] = {expected[i].name, expected[i].dtype, expected[i].shape, {}};
    pos[expected[i].name] = i;
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    const ExpectedTensor& t = expected[i];
    if (t.dtype == DType::kF8E8M0) continue;  // written together with its weight
    TensorToWrite* scale = nullptr;
    if (absl::EndsWith(t.name, ".weight")) {
      auto it = pos.find(t.name.substr(0, t.name.size() - 6) + "scale");
      if (it != pos.end()) scale = &all[it->second];
    }
    RETURN_IF_ERROR(Fill(cfg, t, seed, &all[i], scale));
  }
  uint64_t total = 0;
  for (const TensorToWrite& t : all) {
    if (t.bytes.size() != static_cast<size_t>(Numel(t.shape)) * DTypeSize(t.dtype)) {
      return absl::InternalError(absl::StrCat(t.name, " was not generated"));
    }
    total += t.bytes.size();
  }

  const std::filesystem::path dir(out_dir);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(out_dir, ": ", ec.message()));
  RETURN_IF_ERROR(ClearModelFiles(dir));
  RETURN_IF_ERROR(WriteText((dir / "config.json").string(), config_json_text));

  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  if (shards == 1) return WriteSafetensors((dir / "model.safetensors").string(), all, meta);

  nlohmann::json weight_map = nlohmann::json::object();
  for (int s = 0; s < shards; ++s) {
    const size_t b = all.size() * s / shards, e = all.size() * (s + 1) / shards;
    const std::string file = absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, shards);
    std::vector<TensorToWrite> group(std::make_move_iterator(all.begin() + b),
                                     std::make_move_iterator(all.begin() + e));
    for (const TensorToWrite& t : group) weight_map[t.name] = file;
    RETURN_IF_ERROR(WriteSafetensors((dir / file).string(), group, meta));
  }
  const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  return WriteText((dir / "model.safetensors.index.json").string(), index.dump(2) + "\n");
}

}  // namespace ss
