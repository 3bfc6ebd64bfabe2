#include "tests/tools/golden_writer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/bf16.h"
#include "common/rope.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace ss::golden {
namespace {

using model::BlockTrace;
using model::ChunkRef;
using model::IndexerResult;
using model::Model;
using model::SequenceState;
using Json = nlohmann::ordered_json;

constexpr char kGoldenFile[] = "golden.safetensors";
constexpr char kBlocksFile[] = "golden_blocks.safetensors";
constexpr float kInf = std::numeric_limits<float>::infinity();

template <typename T>
std::vector<uint8_t> Bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// The tensors of both files and the case entries of cases.json. The first inconsistency (a
// shape that does not match the data, a BF16 tensor that is not bf16-exact) is kept as status().
class SetBuilder {
 public:
  enum File { kGolden, kBlocks };

  void F32(Json& c, const std::string& name, std::vector<int64_t> shape,
           const std::vector<float>& v, const std::string& meaning, File f = kGolden) {
    Put(c, name, DType::kF32, std::move(shape), v.size(), Bytes(v), meaning, f);
  }
  void I64(Json& c, const std::string& name, std::vector<int64_t> shape,
           const std::vector<int64_t>& v, const std::string& meaning, File f = kGolden) {
    Put(c, name, DType::kI64, std::move(shape), v.size(), Bytes(v), meaning, f);
  }
  void I32(Json& c, const std::string& name, std::vector<int64_t> shape,
           const std::vector<int32_t>& v, const std::string& meaning, File f = kGolden) {
    Put(c, name, DType::kI32, std::move(shape), v.size(), Bytes(v), meaning, f);
  }
  void Bf16(Json& c, const std::string& name, std::vector<int64_t> shape, const float* v, size_t n,
            const std::string& meaning, File f = kGolden) {
    std::vector<uint16_t> b(n);
    for (size_t i = 0; i < n; ++i) {
      b[i] = FloatToBf16(v[i]);
      if (Bf16ToFloat(b[i]) != v[i] && !std::isnan(v[i]) && status_.ok()) {
        status_ = absl::InternalError(absl::StrFormat(
            "%s: element %d = %.9g is not exactly representable in bf16", name, i, v[i]));
      }
    }
    Put(c, name, DType::kBF16, std::move(shape), n, Bytes(b), meaning, f);
  }

  const absl::Status& status() const { return status_; }
  const std::vector<TensorToWrite>& tensors(File f) const { return files_[f]; }

 private:
  void Put(Json& c, const std::string& name, DType dtype, std::vector<int64_t> shape, size_t n,
           std::vector<uint8_t> bytes, const std::string& meaning, File f) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    if (numel != static_cast<int64_t>(n) && status_.ok()) {
      status_ =
          absl::InternalError(absl::StrCat(name, ": ", n, " values for ", numel, " elements"));
    }
    c["tensors"].push_back({{"name", name},
                            {"dtype", std::string(DTypeName(dtype))},
                            {"shape", shape},
                            {"meaning", meaning},
                            {"file", f == kGolden ? kGoldenFile : kBlocksFile}});
    files_[f].push_back({name, dtype, std::move(shape), std::move(bytes)});
  }

  std::vector<TensorToWrite> files_[2];
  absl::Status status_;
};

std::vector<int64_t> RandomIds(uint64_t seed, int64_t n, int64_t vocab) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> ids(n);
  for (int64_t& id : ids) id = static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab));
  return ids;
}

int64_t Argmax(const std::vector<float>& v) {
  return std::max_element(v.begin(), v.end()) - v.begin();
}

float Top2Margin(const float* v, int64_t n) {
  std::vector<float> s(v, v + n);
  std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<float>());
  return s[0] - s[1];
}

