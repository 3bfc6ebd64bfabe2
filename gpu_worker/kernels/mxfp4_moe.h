// The routed experts of one MoE layer on the GPU (ARCHITECTURE.md "Where the routed experts run",
// the streamed path; spec §3.11, §5.2 Linear4): the routing of a chunk's tokens to experts, the
// activation quantisation, a grouped MXFP4 GEMM over (expert, routed tokens) for one GROUP of
// experts whose weights are on the device, and the combine of the per-route outputs.
// Contract: README.md.
//
// One layer, in stream order:
//   MoeBuildRouting(ids, weights)                   routes sorted by expert (MoeRouting)
//   FakeQuantE4m3(x)                                xq: Linear4's input quantisation, as bf16
//   for each group of experts [e0, e1) in ascending order, once its weights are on the device:
//     Mxfp4MoeGroup                                  y for every route to an expert of the group
//   MoeCombineRoutes(y)                             sum[t] = Σ over t's routes, ascending expert
//
// Numerics. Linear4 (spec §5.2) is y[n] = Σ_g (Σ_{i∈g} q_i·e2m1_{n,i}) · s_act · 2^(S_w[n,g]−127)
// with fp32 accumulation and a bf16 result. Here the activations are the bf16 values
// FakeQuantE4m3 gives (e4m3 code times block scale, exact in bf16), every e2m1 weight code is
// decoded in registers to the bf16 of its value (exact), and the products are summed by m16n8k16
// mma.sync bf16 with fp32 accumulation (sm_80+, no FP8 instructions). Every product is exact. As
// in Linear4, each 32-wide K group's products are summed on their own (two mmas from zero: the
// group partial, which Linear4 forms exactly and rounds once), multiplied by the weight's ue8m0
// scale and added to the fp32 accumulator in K order (one fma: the product by a power of two is
// exact, so that is Linear4's multiply then add unless it falls below fp32's normal range); the
// outputs are rounded to bf16 where Linear4 rounds. The expert follows spec §3.11:
//   g = fp32(bf16(Linear4(x; w1))), u = fp32(bf16(Linear4(x; w3))), g = min(g, limit),
//   u = clamp(u, ±limit), a = silu(g)·u·w_route (fp32), y = Linear4(bf16(a); w2) (bf16 when
//   round_output_bf16, else fp32: a partial of a split expert),
// and the combine adds each token's route outputs in fp32 in ascending expert-id order (the
// demo's order). The differences to the CPU reference: the tensor cores' summation of a group's 32
// products (Linear4 rounds their exact sum once; the tensor cores' internal rounding is the
// hardware's) and silu's exp, CUDA's expf where the reference calls glibc's (as swiglu.cu).
// The measured agreement (mxfp4_moe_test) is in bench/RESULTS.md.
//
// Determinism: every route's row is computed by one fixed sequence of operations whatever the
// other routes are (no atomics in any sum), so a step's results do not depend on the grid's
// schedule and repeat bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "gpu_worker/kernels/shared_memory.h"
#include "gpu_worker/kernels/types.h"

