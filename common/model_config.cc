#include "common/model_config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace ss {
namespace {

using nlohmann::json;

// Sizes above this are not plausible and would let the products below overflow int64.
constexpr int64_t kMaxSize = (int64_t{1} << 31) - 1;

// Reads typed fields of one JSON object; every error names the field.
class Fields {
 public:
  Fields(const json& obj, std::string label, std::string prefix = "")
      : obj_(obj), label_(std::move(label)), prefix_(std::move(prefix)) {}

  absl::Status Error(std::string_view field, std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(label_, ": field '", prefix_, absl::string_view(field.data(), field.size()),
                     "' ", absl::string_view(what.data(), what.size())));
  }
  const json* Find(const char* field) const {
    auto it = obj_.find(field);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }
  absl::StatusOr<const json*> Require(const char* field) const {
    const json* v = Find(field);
    if (v == nullptr) return Error(field, "is missing");
    return v;
  }

  absl::StatusOr<int64_t> Int(const char* field, int64_t min, int64_t max = kMaxSize) const {
    ASSIGN_OR_RETURN(const json* v, Require(field));
    return ToInt(field, *v, min, max);
  }
  absl::StatusOr<int64_t> IntOr(const char* field, int64_t dflt, int64_t min,
                                int64_t max = kMaxSize) const {
    const json* v = Find(field);
    return v == nullptr ? dflt : ToInt(field, *v, min, max);
  }
  absl::StatusOr<int64_t> ToInt(std::string_view field, const json& v, int64_t min,
                                int64_t max) const {
    if (!v.is_number_integer()) {
      return Error(field, absl::StrCat("must be an integer, got ", v.dump()));
    }
    // Non-negative JSON integers are stored unsigned and may exceed int64.
    const bool fits = !v.is_number_unsigned() || v.get<uint64_t>() <= static_cast<uint64_t>(max);
    const int64_t x = fits ? v.get<int64_t>() : max;
    if (!fits || x < min || x > max) {
      return Error(field, absl::StrCat("= ", v.dump(), " must be in [", min, ", ", max, "]"));
    }
    return x;
  }

  // A finite number > 0 (or >= 0 when `allow_zero`).
  absl::StatusOr<double> Num(const char* field, bool allow_zero = false) const {
    ASSIGN_OR_RETURN(const json* v, Require(field));
    return ToNum(field, *v, allow_zero);
  }
  absl::StatusOr<double> NumOr(const char* field, double dflt, bool allow_zero = false) const {
    const json* v = Find(field);
    return v == nullptr ? dflt : ToNum(field, *v, allow_zero);
  }
  absl::StatusOr<double> ToNum(const char* field, const json& v, bool allow_zero) const {
    if (!v.is_number()) return Error(field, absl::StrCat("must be a number, got ", v.dump()));
    const double x = v.get<double>();
    if (!std::isfinite(x) || x < 0 || (x == 0 && !allow_zero)) {
      return Error(field,
                   absl::StrCat("= ", v.dump(), allow_zero ? " must be >= 0" : " must be > 0"));
    }
    return x;
  }

  absl::StatusOr<std::string> Str(const char* field) const {
    ASSIGN_OR_RETURN(const json* v, Require(field));
    if (!v->is_string()) return Error(field, absl::StrCat("must be a string, got ", v->dump()));
    return v->get<std::string>();
  }
  // A string field that must equal `want`; it may be absent unless `required`.
  absl::Status StrIs(const char* field, const std::string& want, bool required) const {
    if (!required && Find(field) == nullptr) return absl::OkStatus();
    ASSIGN_OR_RETURN(std::string s, Str(field));
    if (s != want) return Error(field, absl::StrCat("= \"", s, "\" must be \"", want, "\""));
    return absl::OkStatus();
  }

 private:
  const json& obj_;
  std::string label_;
  std::string prefix_;
};

