#include "common/checkpoint_schema.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/int_math.h"
#include "spdlog/spdlog.h"

namespace ss {
namespace {

class Schema {
 public:
  explicit Schema(const ModelConfig& c) : c_(c) {}

  void Add(std::string name, DType dtype, std::vector<int64_t> shape) {
    out_.push_back({std::move(name), dtype, std::move(shape)});
  }
  void Fp8Linear(const std::string& p, int64_t out, int64_t in) {
    Add(p + ".weight", DType::kF8E4M3, {out, in});
    Add(p + ".scale", DType::kF8E8M0, {CeilDiv(out, 128), CeilDiv(in, 128)});
  }
  void Fp4Linear(const std::string& p, int64_t out, int64_t in) {
    Add(p + ".weight", DType::kI8, {out, in / 2});
    Add(p + ".scale", DType::kF8E8M0, {out, in / 32});
  }
  void Compressor(const std::string& p, int64_t ratio, int64_t head_dim) {
    const int64_t rows = (ratio == 4 ? 2 : 1) * head_dim;  // ratio 4 compresses overlapping blocks
    Add(p + ".ape", DType::kF32, {ratio, rows});
    Add(p + ".wkv.weight", DType::kBF16, {rows, c_.dim});
    Add(p + ".wgate.weight", DType::kBF16, {rows, c_.dim});
    Add(p + ".norm.weight", DType::kBF16, {head_dim});
  }
  void HcHead(const std::string& p) {
    Add(p + "hc_head_fn", DType::kF32, {c_.hc_mult, c_.hc_mult * c_.dim});
    Add(p + "hc_head_base", DType::kF32, {c_.hc_mult});
    Add(p + "hc_head_scale", DType::kF32, {1});
  }

  // One decoder block under prefix `p` ("layers.3." or "mtp.0.").
  void Block(const std::string& p, int64_t ratio, bool hash_routed) {
    const int64_t d = c_.dim;
    Add(p + "attn_norm.weight", DType::kBF16, {d});
    Add(p + "ffn_norm.weight", DType::kBF16, {d});
    for (const char* hc : {"hc_attn", "hc_ffn"}) {
      Add(absl::StrCat(p, hc, "_fn"), DType::kF32, {c_.mix_hc(), c_.hc_mult * d});
      Add(absl::StrCat(p, hc, "_base"), DType::kF32, {c_.mix_hc()});
      Add(absl::StrCat(p, hc, "_scale"), DType::kF32, {3});
    }

    const std::string a = p + "attn.";
    Add(a + "attn_sink", DType::kF32, {c_.n_heads});
    Fp8Linear(a + "wq_a", c_.q_lora_rank, d);
    Add(a + "q_norm.weight", DType::kBF16, {c_.q_lora_rank});
    Fp8Linear(a + "wq_b", c_.n_heads * c_.head_dim, c_.q_lora_rank);
    Fp8Linear(a + "wkv", c_.head_dim, d);
    Add(a + "kv_norm.weight", DType::kBF16, {c_.head_dim});
    Fp8Linear(a + "wo_a", c_.o_groups * c_.o_lora_rank, c_.n_heads * c_.head_dim / c_.o_groups);
    Fp8Linear(a + "wo_b", d, c_.o_groups * c_.o_lora_rank);
    if (ratio > 0) Compressor(a + "compressor", ratio, c_.head_dim);
    if (ratio == 4) {
      Fp8Linear(a + "indexer.wq_b", c_.index_n_heads * c_.index_head_dim, c_.q_lora_rank);
      Add(a + "indexer.weights_proj.weight", DType::kBF16, {c_.index_n_heads, d});
      Compressor(a + "indexer.compressor", ratio, c_.index_head_dim);
    }

    const std::string f = p + "ffn.";
    Add(f + "gate.weight", DType::kBF16, {c_.n_routed_experts, d});
    if (hash_routed) {
      Add(f + "gate.tid2eid", DType::kI64, {c_.vocab_size, c_.n_activated_experts});
    } else {
      Add(f + "gate.bias", DType::kF32, {c_.n_routed_experts});
    }
    for (int64_t e = 0; e < c_.n_routed_experts; ++e) {
      const std::string x = absl::StrCat(f, "experts.", e, ".");
      Fp4Linear(x + "w1", c_.moe_inter_dim, d);
      Fp4Linear(x + "w2", d, c_.moe_inter_dim);
      Fp4Linear(x + "w3", c_.moe_inter_dim, d);
    }
    // ParseModelConfig enforces n_shared_experts == 1, so the shared expert is moe_inter_dim wide.
    Fp8Linear(f + "shared_experts.w1", c_.moe_inter_dim, d);
    Fp8Linear(f + "shared_experts.w2", d, c_.moe_inter_dim);
    Fp8Linear(f + "shared_experts.w3", c_.moe_inter_dim, d);
  }

  std::vector<ExpectedTensor> Build() && {
    const int64_t d = c_.dim;
    Add("embed.weight", DType::kBF16, {c_.vocab_size, d});
    Add("head.weight", DType::kBF16, {c_.vocab_size, d});
    Add("norm.weight", DType::kBF16, {d});
    HcHead("");
    for (int64_t l = 0; l < c_.n_layers; ++l) {
      Block(absl::StrCat("layers.", l, "."), c_.compress_ratio(l), l < c_.n_hash_layers);
    }
    for (int64_t k = 0; k < c_.n_mtp_layers; ++k) {
      const std::string p = absl::StrCat("mtp.", k, ".");
      Block(p, c_.mtp_compress_ratio(k), /*hash_routed=*/false);
      Fp8Linear(p + "e_proj", d, d);
      Fp8Linear(p + "h_proj", d, d);
      Add(p + "enorm.weight", DType::kBF16, {d});
      Add(p + "hnorm.weight", DType::kBF16, {d});
      Add(p + "norm.weight", DType::kBF16, {d});
      HcHead(p);
    }
    return std::move(out_);
  }

 private:
  const ModelConfig& c_;
  std::vector<ExpectedTensor> out_;
};

}  // namespace

std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& c) { return Schema(c).Build(); }

absl::Status ValidateCheckpoint(const Checkpoint& ckpt, const ModelConfig& c,
                                std::vector<std::string>* unexpected) {
  std::set<std::string> expected;
  for (const ExpectedTensor& t : ExpectedTensors(c)) {
    absl::StatusOr<const TensorView*> v = ckpt.Get(t.name, t.dtype, t.shape);
    if (absl::IsNotFound(v.status())) {
      return absl::NotFoundError(
          absl::StrCat(v.status().message(), " (expected ",
                       absl::string_view(DTypeName(t.dtype).data(), DTypeName(t.dtype).size()),
                       " [", absl::StrJoin(t.shape, ", "), "])"));
    }
    if (!v.ok()) return v.status();
    expected.insert(t.name);
  }
  std::vector<std::string> extra;
  for (const auto& [name, view] : ckpt.tensors()) {
    if (!expected.contains(name)) extra.push_back(name);
  }
  if (!extra.empty()) {
    constexpr size_t kShown = 10;
    spdlog::warn("checkpoint holds {} tensor(s) the schema does not use: {}{}", extra.size(),
                 absl::StrJoin(extra.begin(), extra.begin() + std::min(extra.size(), kShown), ", "),
                 extra.size() > kShown ? ", ..." : "");
    if (unexpected != nullptr) unexpected->insert(unexpected->end(), extra.begin(), extra.end());
  }
  return absl::OkStatus();
}

}  // namespace ss