// score(k-th best) - score((k+1)-th best) over the finite scores of one row; +inf when there are
// at most k of them (no real selection).
float BoundaryGap(const float* scores, int64_t n, int64_t k) {
  std::vector<float> s;
  for (int64_t j = 0; j < n; ++j) {
    if (std::isfinite(scores[j])) s.push_back(scores[j]);
  }
  if (static_cast<int64_t>(s.size()) <= k) return kInf;
  std::sort(s.rbegin(), s.rend());
  return s[k - 1] - s[k];
}

// One full-model pass of one sequence over n tokens at positions st.next_pos.., block by block
// exactly as Model::Forward runs it, keeping every block's output streams and trace.
struct Pass {
  std::vector<float> streams;      // [n_layers, n, hc, dim]
  std::vector<BlockTrace> traces;  // per block
  std::vector<float> logits;       // [vocab] at the last position
};

absl::StatusOr<Pass> RunPass(const Model& m, SequenceState& st, const int64_t* ids, int64_t n) {
  const ModelConfig& c = m.config();
  const int64_t hd = c.hc_mult * c.dim;
  const ChunkRef ch{&st, ids, n, st.next_pos};
  RETURN_IF_ERROR(m.ValidateChunks({&ch, 1}));
  Pass p;
  p.streams.resize(c.n_layers * n * hd);
  p.traces.resize(c.n_layers);
  std::vector<float> embed(n * hd);
  m.EmbedStreams(ids, n, embed.data());
  const float* in = embed.data();
  for (int64_t l = 0; l < c.n_layers; ++l) {
    float* out = p.streams.data() + l * n * hd;
    m.RunBlock(l, {&ch, 1}, in, out, &p.traces[l]);
    in = out;
  }
  p.logits.resize(c.vocab_size);
  m.Logits(in + (n - 1) * hd, p.logits.data());
  st.next_pos += n;
  return p;
}

absl::StatusOr<std::vector<float>> PrefillLogits(const Model& m, const std::vector<int64_t>& ids) {
  SequenceState st = m.NewSequence();
  const ChunkRef ch{&st, ids.data(), static_cast<int64_t>(ids.size()), 0};
  ASSIGN_OR_RETURN(std::vector<std::vector<float>> r, m.Forward({&ch, 1}));
  return std::move(r[0]);
}

std::vector<int64_t> Prefix(const std::vector<int64_t>& v, int64_t n) {
  return std::vector<int64_t>(v.begin(), v.begin() + n);
}

std::vector<int64_t> CsaLayers(const ModelConfig& c) {
  std::vector<int64_t> out;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (c.compress_ratio(l) == 4) out.push_back(l);
  }
  return out;
}

class Writer {
 public:
  Writer(const Model& m, uint64_t seed)
      : m_(m), c_(m.config()), plan_(PlanGoldenSet(c_)), seed_(seed), hd_(c_.hc_mult * c_.dim) {
    int64_t master_len = std::max(plan_.inter_len, plan_.blocks_len);
    for (int64_t n : plan_.prefill_lens) master_len = std::max(master_len, n);
    master_ = RandomIds(seed, master_len, c_.vocab_size);
  }

  absl::Status Build() {
    RETURN_IF_ERROR(Prefills());
    RETURN_IF_ERROR(Long());
    Rope();
    RETURN_IF_ERROR(Batch2());
    RETURN_IF_ERROR(PerBlockSet("intermediates", "inter", plan_.inter_len, SetBuilder::kGolden));
    RETURN_IF_ERROR(PerBlockSet("blocks160", "blocks160", plan_.blocks_len, SetBuilder::kBlocks));
    RETURN_IF_ERROR(Mtp());
    RETURN_IF_ERROR(Variants());
    return b_.status();
  }