bool IsPowerOfTwo(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

absl::Status ParseQuantization(const Fields& top, const json& q, const std::string& label) {
  if (!q.is_object()) return top.Error("quantization_config", "must be an object");
  Fields f(q, label, "quantization_config.");
  RETURN_IF_ERROR(f.StrIs("quant_method", "fp8", true));
  RETURN_IF_ERROR(f.StrIs("fmt", "e4m3", true));
  RETURN_IF_ERROR(f.StrIs("scale_fmt", "ue8m0", true));
  ASSIGN_OR_RETURN(const json* block, f.Require("weight_block_size"));
  if (*block != json::array({128, 128})) {
    return f.Error("weight_block_size", absl::StrCat("= ", block->dump(), " must be [128, 128]"));
  }
  return absl::OkStatus();
}

absl::Status ParseRopeScaling(const Fields& top, const json& r, const std::string& label,
                              ModelConfig* c) {
  if (!r.is_object()) return top.Error("rope_scaling", "must be an object");
  Fields f(r, label, "rope_scaling.");
  const char* type_field = f.Find("type") != nullptr ? "type" : "rope_type";
  ASSIGN_OR_RETURN(std::string type, f.Str(type_field));
  if (type != "yarn") {
    return f.Error(type_field, absl::StrCat("= \"", type, "\" is not supported (only \"yarn\")"));
  }
  c->has_yarn = true;
  ASSIGN_OR_RETURN(c->yarn.factor, f.Num("factor"));
  ASSIGN_OR_RETURN(c->yarn.original_seq_len, f.Int("original_max_position_embeddings", 1));
  ASSIGN_OR_RETURN(c->yarn.beta_fast, f.Num("beta_fast"));
  ASSIGN_OR_RETURN(c->yarn.beta_slow, f.Num("beta_slow"));
  return absl::OkStatus();
}

absl::Status MultipleOf128(const Fields& f, const char* field, std::string_view expr, int64_t v,
                           std::string_view why) {
  if (v % 128 == 0) return absl::OkStatus();
  return f.Error(field, absl::StrCat(absl::string_view(expr.data(), expr.size()),
                                     expr.empty() ? "= " : " = ", v, " must be a multiple of 128 (",
                                     absl::string_view(why.data(), why.size()), ")"));
}

// The spec §9.2 constraints that the kernels assert.
absl::Status CheckShapes(const Fields& f, const ModelConfig& c) {
  constexpr std::string_view kK = "FP8 GEMM K dimension";
  RETURN_IF_ERROR(MultipleOf128(f, "hidden_size", "", c.dim, kK));
  RETURN_IF_ERROR(MultipleOf128(f, "q_lora_rank", "", c.q_lora_rank, kK));
  RETURN_IF_ERROR(
      MultipleOf128(f, "o_lora_rank", "o_groups * o_lora_rank", c.o_groups * c.o_lora_rank, kK));
  RETURN_IF_ERROR(MultipleOf128(f, "moe_intermediate_size", "", c.moe_inter_dim, kK));
  if (c.n_heads % c.o_groups != 0) {
    return f.Error("o_groups", absl::StrCat("= ", c.o_groups,
                                            " must divide num_attention_heads = ", c.n_heads));
  }
  RETURN_IF_ERROR(MultipleOf128(f, "o_groups", "num_attention_heads * head_dim / o_groups",
                                c.n_heads * c.head_dim / c.o_groups, "wo_a 128x128 blocks"));
  const int64_t nope = c.head_dim - c.rope_head_dim;
  if (nope <= 0 || nope % 64 != 0) {
    return f.Error("qk_rope_head_dim",
                   absl::StrCat("head_dim - qk_rope_head_dim = ", nope,
                                " must be a positive multiple of 64 (FP8 simulation blocks)"));
  }
  if (c.rope_head_dim % 2 != 0) {
    return f.Error("qk_rope_head_dim", absl::StrCat("= ", c.rope_head_dim, " must be even"));
  }
  if (!IsPowerOfTwo(c.index_head_dim) || c.index_head_dim % 32 != 0 ||
      c.index_head_dim < c.rope_head_dim) {
    return f.Error("index_head_dim",
                   absl::StrCat("= ", c.index_head_dim,
                                " must be a power of two, a multiple of 32 (FP4 simulation) and "
                                ">= qk_rope_head_dim = ",
                                c.rope_head_dim));
  }
  if (c.n_activated_experts > c.n_routed_experts) {
    return f.Error("num_experts_per_tok",
                   absl::StrCat("= ", c.n_activated_experts,
                                " must be <= n_routed_experts = ", c.n_routed_experts));
  }
  if (c.n_hash_layers > c.n_layers) {
    return f.Error("num_hash_layers", absl::StrCat("= ", c.n_hash_layers,
                                                   " must be <= num_hidden_layers = ", c.n_layers));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& label) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(label, ": malformed JSON"));
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": not a JSON object"));
  }
  Fields f(j, label);
  ModelConfig c;

  RETURN_IF_ERROR(f.StrIs("model_type", "deepseek_v4", true));
  if (const json* a = f.Find("architectures")) {
    if (!a->is_array() || *a != json::array({"DeepseekV4ForCausalLM"})) {
      return f.Error("architectures",
                     absl::StrCat("= ", a->dump(), " must be [\"DeepseekV4ForCausalLM\"]"));
    }
  }
  RETURN_IF_ERROR(f.StrIs("scoring_func", "sqrtsoftplus", true));
  RETURN_IF_ERROR(f.StrIs("hidden_act", "silu", false));
  RETURN_IF_ERROR(f.StrIs("expert_dtype", "fp4", false));
  if (const json* q = f.Find("quantization_config")) {
    RETURN_IF_ERROR(ParseQuantization(f, *q, label));
  }

  ASSIGN_OR_RETURN(c.vocab_size, f.Int("vocab_size", 1));
  ASSIGN_OR_RETURN(c.dim, f.Int("hidden_size", 1));
  ASSIGN_OR_RETURN(c.n_layers, f.Int("num_hidden_layers", 1));
  ASSIGN_OR_RETURN(c.n_heads, f.Int("num_attention_heads", 1));
  ASSIGN_OR_RETURN(c.head_dim, f.Int("head_dim", 1));
  ASSIGN_OR_RETURN(c.rope_head_dim, f.Int("qk_rope_head_dim", 1));
  ASSIGN_OR_RETURN(c.q_lora_rank, f.Int("q_lora_rank", 1));
  ASSIGN_OR_RETURN(c.o_groups, f.Int("o_groups", 1));
  ASSIGN_OR_RETURN(c.o_lora_rank, f.Int("o_lora_rank", 1));
  ASSIGN_OR_RETURN(c.window_size, f.Int("sliding_window", 1));
  ASSIGN_OR_RETURN(c.max_position_embeddings, f.Int("max_position_embeddings", 1));
  ASSIGN_OR_RETURN(c.index_n_heads, f.Int("index_n_heads", 1));
  ASSIGN_OR_RETURN(c.index_head_dim, f.Int("index_head_dim", 1));
  ASSIGN_OR_RETURN(c.index_topk, f.Int("index_topk", 1));
  ASSIGN_OR_RETURN(c.n_routed_experts, f.Int("n_routed_experts", 1));
  ASSIGN_OR_RETURN(c.n_shared_experts, f.Int("n_shared_experts", 1, 1));
  ASSIGN_OR_RETURN(c.n_activated_experts, f.Int("num_experts_per_tok", 1));
  ASSIGN_OR_RETURN(c.moe_inter_dim, f.Int("moe_intermediate_size", 1));
  ASSIGN_OR_RETURN(c.n_hash_layers, f.Int("num_hash_layers", 0));
  ASSIGN_OR_RETURN(c.hc_mult, f.Int("hc_mult", 1));
  ASSIGN_OR_RETURN(c.hc_sinkhorn_iters, f.Int("hc_sinkhorn_iters", 1));
  ASSIGN_OR_RETURN(c.n_mtp_layers, f.IntOr("num_nextn_predict_layers", 0, 0));
  ASSIGN_OR_RETURN(c.bos_token_id, f.IntOr("bos_token_id", c.bos_token_id, 0, INT64_MAX));
  ASSIGN_OR_RETURN(c.eos_token_id, f.IntOr("eos_token_id", c.eos_token_id, 0, INT64_MAX));
  RETURN_IF_ERROR(f.IntOr("num_key_value_heads", 1, 1, 1).status());

  ASSIGN_OR_RETURN(c.rope_theta, f.Num("rope_theta"));
  ASSIGN_OR_RETURN(c.compress_rope_theta, f.Num("compress_rope_theta"));
  if (const json* r = f.Find("rope_scaling")) RETURN_IF_ERROR(ParseRopeScaling(f, *r, label, &c));
  ASSIGN_OR_RETURN(c.hc_eps, f.NumOr("hc_eps", c.hc_eps));
  ASSIGN_OR_RETURN(c.norm_eps, f.NumOr("rms_norm_eps", c.norm_eps));
  ASSIGN_OR_RETURN(c.route_scale, f.NumOr("routed_scaling_factor", c.route_scale));
  ASSIGN_OR_RETURN(c.swiglu_limit, f.NumOr("swiglu_limit", 0.0, /*allow_zero=*/true));

  ASSIGN_OR_RETURN(const json* ratios, f.Require("compress_ratios"));
  if (!ratios->is_array()) return f.Error("compress_ratios", "must be an array");
  if (static_cast<int64_t>(ratios->size()) != c.n_layers + c.n_mtp_layers) {
    return f.Error("compress_ratios", absl::StrCat("has ", ratios->size(),
                                                   " entries, expected num_hidden_layers + "
                                                   "num_nextn_predict_layers = ",
                                                   c.n_layers + c.n_mtp_layers));
  }
  for (size_t i = 0; i < ratios->size(); ++i) {
    const std::string name = absl::StrCat("compress_ratios[", i, "]");
    ASSIGN_OR_RETURN(int64_t m, f.ToInt(name, (*ratios)[i], 0, 128));
    const bool mtp = static_cast<int64_t>(i) >= c.n_layers;
    if (mtp ? m != 0 : (m != 0 && m != 4 && m != 128)) {
      return f.Error(name, absl::StrCat("= ", m,
                                        mtp ? " must be 0 (MTP blocks are SWA-only)"
                                            : " must be 0, 4 or 128"));
    }
    c.compress_ratios.push_back(m);
  }

  RETURN_IF_ERROR(CheckShapes(f, c));
  return c;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream s;
  s << in.rdbuf();
  return ParseModelConfig(s.str(), path);
}

}  // namespace ss
