// Dummy weights (`--load-format dummy`, vLLM's meaning): every tensor of a DeepSeek-V4 checkpoint
// (ExpectedTensors(config)) generated in memory in its native format, deterministic from a seed,
// so that a model of any size can be served and measured without its files. Nothing is read from
// disk but config.json.
//
// Formats are the checkpoint's own: e4m3 codes with ue8m0 128x128 block scales, MXFP4 e2m1 nibble
// pairs with ue8m0 1x32 scales, bf16 and fp32 tensors, int64 tid2eid rows of distinct expert
// ids. Magnitudes follow tests/tools/checkpoint_generator's init rules (FP8 linears N(0, 1/fan_in),
// the shared expert x8 (w1/w3) and x0.25 (w2); MXFP4 experts w1/w3 N(0, 64/fan_in), w2
// N(0, 0.0625/fan_in); embed N(0, 1), head and other bf16 matrices N(0, 1/fan_in), norms
// 1 + N(0, 0.1^2); hc fn N(0, 0.02^2), base N(0, 0.5^2), scale U(0.5, 1.5); attn_sink N(0, 1),
// ape N(0, 0.5^2), gate.bias N(0, 0.1^2)), so activations stay finite through every layer
// (tests/common/dummy_weights_test.cc runs Flash's 43-layer pattern).
//
// Router skew (`--dummy-router-skew S`, 0 = off): with dummy weights the learned router spreads
// its choices nearly evenly over the experts, so nothing that depends on expert popularity (the
// GPU-resident placement by measured frequency) can show a gain. With S > 0 every learned-routing
// `ffn.gate.bias` (layers >= num_hash_layers and the MTP blocks; the hash layers' tid2eid tables
// are unchanged) gets a Zipf-like term: the expert of popularity rank r (0 = hottest) gets
// -S * ln(1 + r) added, the ranking being DummyRouterRanking(the tensor's name), a fixed
// pseudo-random permutation that differs between layers and depends on nothing else (not the
// seed), so every process agrees on it. S is in the router score's units (sqrt(softplus(logit)),
// about 0.5..1.5 on unit-RMS inputs): S = 0.2 makes the hottest quarter of each layer's experts
// take about two thirds of its choices with 64 experts (Flash's dim 4096, top-6: 0.68; S = 0.1:
// 0.46; S = 0: 0.26) and 0.85 with 256 (tests/common/dummy_router_skew_test.cc measures and
// prints it). The bias only steers the top-k selection; the routing weights are the unbiased
// scores, as for a trained model.
//
// How (nothing goes through fp32 and a quantiser): a quantised tensor has ONE block scale 2^e for
// all its blocks, with e chosen so the codes' std sits where a trained tensor's does (e4m3 about
// 48..96, e2m1 about 1.25..2.5), and its codes are drawn from a 256-entry table of the normal
// quantiles (i + 0.5)/256 encoded to e4m3 (or, for MXFP4, two independent nibbles from the 16
// quantiles), corrected so the decoded std is the rule's; one random byte picks an entry. bf16
// and fp32 values come from the same quantile table (bf16 with a random last mantissa bit, fp32
// with random low 16 mantissa bits). A `.scale` tensor depends only on its weight's rule, so
// weights and scales are generated independently.
//
// Determinism: a tensor's bytes depend only on (config, seed, tensor name) — not on the thread
// count, the order of generation or which other tensors are generated — so every process of a
// cluster generates the same model. Each tensor is cut into fixed 1 MiB chunks (whole rows for
// tid2eid), each drawn from its own splitmix64 stream keyed by (seed, name, chunk index); chunks
// are the unit of parallel work.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/checkpoint_schema.h"
#include "common/model_config.h"
#include "common/safetensors.h"

namespace ss {

class ThreadPool;

// Which tensors (by checkpoint name) a process generates.
using TensorFilter = std::function<bool(std::string_view name)>;

// The popularity ranking the router skew gives the experts of one learned-routing gate:
// result[r] = the expert id of rank r (a permutation of 0..n_experts-1), deterministic from
// `gate_bias_name` (e.g. "layers.7.ffn.gate.bias") alone. Empty for n_experts <= 0.
std::vector<int32_t> DummyRouterRanking(std::string_view gate_bias_name, int64_t n_experts);

// OK for a finite S >= 0; otherwise InvalidArgument naming --dummy-router-skew.
absl::Status ValidateDummyRouterSkew(double router_skew);

// The tensors a pipeline stage holding blocks [first_layer, end_layer) uses: the non-expert
// tensors of those blocks, embed.weight when `embed`, head.weight / norm.weight / hc_head_* when
// `head`, the MTP blocks' tensors when `mtp`, and the routed experts of its blocks only when
// `routed_experts` (they normally live in the expert workers). `c` is not used today (names
// carry everything); it is there so that a stage's filter can depend on the config.
TensorFilter StageTensors(const ModelConfig& c, int first_layer, int end_layer, bool embed,
                          bool head, bool mtp, bool routed_experts);

// Writes tensor `t`'s bytes (`nbytes` == its size) into `dst` on the calling thread: the same
// bytes MakeDummyCheckpoint gives it (the expert store generates one expert at a time with it).
// `router_skew` is S above (it changes only the gate.bias tensors). InvalidArgument for a size
// mismatch or an invalid skew, Internal for a tensor without a rule.
absl::Status FillDummyTensor(const ModelConfig& c, const ExpectedTensor& t, uint64_t seed,
                             uint8_t* dst, size_t nbytes, double router_skew = 0.0);

// A checkpoint of every tensor of ExpectedTensors(c), generated on `pool` (null: the calling
// thread alone; it calls pool->ParallelFor, so not from inside one of its tasks) into one
// anonymous mapping, first touched by the generating threads and read-only afterwards. Tensors
// `materialize` rejects read as zeros and take no memory (they all point at one shared read-only
// zero mapping as large as the largest of them); null accepts all. ValidateCheckpoint passes on
// it. `router_skew` is S above. Logs bytes generated, seconds and GB/s. Errors: InvalidArgument
// for an invalid skew, Internal for a tensor without a rule, ResourceExhausted when the memory
// cannot be mapped.
absl::StatusOr<std::unique_ptr<Checkpoint>> MakeDummyCheckpoint(const ModelConfig& c, uint64_t seed,
                                                                const TensorFilter& materialize,
                                                                ThreadPool* pool,
                                                                double router_skew = 0.0);

}  // namespace ss