  Json CasesJson(const std::string& config_name) const {
    Json j;
    j["format_version"] = 1;
    j["config_name"] = config_name;
    j["generator"] =
        "tests/tools/golden_writer: self-generated by the splitserve reference model "
        "(common/model), NOT the official demo; checks every shape path and the loader";
    const Checkpoint& ck = *m_.weights().checkpoint;
    std::set<std::string> files;
    std::map<std::string, int64_t> counts;
    for (const auto& [name, v] : ck.tensors()) {
      files.insert(std::filesystem::path(v->file).filename().string());
      counts[std::string(DTypeName(v->dtype))]++;
    }
    j["checkpoint"] = {{"weight_files", files},
                       {"n_tensors", ck.tensors().size()},
                       {"dtype_counts", counts},
                       {"sharded", ck.num_files() > 1}};
    j["reference"] = {{"code", "splitserve common/model reference forward pass"},
                      {"revision_switches",
                       {{"shared_expert_clamp", true},
                        {"kv_fp8_sim_rounds_to_e4m3", true},
                        {"fp4_sim_rounds_to_e2m1", true}}}};
    j["seeds"] = {{"prompts", seed_},
                  {"how",
                   "std::mt19937_64, id = next() % vocab; master sequence: seed; long "
                   "prompt: seed+1; batch prompts: seed+2"}};
    j["plan"] = {{"prefill_lens", plan_.prefill_lens},    {"long_prompt", plan_.long_prompt},
                 {"long_total", plan_.long_total},        {"inter_len", plan_.inter_len},
                 {"blocks_len", plan_.blocks_len},        {"batch_prompt", plan_.batch_prompt},
                 {"batch_rows", plan_.batch_rows},        {"variant_lens", plan_.variant_lens},
                 {"rope_positions", plan_.rope_positions}};
    j["conventions"] = {
        {"positions",
         "0-based absolute; a prefill of S tokens covers positions 0..S-1 with "
         "start_pos=0; a decode step at start_pos=p processes the token at position p"},
        {"logits",
         "fp32 [vocab] at the LAST position of the forward call; predicts the next token"},
        {"hc_streams",
         "[pos, stream(=hc), dim] bf16; block 0 input = embed[id] copied to all "
         "streams"},
        {"router",
         "indices [pos, k] in the gate's output order; weights in the same order; "
         "compare as sets"},
        {"indexer",
         "block ids j (compressed block j covers tokens 4j..4j+3); -1 = none; "
         "scores -inf where not eligible"},
        {"mtp",
         "MTP position p consumes h_p and the NEXT token id, runs at position p and "
         "predicts tau_{p+2}; MTP has its own SWA cache"}};
    j["cases"] = cases_;
    return j;
  }

  const SetBuilder& builder() const { return b_; }

 private:
  Json NewCase(const std::string& name, const std::string& kind) {
    return Json{{"name", name}, {"kind", kind}, {"tensors", Json::array()}};
  }

  absl::Status Prefills() {
    for (int64_t n : plan_.prefill_lens) {
      const std::vector<int64_t> ids = Prefix(master_, n);
      ASSIGN_OR_RETURN(std::vector<float> logits, PrefillLogits(m_, ids));
      const std::string base = absl::StrCat("prefill.L", n);
      Json c = NewCase(absl::StrCat("prefill_L", n), "prefill");
      c["batch"] = 1;
      c["prompt_len"] = n;
      c["prompt_ids"] = ids;
      c["procedure"] =
          "fresh state; forward(prompt_ids, start_pos=0); fp32 logits of the LAST "
          "position";
      b_.F32(c, base + ".logits", {c_.vocab_size}, logits,
             "fp32 logits at the last prompt position");
      b_.I64(c, base + ".prompt_ids", {n}, ids, "the prompt (a prefix of one master sequence)");
      c["top2_margin"] = Top2Margin(logits.data(), c_.vocab_size);
      cases_.push_back(std::move(c));
    }
    return absl::OkStatus();
  }