namespace ss::cuda {

// Most intermediate-dimension parts one expert may be split into on the device.
inline constexpr int kMxfp4MoeMaxParts = 8;
// Largest number of experts of a layer (ids in [0, E)).
inline constexpr int kMxfp4MoeMaxExperts = 1024;
// Rows of one tile of routes in the grouped GEMMs: MoeRouting::tile_offsets counts tiles of it.
inline constexpr int kMxfp4MoeTileRoutes = 64;
// Most routes per token (K) every entry point takes.
inline constexpr int kMxfp4MoeMaxTopK = 16;

// Where the weights of the experts of one group are in device memory. Expert e of the group
// [expert_begin, expert_end) starts at `base + (e − expert_begin)·expert_bytes`. Its rows of the
// intermediate dimension (the ones this GPU computes) are `parts` ranges of `part_inter` rows
// each; part p is laid out like an expert-store slice of part_inter rows
// (cpu_expert_worker/kernels/expert_kernels.h ExpertSliceView), at byte offsets from the
// expert's start:
//   w1[p], w3[p]:             [part_inter, dim/2] e2m1 pairs (low nibble = even element)
//   w1_scale[p], w3_scale[p]: [part_inter, dim/32] ue8m0, row-major, dim/32 bytes a row
//   w2[p]:                    [dim, part_inter/2]
//   w2_scale[p]:              ue8m0 scales of w2: row n's group g at
//                             w2_scale[p] + n·w2_scale_stride + w2_scale_col0 + g
//                             (the part may be a column range of a wider slice's scales)
// Alignment: expert_bytes and every w1/w3/w2 offset a multiple of 16, every scale offset,
// w2_scale_stride and w2_scale_col0 a multiple of 4 (base 16-byte aligned); else
// cudaErrorInvalidValue.
// tile_rows 0: every matrix row-major (row r at r·row_bytes). tile_rows 8 or 16: TILED as
// ExpertSliceView::tile_rows — tile t of tile_rows rows at t·tile_rows·row_bytes, inside it
// K-block kb (128 elements, 64 bytes) of its row j at kb·tile_rows·64 + j·64.
struct Mxfp4ExpertLayout {
  int64_t dim = 0;         // multiple of 128
  int64_t part_inter = 0;  // multiple of 128 (and of tile_rows)
  int parts = 1;           // 1..kMxfp4MoeMaxParts; the expert's rows here: parts·part_inter
  int64_t tile_rows = 0;   // 0, 8 or 16
  int64_t expert_bytes = 0;
  int64_t w2_scale_stride = 0;  // >= w2_scale_col0 + part_inter/32
  int64_t w2_scale_col0 = 0;
  int64_t w1[kMxfp4MoeMaxParts] = {}, w1_scale[kMxfp4MoeMaxParts] = {};
  int64_t w3[kMxfp4MoeMaxParts] = {}, w3_scale[kMxfp4MoeMaxParts] = {};
  int64_t w2[kMxfp4MoeMaxParts] = {}, w2_scale[kMxfp4MoeMaxParts] = {};
};

// The chunk's routes (token t's k-th choice is route slot t·K + k) sorted by expert. Device
// buffers, caller-owned, sized for T·K routes and E experts (MoeRoutingBytes):
struct MoeRouting {
  int32_t* offsets = nullptr;       // [E + 1]: expert e's routes are [offsets[e], offsets[e+1])
  int32_t* tile_offsets = nullptr;  // [E + 1]: expert e's route tiles (kMxfp4MoeTileRoutes rows)
                                    //   are [tile_offsets[e], tile_offsets[e+1])
  int32_t* route_token = nullptr;   // [T·K]: the token of the route at sorted position i
  int32_t* route_slot = nullptr;    // [T·K]: its slot t·K + k
  float* route_weight = nullptr;    // [T·K]: its routing weight
  void* scratch = nullptr;          // MoeRoutingScratchBytes(T, K, E)
};
// At most 64·(E + 1) + 8·T·K bytes (the memory plan counts that bound). The present kernels
// need none (0; scratch may be null).
int64_t MoeRoutingScratchBytes(int64_t T, int K, int E);

// Sorts the routes by expert: ids [T, K] (the router's; an id outside [expert_begin, expert_end)
// — another TP rank's expert, or −1 — is not routed here) and weights [T, K] fp32. Within an
// expert the routes keep token order. E <= kMxfp4MoeMaxExperts, 1 <= K <= kMxfp4MoeMaxTopK,
// T·K < 2^31. One block (a counting sort without atomics); T = 0 still writes zero offsets.
struct MoeBuildRoutingParams {
  const int32_t* ids = nullptr;
  const float* weights = nullptr;
  int64_t T = 0;
  int K = 0;
  int E = 0;
  int expert_begin = 0, expert_end = 0;  // [0, E) for all
  MoeRouting routing;
};
cudaError_t MoeBuildRouting(const MoeBuildRoutingParams& p, cudaStream_t stream);

// Linear4's activation quantisation (spec §5.2, as fp8_linear.h QuantizeActE4m3) returned as the
// values it stands for: y = bf16(e4m3(clamp(x/s, ±448))·s) per 1x128 block (exact in bf16).
// x, y: bf16 [rows, n], n a multiple of 128; y may alias x.
cudaError_t FakeQuantE4m3(const bf16_t* x, int64_t rows, int64_t n, bf16_t* y, cudaStream_t stream);

// The experts [expert_begin, expert_end) of one layer for their routes: for each route i of such
// an expert (sorted position i, MoeRouting), y[route_slot[i]] = the expert's output for token
// route_token[i] (see Numerics), [dim] fp32. Rows of y for routes to other experts are not
// touched. Workspace h: [T·K, parts·part_inter] bf16 (the activations a, at sorted positions;
// rows of the group's routes are overwritten with bf16(a), then with their e4m3 quantisation).
// Three kernels: the up GEMM (w1, w3, SwiGLU, routing weight; 64 routes x 64 intermediate rows a
// work item), FakeQuantE4m3 of the group's rows of h, the down GEMM (64 routes x 128 features);
// each a grid of at most 1024 blocks striding over the work items the routing gives. xq, h, base
// 16-byte aligned, y 8-byte aligned; 1 <= K <= kMxfp4MoeMaxTopK. The GEMMs take 91.5 KiB of
// dynamic shared memory: PrepareKernels (prepare.h) must have run on the device.
// Launch sizes are fixed by T·K and the group's expert count (no host reads of the routing), so
// the call is safe under graph capture; a group with no routes does nothing on the device
// beyond the launch.
struct Mxfp4MoeGroupParams {
  MoeRouting routing;
  int64_t T = 0;
  int K = 0;
  int expert_begin = 0, expert_end = 0;
  const uint8_t* base = nullptr;  // the group's weights (Mxfp4ExpertLayout)
  Mxfp4ExpertLayout layout;
  const bf16_t* xq = nullptr;     // [T, dim], FakeQuantE4m3 of the MoE input
  bf16_t* h = nullptr;            // [T·K, parts·part_inter] workspace
  float* y = nullptr;             // [T·K, dim]
  float limit = 10.0f;            // swiglu_limit
  bool round_output_bf16 = true;  // y = fp32(bf16(...)): the expert is whole (parts cover I)
};
cudaError_t Mxfp4MoeGroup(const Mxfp4MoeGroupParams& p, cudaStream_t stream);

// sum[t, :] = Σ_k fp32 y[t·K + k, :] over t's routes to experts in [expert_begin, expert_end),
// added in ascending expert-id order (ties: ascending k); a token with none gets 0. With
// `accumulate` the sum starts from sum[t, :] as it is (a partial of other experts) instead of 0.
// dim a multiple of 4, y and sum 16-byte aligned, 1 <= K <= kMxfp4MoeMaxTopK.
struct MoeCombineRoutesParams {
  const float* y = nullptr;      // [T·K, dim]
  const int32_t* ids = nullptr;  // [T, K]
  int64_t T = 0;
  int K = 0;
  int64_t dim = 0;
  int expert_begin = 0, expert_end = 0;
  float* sum = nullptr;  // [T, dim]
  bool accumulate = false;
};
cudaError_t MoeCombineRoutes(const MoeCombineRoutesParams& p, cudaStream_t stream);

// A chunk's routes split between the experts resident on the GPU and the rest
// (resident_routed_experts.h): for each of the n ids (the router's [T, K]), slot = slot_of[id]
// (the expert's place among the layer's resident experts, −1 when not resident; an id outside
// [0, E) has none): resident[i] = slot, host[i] = −1 where slot >= 0, else ids[i]
// (model::kSkippedExpert, −1, is a skipped choice for the expert workers). With `counts`, adds
// the choices of an id in [0, E) to counts[0] and the resident ones to counts[1], and with
// `expert_counts` each resident choice to expert_counts[id] (atomics: the split itself does not
// depend on them). E <= kMxfp4MoeMaxExperts. Fixed launch size: safe under graph capture.
struct SplitResidentRoutesParams {
  const int32_t* ids = nullptr;
  int64_t n = 0;
  const int32_t* slot_of = nullptr;  // [E]
  int E = 0;
  int32_t* resident = nullptr;                  // [n]
  int32_t* host = nullptr;                      // [n]
  unsigned long long* counts = nullptr;         // optional: [2] choices, resident choices
  unsigned long long* expert_counts = nullptr;  // optional: [E] resident choices by expert
};
cudaError_t SplitResidentRoutes(const SplitResidentRoutesParams& p, cudaStream_t stream);

// The opt-ins of Mxfp4MoeGroup's GEMM kernels, for PrepareKernels.
std::vector<SharedMemoryOptIn> Mxfp4MoeOptIns();

const void* MoeBuildRoutingKernel();
const void* FakeQuantE4m3Kernel();     // also Mxfp4MoeGroup's quantisation of h
const void* Mxfp4MoeGemmUpKernel();    // w1/w3, SwiGLU, routing weight
const void* Mxfp4MoeGemmDownKernel();  // w2
const void* MoeCombineRoutesKernel();
const void* SplitResidentRoutesKernel();

}  // namespace ss::cuda
