#include "common/model/weights.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/bf16.h"
#include "common/checkpoint_schema.h"
#include "common/status.h"

namespace ss::model {
namespace {

// Looks tensors up after ValidateCheckpoint has checked names, dtypes and shapes; a lookup that
// still fails means the schema and this binder disagree, which is reported, not aborted on.
class Binder {
 public:
  explicit Binder(const Checkpoint& ckpt) : ckpt_(ckpt) {}
  absl::Status status() const { return status_; }
  // The checkpoint's source, for messages: the file holding embed.weight.
  std::string label() const {
    const TensorView* v = ckpt_.Find("embed.weight");
    return v != nullptr ? v->file : std::string("checkpoint");
  }

  const TensorView* View(const std::string& name, DType dtype) {
    auto v = ckpt_.GetAnyShape(name, dtype);
    if (!v.ok()) {
      if (status_.ok()) status_ = v.status();
      return nullptr;
    }
    return *v;
  }
  std::vector<float> F32(const std::string& name) {
    std::vector<float> out;
    if (const TensorView* v = View(name, DType::kF32)) {
      out.resize(v->numel());
      std::memcpy(out.data(), v->data, v->nbytes);
    }
    return out;
  }
  std::vector<float> Bf16Vec(const std::string& name) {
    std::vector<float> out;
    if (const TensorView* v = View(name, DType::kBF16)) {
      out.resize(v->numel());
      for (size_t i = 0; i < out.size(); ++i) {
        uint16_t b;
        std::memcpy(&b, v->data + 2 * i, 2);
        out[i] = Bf16ToFloat(b);
      }
    }
    return out;
  }
  Bf16Matrix Bf16Mat(const std::string& name) {
    Bf16Matrix m;
    if (const TensorView* v = View(name, DType::kBF16)) {
      m.data = v->data;
      m.rows = v->shape.at(0);
      m.cols = v->shape.size() > 1 ? v->shape[1] : 1;
    }
    return m;
  }
  Fp8Weight Fp8(const std::string& prefix) {
    Fp8Weight w;
    const TensorView* v = View(prefix + ".weight", DType::kF8E4M3);
    const TensorView* s = View(prefix + ".scale", DType::kF8E8M0);
    if (v && s) {
      w.w = v->data;
      w.s = s->data;
      w.out = v->shape[0];
      w.in = v->shape[1];
    }
    return w;
  }
  Fp4Weight Fp4(const std::string& prefix) {
    Fp4Weight w;
    const TensorView* v = View(prefix + ".weight", DType::kI8);
    const TensorView* s = View(prefix + ".scale", DType::kF8E8M0);
    if (v && s) {
      w.w = v->data;
      w.s = s->data;
      w.out = v->shape[0];
      w.in = v->shape[1] * 2;
    }
    return w;
  }
  HcWeights Hc(const std::string& prefix) {
    return HcWeights{F32(prefix + "_fn"), F32(prefix + "_base"), F32(prefix + "_scale")};
  }
  CompressorWeights Compressor(const std::string& prefix, int64_t ratio, int64_t head_dim) {
    CompressorWeights c;
    c.ratio = ratio;
    c.head_dim = head_dim;
    c.ape = F32(prefix + ".ape");
    c.wkv = Bf16Mat(prefix + ".wkv.weight");
    c.wgate = Bf16Mat(prefix + ".wgate.weight");
    c.norm = Bf16Vec(prefix + ".norm.weight");
    return c;
  }