  absl::Status Long() {
    const int64_t prompt = plan_.long_prompt, P = plan_.long_total, rows = P - prompt + 1;
    const int64_t V = c_.vocab_size, L = c_.n_layers, topk = c_.index_topk;
    const std::vector<int64_t> csa = CsaLayers(c_);
    const int64_t nb_max = P / 4;
    std::vector<int64_t> input = RandomIds(seed_ + 1, prompt, V), gen;
    std::vector<float> logits, margin, streams(L * P * hd_);
    std::vector<int32_t> sel(csa.size() * rows * topk, -1);
    std::vector<float> scores(csa.size() * rows * nb_max, -kInf), gap(csa.size() * rows);

    SequenceState st = m_.NewSequence();
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t p0 = row == 0 ? 0 : prompt + row - 1, n = row == 0 ? prompt : 1;
      ASSIGN_OR_RETURN(Pass pass, RunPass(m_, st, input.data() + p0, n));
      for (int64_t l = 0; l < L; ++l) {
        std::copy_n(pass.streams.data() + l * n * hd_, n * hd_,
                    streams.data() + (l * P + p0) * hd_);
      }
      for (size_t ci = 0; ci < csa.size(); ++ci) {
        const IndexerResult& idx = pass.traces[csa[ci]].indexer.at(0);
        const int64_t r = n - 1, out = ci * rows + row;
        for (int64_t i = 0; i < idx.k; ++i) sel[out * topk + i] = idx.sel[r * idx.k + i];
        std::copy_n(idx.scores.data() + r * idx.n_blocks, idx.n_blocks,
                    scores.data() + out * nb_max);
        gap[out] = BoundaryGap(scores.data() + out * nb_max, nb_max, topk);
      }
      logits.insert(logits.end(), pass.logits.begin(), pass.logits.end());
      margin.push_back(Top2Margin(pass.logits.data(), V));
      gen.push_back(Argmax(pass.logits));
      if (prompt + row < P) input.push_back(gen.back());
    }

    Json c = NewCase("long_greedy", "prefill+decode");
    c["batch"] = 1;
    c["prompt_len"] = prompt;
    c["prompt_ids"] = Prefix(input, prompt);
    c["gen_ids"] = gen;
    c["procedure"] =
        absl::StrCat("fresh state; row 0 = forward(prompt_ids, start_pos=0) (query position ",
                     prompt - 1, "); row r>=1 = forward([gen_ids[r-1]], start_pos=", prompt - 1,
                     "+r); gen_ids[r] = argmax(logits[r]). Feed gen_ids (teacher forcing).");
    c["csa_layers"] = csa;
    c["min_top2_margin"] = *std::min_element(margin.begin(), margin.end());
    const std::string rowdoc = absl::StrCat("row r belongs to query position ", prompt - 1, "+r");
    b_.I64(c, "long.prompt_ids", {prompt}, Prefix(input, prompt), "the prompt");
    b_.F32(c, "long.logits", {rows, V}, logits, "fp32 logits; " + rowdoc);
    b_.I64(c, "long.gen_ids", {rows}, gen,
           absl::StrCat("greedy tokens; gen_ids[r] is the token at position ", prompt, "+r"));
    b_.F32(c, "long.top2_margin", {rows}, margin, "top1 - top2 logit per row");
    if (!csa.empty()) {
      const int64_t n_csa = csa.size();
      b_.I32(c, "long.indexer.sel", {n_csa, rows, topk}, sel,
             "[csa_layer, row, k] indexer block ids (top-k order, -1 = none); " + rowdoc);
      b_.F32(c, "long.indexer.scores", {n_csa, rows, nb_max}, scores,
             "[csa_layer, row, block] indexer scores (bf16 values as fp32; -inf = absent)");
      b_.F32(c, "long.indexer.boundary_gap", {n_csa, rows}, gap,
             "score(k-th best) - score((k+1)-th best); +inf = no real selection");
    }
    b_.I64(c, "long.input_ids", {P}, input,
           "input token of every position (prompt, then gen_ids[:-1])");
    b_.Bf16(c, "long.hc_after_block", {L, P, c_.hc_mult, c_.dim}, streams.data(), streams.size(),
            "[layer, pos, stream, dim] HC streams after each block (prefill, then decode steps)",
            SetBuilder::kBlocks);
    cases_.push_back(std::move(c));
    return absl::OkStatus();
  }

  void Rope() {
    const int64_t Rp = plan_.rope_positions, pairs = c_.rope_head_dim / 2;
    Json c = NewCase("rope_tables", "reference tables");
    for (const auto& [name, ratio] :
         std::vector<std::pair<std::string, int64_t>>{{"m0", 0}, {"compressed", 4}}) {
      const std::vector<float> freqs = LayerRopeFrequencies(c_, ratio);
      std::vector<float> table(Rp * pairs * 2), cs(pairs), sn(pairs);
      for (int64_t p = 0; p < Rp; ++p) {
        RopeCosSin(freqs, p, cs.data(), sn.data());
        for (int64_t i = 0; i < pairs; ++i) {
          table[(p * pairs + i) * 2] = cs[i];
          table[(p * pairs + i) * 2 + 1] = sn[i];
        }
      }
      b_.F32(c, "rope.freqs_cis." + name, {Rp, pairs, 2}, table,
             ratio == 0 ? "[pos, pair, (cos, sin)] for m=0 layers and the MTP block"
                        : "[pos, pair, (cos, sin)] for m>0 layers (compress_rope_theta, YaRN)");
    }
    cases_.push_back(std::move(c));
  }

  absl::Status Batch2() {
    const int64_t S = plan_.batch_prompt, R = plan_.batch_rows, V = c_.vocab_size;
    const std::vector<int64_t> prompts = RandomIds(seed_ + 2, 2 * S, V);
    std::vector<int64_t> gen(2 * R);
    std::vector<float> logits(2 * R * V);
    SequenceState st[2] = {m_.NewSequence(), m_.NewSequence()};
    for (int64_t row = 0; row < R; ++row) {
      std::vector<ChunkRef> chunks;
      for (int64_t b = 0; b < 2; ++b) {
        if (row == 0)
          chunks.push_back({&st[b], prompts.data() + b * S, S, 0});
        else
          chunks.push_back({&st[b], gen.data() + b * R + row - 1, 1, 0});
      }
      ASSIGN_OR_RETURN(std::vector<std::vector<float>> r, m_.Forward(chunks));
      for (int64_t b = 0; b < 2; ++b) {
        std::copy(r[b].begin(), r[b].end(), logits.begin() + (b * R + row) * V);
        gen[b * R + row] = Argmax(r[b]);
      }
    }
    Json c = NewCase("batch2", "batched prefill+decode");
    c["batch"] = 2;
    c["prompt_len"] = S;
    c["prompt_ids"] = {Prefix(prompts, S),
                       std::vector<int64_t>(prompts.begin() + S, prompts.end())};
    c["gen_ids"] = {Prefix(gen, R), std::vector<int64_t>(gen.begin() + R, gen.end())};
    c["procedure"] = absl::StrCat(
        "fresh state; row 0 = forward(prompt_ids [2,", S,
        "], 0); row r>=1 = forward(gen_ids[:, r-1] as [2,1], start_pos=", S - 1, "+r)");
    b_.I64(c, "batch2.prompt_ids", {2, S}, prompts, "[seq, pos]");
    b_.F32(c, "batch2.logits", {2, R, V}, logits, "[seq, row, vocab] fp32");
    b_.I64(c, "batch2.gen_ids", {2, R}, gen, "[seq, row]");
    cases_.push_back(std::move(c));
    return absl::OkStatus();
  }

  // The per-block data of one prefill from position 0 ("inter" or "blocks160").
  absl::Status PerBlockSet(const std::string& case_name, const std::string& set, int64_t S,
                           SetBuilder::File f) {
    const std::vector<int64_t> ids = Prefix(master_, S);
    SequenceState st = m_.NewSequence();
    ASSIGN_OR_RETURN(Pass pass, RunPass(m_, st, ids.data(), S));
    const int64_t L = c_.n_layers, dim = c_.dim, hc = c_.hc_mult, k = c_.n_activated_experts;
    const bool inter = set == "inter";
    Json c = NewCase(case_name, inter ? "prefill with intermediates" : "per-block prefill data");
    c["batch"] = 1;
    c["prompt_len"] = S;
    c["prompt_ids"] = ids;
    c["procedure"] =
        "fresh state; forward(prompt_ids, 0), block by block. Block L alone (fresh "
        "caches) on hc_after_block[L-1] (block 0: the embedding copied to all "
        "streams), start_pos 0, reproduces hc_after_block[L], attn_out[L], "
        "moe_out[L] and router[L]";
    b_.I64(c, set + ".prompt_ids", {S}, ids, "the prompt (prefix of the master sequence)", f);
    b_.F32(c, set + ".logits", {c_.vocab_size}, pass.logits, "last-position fp32 logits", f);
    b_.Bf16(c, set + ".hc_after_block", {L, S, hc, dim}, pass.streams.data(), pass.streams.size(),
            "[layer, pos, stream, dim] residual HC streams after each block", f);
    if (inter) {
      final_streams_.assign(pass.streams.end() - S * hd_, pass.streams.end());
      inter_logits_ = pass.logits;
      b_.Bf16(c, "inter.hc_final", {S, hc, dim}, final_streams_.data(), final_streams_.size(),
              "[pos, stream, dim] final HC streams fed to the head HC collapse", f);
    }
    std::vector<float> attn, moe, weights;
    std::vector<int32_t> indices;
    for (const BlockTrace& t : pass.traces) {
      attn.insert(attn.end(), t.attn_out.begin(), t.attn_out.end());
      moe.insert(moe.end(), t.moe_out.begin(), t.moe_out.end());
      indices.insert(indices.end(), t.router.indices.begin(), t.router.indices.end());
      weights.insert(weights.end(), t.router.weights.begin(), t.router.weights.end());
    }
    b_.Bf16(c, set + ".attn_out", {L, S, dim}, attn.data(), attn.size(),
            "[layer, pos, dim] attention sublayer output (after wo_b), before hc_post", f);
    b_.Bf16(c, set + ".moe_out", {L, S, dim}, moe.data(), moe.size(),
            "[layer, pos, dim] MoE sublayer output (routed + shared), before hc_post", f);
    b_.I32(c, set + ".router.indices", {L, S, k}, indices, "[layer, pos, k] expert ids", f);
    b_.F32(c, set + ".router.weights", {L, S, k}, weights,
           "[layer, pos, k] routing weights, same order as indices", f);
    if (inter) {
      const BlockTrace& t0 = pass.traces[0];
      for (const auto& [which, split] :
           {std::pair{"hc_attn", &t0.hc_attn_split}, std::pair{"hc_ffn", &t0.hc_ffn_split}}) {
        std::vector<float> pre, post, comb;
        for (const std::vector<float>& r : *split) {
          pre.insert(pre.end(), r.begin(), r.begin() + hc);
          post.insert(post.end(), r.begin() + hc, r.begin() + 2 * hc);
          comb.insert(comb.end(), r.begin() + 2 * hc, r.end());
        }
        const std::string base = absl::StrCat("inter.L0.", which);
        b_.F32(c, base + ".pre", {S, hc}, pre, "layer-0 split: pre", f);
        b_.F32(c, base + ".post", {S, hc}, post, "layer-0 split: post", f);
        b_.F32(c, base + ".comb", {S, hc, hc}, comb,
               "layer-0 split: comb (new stream k takes comb[j][k] of old stream j)", f);
      }
    }
    for (int64_t l = 0; l < L; ++l) {
      const int64_t ratio = c_.compress_ratio(l);
      const int64_t nb = ratio > 0 ? S / ratio : 0;
      if (nb == 0) continue;
      const std::string sl = absl::StrCat(".L", l);
      const model::LayerState& ls = st.layers[l];
      b_.Bf16(c, set + ".compressed_kv" + sl, {nb, c_.head_dim}, ls.compressed.data(),
              ls.compressed.size(),
              absl::StrCat("layer ", l, " main-compressor entries, [block, head_dim]"), f);
      if (ratio != 4) continue;
      b_.Bf16(c, set + ".indexer_kv" + sl, {nb, c_.index_head_dim}, ls.index_keys.data(),
              ls.index_keys.size(),
              absl::StrCat("layer ", l, " indexer-compressor keys, [block, index_head_dim]"), f);
      const IndexerResult& idx = pass.traces[l].indexer.at(0);
      std::vector<int32_t> sel(S * c_.index_topk, -1);
      for (int64_t s = 0; s < S; ++s) {
        std::copy_n(idx.sel.data() + s * idx.k, idx.k, sel.data() + s * c_.index_topk);
      }
      b_.I32(c, set + ".indexer" + sl + ".sel", {S, c_.index_topk}, sel,
             absl::StrCat("layer ", l, ": [pos, k] selected block ids (top-k order; -1 = none)"),
             f);
      b_.F32(c, set + ".indexer" + sl + ".scores", {S, idx.n_blocks}, idx.scores,
             absl::StrCat("layer ", l, ": [pos, block] indexer scores (-inf = not complete)"), f);
    }
    cases_.push_back(std::move(c));
    return absl::OkStatus();
  }

  // Needs the inter case's final streams and logits.
  absl::Status Mtp() {
    if (c_.n_mtp_layers == 0) return absl::OkStatus();
    const int64_t S = plan_.inter_len;
    const std::vector<int64_t> main_ids = Prefix(master_, S);
    const int64_t next = Argmax(inter_logits_);
    std::vector<int64_t> ids(main_ids.begin() + 1, main_ids.end());
    ids.push_back(next);
    SequenceState st = m_.NewSequence();
    const ChunkRef pre{&st, ids.data(), S - 1, 0};
    ASSIGN_OR_RETURN(auto lp, m_.MtpForward(0, {&pre, 1}, final_streams_.data()));
    const ChunkRef dec{&st, ids.data() + S - 1, 1, S - 1};
    ASSIGN_OR_RETURN(auto ld, m_.MtpForward(0, {&dec, 1}, final_streams_.data() + (S - 1) * hd_));
    Json c = NewCase("mtp", "MTP block");
    c["main_prompt_ids"] = main_ids;
    c["next_token"] = next;
    c["procedure"] =
        absl::StrCat("fresh MTP state; mtp(hc_in[0:", S - 1, "], start_pos=0, input_ids[0:", S - 1,
                     "]) -> prefill.logits; same state: mtp(hc_in[", S - 1, "], start_pos=", S - 1,
                     ", [next_token]) -> decode.logits");
    b_.I64(c, "mtp.main_prompt_ids", {S}, main_ids, "main-model prompt (= inter.prompt_ids)");
    b_.Bf16(c, "mtp.hc_in", {S, c_.hc_mult, c_.dim}, final_streams_.data(), final_streams_.size(),
            "[pos, stream, dim] main final HC streams = the MTP x input");
    b_.I64(c, "mtp.input_ids", {S}, ids, "MTP input id per position (prompt_ids[1:] + next_token)");
    b_.F32(c, "mtp.prefill.logits", {c_.vocab_size}, lp[0],
           absl::StrCat("MTP logits at position ", S - 2));
    b_.F32(c, "mtp.decode.logits", {c_.vocab_size}, ld[0],
           absl::StrCat("MTP logits of the decode step at position ", S - 1));
    cases_.push_back(std::move(c));
    return absl::OkStatus();
  }

  absl::Status Variants() {
    const auto& tensors = m_.weights().checkpoint->tensors();
    if (tensors.empty()) return absl::InvalidArgumentError("model has no checkpoint tensors");
    const std::string dir =
        std::filesystem::path(tensors.begin()->second->file).parent_path().string();
    Json c = NewCase("revision_variants", "prefill with other revision switches");
    c["procedure"] =
        "same weights and prompts as prefill_L{n}; switches shared_expert_clamp and "
        "kv_fp8_sim_rounds (current revision: both on); initial_revision = both off";
    Json prompts = Json::object();
    struct Variant {
      const char* name;
      model::ModelOptions options;
    };
    for (const Variant& v :
         {Variant{"shared_clamp_off", {false, true}}, Variant{"kv_fp8_round_off", {true, false}},
          Variant{"initial_revision", {false, false}}}) {
      ASSIGN_OR_RETURN(std::unique_ptr<Model> vm, Model::Load(dir, v.options));
      for (int64_t n : plan_.variant_lens) {
        const std::vector<int64_t> ids = Prefix(master_, n);
        prompts[absl::StrCat("L", n)] = ids;
        ASSIGN_OR_RETURN(std::vector<float> logits, PrefillLogits(*vm, ids));
        b_.F32(c, absl::StrCat("variant.", v.name, ".L", n, ".logits"), {c_.vocab_size}, logits,
               absl::StrCat(
                   "prefill_L", n, "'s prompt, last-position logits with shared_expert_clamp=",
                   v.options.shared_expert_clamp ? "True" : "False",
                   ", kv_fp8_sim_rounds=", v.options.kv_fp8_sim_rounds ? "True" : "False"));
      }
    }
    c["prompt_ids"] = prompts;
    cases_.push_back(std::move(c));
    return absl::OkStatus();
  }

  const Model& m_;
  const ModelConfig& c_;
  const GoldenPlan plan_;
  const uint64_t seed_;
  const int64_t hd_;  // hc_mult * dim, one position's streams
  std::vector<int64_t> master_;
  std::vector<float> final_streams_, inter_logits_;
  SetBuilder b_;
  Json cases_ = Json::array();
};

}  // namespace