 private:
  const Checkpoint& ckpt_;
  absl::Status status_;
};

BlockWeights BindBlock(Binder& b, const ModelConfig& c, const std::string& p, int64_t ratio,
                       bool hash) {
  BlockWeights w;
  w.attn_norm = b.Bf16Vec(p + "attn_norm.weight");
  w.ffn_norm = b.Bf16Vec(p + "ffn_norm.weight");
  w.hc_attn = b.Hc(p + "hc_attn");
  w.hc_ffn = b.Hc(p + "hc_ffn");
  AttentionWeights& a = w.attn;
  a.ratio = ratio;
  a.attn_sink = b.F32(p + "attn.attn_sink");
  a.wq_a = b.Fp8(p + "attn.wq_a");
  a.wq_b = b.Fp8(p + "attn.wq_b");
  a.wkv = b.Fp8(p + "attn.wkv");
  a.wo_a = b.Fp8(p + "attn.wo_a");
  a.wo_b = b.Fp8(p + "attn.wo_b");
  a.q_norm = b.Bf16Vec(p + "attn.q_norm.weight");
  a.kv_norm = b.Bf16Vec(p + "attn.kv_norm.weight");
  if (ratio > 0) {
    a.has_compressor = true;
    a.compressor = b.Compressor(p + "attn.compressor", ratio, c.head_dim);
  }
  if (ratio == 4) {
    a.has_indexer = true;
    a.indexer.wq_b = b.Fp8(p + "attn.indexer.wq_b");
    a.indexer.weights_proj = b.Bf16Mat(p + "attn.indexer.weights_proj.weight");
    a.indexer.compressor = b.Compressor(p + "attn.indexer.compressor", ratio, c.index_head_dim);
  }
  MoeWeights& m = w.moe;
  m.gate = b.Bf16Mat(p + "ffn.gate.weight");
  m.hash = hash;
  if (hash) {
    if (const TensorView* v = b.View(p + "ffn.gate.tid2eid", DType::kI64)) {
      m.tid2eid.resize(v->numel());
      for (size_t i = 0; i < m.tid2eid.size(); ++i) {
        int64_t e;
        std::memcpy(&e, v->data + 8 * i, 8);
        m.tid2eid[i] = static_cast<int32_t>(e);
      }
    }
  } else {
    m.bias = b.F32(p + "ffn.gate.bias");
  }
  m.experts.resize(c.n_routed_experts);
  for (int64_t e = 0; e < c.n_routed_experts; ++e) {
    const std::string ep = absl::StrCat(p, "ffn.experts.", e, ".");
    m.experts[e] = {b.Fp4(ep + "w1"), b.Fp4(ep + "w2"), b.Fp4(ep + "w3")};
  }
  m.shared_w1 = b.Fp8(p + "ffn.shared_experts.w1");
  m.shared_w2 = b.Fp8(p + "ffn.shared_experts.w2");
  m.shared_w3 = b.Fp8(p + "ffn.shared_experts.w3");
  return w;
}

absl::Status CheckTid2eid(const MoeWeights& m, const ModelConfig& c, const std::string& name) {
  for (size_t i = 0; i < m.tid2eid.size(); ++i) {
    if (m.tid2eid[i] < 0 || m.tid2eid[i] >= c.n_routed_experts) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": entry ", i, " = ", m.tid2eid[i],
                                                     " is not an expert id in [0, ",
                                                     c.n_routed_experts, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModelWeights(const std::string& dir) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(dir));
  return BindModelWeights(std::move(config), std::move(ckpt));
}

absl::StatusOr<std::unique_ptr<ModelWeights>> BindModelWeights(
    ModelConfig config, std::unique_ptr<Checkpoint> checkpoint) {
  auto w = std::make_unique<ModelWeights>();
  w->config = std::move(config);
  w->checkpoint = std::move(checkpoint);
  RETURN_IF_ERROR(ValidateCheckpoint(*w->checkpoint, w->config, nullptr));
  const ModelConfig& c = w->config;
  Binder b(*w->checkpoint);
  w->embed = b.Bf16Mat("embed.weight");
  w->head = b.Bf16Mat("head.weight");
  w->norm = b.Bf16Vec("norm.weight");
  w->hc_head = b.Hc("hc_head");
  for (int64_t l = 0; l < c.n_layers; ++l) {
    w->blocks.push_back(
        BindBlock(b, c, absl::StrCat("layers.", l, "."), c.compress_ratio(l), l < c.n_hash_layers));
    RETURN_IF_ERROR(CheckTid2eid(w->blocks.back().moe, c,
                                 absl::StrCat(b.label(), ": layers.", l, ".ffn.gate.tid2eid")));
  }
  for (int64_t k = 0; k < c.n_mtp_layers; ++k) {
    const std::string p = absl::StrCat("mtp.", k, ".");
    MtpWeights m;
    m.block = BindBlock(b, c, p, c.mtp_compress_ratio(k), /*hash=*/false);
    m.e_proj = b.Fp8(p + "e_proj");
    m.h_proj = b.Fp8(p + "h_proj");
    m.enorm = b.Bf16Vec(p + "enorm.weight");
    m.hnorm = b.Bf16Vec(p + "hnorm.weight");
    m.norm = b.Bf16Vec(p + "norm.weight");
    m.hc_head = b.Hc(p + "hc_head");
    w->mtp.push_back(std::move(m));
  }
  RETURN_IF_ERROR(b.status());
  return w;
}

}  // namespace ss::model