GoldenPlan PlanGoldenSet(const ModelConfig& c) {
  const int64_t W = c.window_size, topk = c.index_topk;
  bool has128 = false;
  for (int64_t l = 0; l < c.n_layers; ++l) has128 = has128 || c.compress_ratio(l) == 128;
  GoldenPlan p;
  p.long_prompt = W + 5;
  p.long_total = std::max({p.long_prompt + 2 * W + 8, 4 * (topk + 4), has128 ? int64_t{131} : 0});
  p.inter_len = std::max(2 * W + 7, 4 * topk + 7);
  p.blocks_len = has128 ? 133 : std::max(4 * W + 3, 8 * topk + 3);
  p.batch_prompt = W + 7;
  p.batch_rows = 6;
  std::set<int64_t> lens = {1, 2, 3, 4, 5, W + 1, 2 * W + 3};
  if (has128) lens.insert({128, 130});
  p.prefill_lens.assign(lens.begin(), lens.end());
  p.variant_lens = {2 * W + 3};
  p.rope_positions =
      c.max_position_embeddings > 0 ? std::min<int64_t>(c.max_position_embeddings, 4096) : 512;
  return p;
}

absl::Status WriteGoldenSet(const Model& m, const std::string& out_dir, uint64_t seed) {
  const model::ModelOptions& o = m.options();
  if (!o.shared_expert_clamp || !o.kv_fp8_sim_rounds) {
    return absl::InvalidArgumentError(
        "WriteGoldenSet: the model must use the current-revision switches (the defaults)");
  }
  Writer w(m, seed);
  RETURN_IF_ERROR(w.Build());
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(out_dir, ": ", ec.message()));
  const auto& tensors = m.weights().checkpoint->tensors();
  const std::string config_name =
      std::filesystem::path(tensors.begin()->second->file).parent_path().filename().string();
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"config", config_name}};
  RETURN_IF_ERROR(WriteSafetensors(out_dir + "/" + kGoldenFile,
                                   w.builder().tensors(SetBuilder::kGolden), meta));
  RETURN_IF_ERROR(WriteSafetensors(out_dir + "/" + kBlocksFile,
                                   w.builder().tensors(SetBuilder::kBlocks), meta));
  std::ofstream out(out_dir + "/cases.json");
  out << w.CasesJson(config_name).dump(1) << "\n";
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(out_dir, "/cases.json: write failed"));
  return absl::OkStatus();
}

}  // namespace ss::golden
