#include "gpu_worker/cuda/attention_layer.h"

#include <algorithm>
#include <vector>

#include "common/status.h"
#include "gpu_worker/cuda/hc_pre.h"
#include "gpu_worker/cuda/linear.h"
#include "gpu_worker/kernels/compressor.h"
#include "gpu_worker/kernels/fp8_linear.h"
#include "gpu_worker/kernels/head.h"
#include "gpu_worker/kernels/hyper_connection.h"
#include "gpu_worker/kernels/indexer.h"
#include "gpu_worker/kernels/indexer_topk.h"
#include "gpu_worker/kernels/output_projection.h"
#include "gpu_worker/kernels/paged_kv.h"
#include "gpu_worker/kernels/rms_norm.h"
#include "gpu_worker/kernels/rope.h"

namespace ss::gpu::cuda_backend_internal {
namespace {

// One layer's attention launches, in enqueue order: Projections, KvAndQuery, Attention, Output.
class AttentionLayer {
 public:
  AttentionLayer(StepState& s, int l)
      : s(s),
        im(s.im),
        c(s.c),
        sc(s.sc),
        plan(s.plan),
        kvl(s.im.kv.layout()),
        br(s.im.branches),
        l(l),
        b(s.im.blocks[l]),
        tok(s.dtokens + l * s.T),
        geom(kvl.Geom(l, s.pool)),
        cs(b.ratio == 0 ? sc.cos0 : sc.cos1),
        sn(b.ratio == 0 ? sc.sin0 : sc.sin1),
        freqs(b.ratio == 0 ? im.freqs_plain : im.freqs_comp) {}

  absl::Status Run() {
    // The normed attention input xn and its quantisation (qbuf) for wq_a and wkv.
    CUDA_RETURN_IF_ERROR(SublayerInput(s, sc.h, b.hc_attn, b.attn_norm));
    RETURN_IF_ERROR(Projections());
    RETURN_IF_ERROR(KvAndQuery());
    RETURN_IF_ERROR(Attention());
    return Output();
  }

 private:
  absl::Status Projections();
  absl::Status Compress(const DevCompressor& w, int kind, cuda::CompressorShape shape,
                        cuda::bf16_t* entries, float* cv, float* cg, cudaStream_t bs);
  absl::Status KvAndQuery();
  absl::Status IndexerSelect();
  absl::Status Attention();
  absl::Status Output();

  StepState& s;
  CudaBackend::Impl& im;
  const ModelConfig& c;
  StepScratch& sc;
  const StepPlan& plan;
  const KvLayout& kvl;
  StepBranches& br;
  const int l;
  const DevBlock& b;
  const cuda::KvToken* const tok;
  const cuda::KvGeom geom;
  const float* const cs;
  const float* const sn;
  const float* const freqs;
  const int64_t T = s.T, dim = s.dim, hc = s.hc, H = s.H, G = s.G, Dh = s.Dh, qlr = s.qlr,
                rd = s.rd, nh = s.nh, ihd = s.ihd;
  const size_t nc = s.nc;
  const float eps = s.eps, scale = s.scale, wscale = s.wscale;
  const bool rounds = s.rounds, fp64_ = s.fp64;
  const cudaStream_t st = s.st;
  const cudaStream_t bs_kv = br.stream(kBranchKv), bs_comp = br.stream(kBranchComp),
                     bs_index = br.stream(kBranchIndex), bs_iq = br.stream(kBranchIndexQ),
                     bs_iw = br.stream(kBranchIndexW);
  const std::vector<int64_t>&row0 = plan.row0, &n_sel = plan.n_sel, &sel_base = plan.sel_base,
        &n_cols = plan.n_cols, &table_off = plan.table_off, &n_cand = plan.n_cand;
};

// wq_a and wkv, and the branches from xn: the compressors and the indexer's head weights.
absl::Status AttentionLayer::Projections() {
  // Off the critical path, on branch streams from here (branches.h): the compressors and the
  // indexer's head weights from xn; wkv and the KV latent's norm, RoPE and staging from qbuf; the
  // indexer's wq_b and query prep from qbuf2. Each branch has its own scratch; the main stream
  // joins them before the attention (qbuf is next written after those joins).
  // A ratio-4 layer's critical path runs through wq_a, its norm, the indexer's wq_b, scores and
  // top-k, which also wait for the indexer's compressor (its new key) and head weights. So the
  // branches start here but are enqueued after wq_a + wkv below, the indexer's first, so that the
  // graph launches them in that order: launched behind the compressors' long projections, wq_a
  // found the SMs full and waited for them. The head weights have a branch of their own: on the
  // query's, the indexer's wq_b waited for them.
  if (b.has_compressor) CUDA_RETURN_IF_ERROR(br.MarkFork(kBranchComp, st));
  if (b.has_indexer) {
    CUDA_RETURN_IF_ERROR(br.MarkFork(kBranchIndex, st));
    CUDA_RETURN_IF_ERROR(br.MarkFork(kBranchIndexW, st));
  }
  CUDA_RETURN_IF_ERROR(cuda::Fp8LinearPair({.q = sc.qbuf,
                                            .s_act = sc.sbuf,
                                            .rows = T,
                                            .in = b.wq_a.in,
                                            .m0 = {b.wq_a.w, b.wq_a.s, b.wq_a.out, sc.qa},
                                            .m1 = {b.wkv.w, b.wkv.s, b.wkv.out, sc.kva}},
                                           st));
  // The compressors write their new entries to scratch rows (ebase), then the encoders put them
  // into their MXFP4 keys / records in the sequences' blocks.
  if (b.has_indexer) {
    CUDA_RETURN_IF_ERROR(br.TakeFork(kBranchIndex));
    cuda::CompressorShape shape{
        cuda::CompressorKind::kIndexer, b.ratio, ihd, rd, eps, rounds, fp64_};
    RETURN_IF_ERROR(Compress(b.index_compressor, 1, shape, sc.ckeys, sc.icv, sc.icg, bs_index));
    CUDA_RETURN_IF_ERROR(cuda::KvEncodeKeys(sc.ckeys, s.ddst_key + l * T, T, ihd, bs_index));
    CUDA_RETURN_IF_ERROR(br.Done(kBranchIndex));
    // The indexer's head weights; (KvAndQuery) its query, scores and top-k on one branch.
    CUDA_RETURN_IF_ERROR(br.TakeFork(kBranchIndexW));
    CUDA_RETURN_IF_ERROR(
        cuda::LinearBf16F32(sc.xn, T, dim, b.index_weights_proj.p, nh, sc.proj, nh, bs_iw));
    CUDA_RETURN_IF_ERROR(cuda::IndexerWeightScale(sc.proj, T * nh, wscale, sc.iw, bs_iw));
    CUDA_RETURN_IF_ERROR(br.Done(kBranchIndexW));
  }
  if (b.has_compressor) {
    CUDA_RETURN_IF_ERROR(br.TakeFork(kBranchComp));
    cuda::CompressorShape shape{cuda::CompressorKind::kMain, b.ratio, Dh, rd, eps, rounds, fp64_};
    RETURN_IF_ERROR(Compress(b.compressor, 0, shape, sc.centries, sc.cv, sc.cg, bs_comp));
    CUDA_RETURN_IF_ERROR(
        cuda::KvEncodeRecords(sc.centries, s.ddst_main + l * T, T, kvl.nope, kvl.rope, bs_comp));
    CUDA_RETURN_IF_ERROR(br.Done(kBranchComp));
  }
  return absl::OkStatus();
}

// One compressor (kind 0: the main one, 1: the indexer's) on branch stream bs: its projections,
// then one CompressorStep for the batch's chunks.
absl::Status AttentionLayer::Compress(const DevCompressor& w, int kind, cuda::CompressorShape shape,
                                      cuda::bf16_t* entries, float* cv, float* cg,
                                      cudaStream_t bs) {
  const int64_t wd = w.width;
  RETURN_IF_ERROR(CudaCheck(cuda::LinearBf16F32Pair({.x = sc.xn,
                                                     .rows = T,
                                                     .in = dim,
                                                     .m0 = {w.wkv.p, wd, cv, wd},
                                                     .m1 = {w.wgate.p, wd, cg, wd}},
                                                    bs),
                            "LinearBf16F32Pair(wkv, wgate)"));
  const int64_t* a = s.dparams + (l * 2 + kind) * plan.cb_stride;
  cuda::CompressorBatch cb;
  cb.n_seqs = static_cast<int64_t>(nc);
  cb.max_new = plan.max_rows / b.ratio + 1;
  cb.start = a;
  cb.row_begin = a + nc;
  cb.entry_begin = a + 2 * nc + 1;
  cb.kv_state = reinterpret_cast<float* const*>(a + 3 * nc + 1);
  cb.score_state = reinterpret_cast<float* const*>(a + 4 * nc + 1);
  return CudaCheck(cuda::CompressorStep({.v = cv,
                                         .g = cg,
                                         .ld = wd,
                                         .ape = w.ape,
                                         .norm = w.norm,
                                         .rope_freqs = freqs,
                                         .shape = shape,
                                         .batch = cb,
                                         .entries = entries},
                                        bs),
                   "CompressorStep");
}

// The raw KV's branch, the query's norm, the indexer's query branch, wq_b and the heads' norm.
absl::Status AttentionLayer::KvAndQuery() {
  // wq_a and the KV latent's wkv (Projections, in one launch in decode; one each for longer
  // chunks), then on a branch the latent's norm, RoPE and FP8 simulation, and the chunks' raw KV
  // as records in the step's staging (read by the attention through the candidate lists).
  CUDA_RETURN_IF_ERROR(br.Fork(kBranchKv, st));
  CUDA_RETURN_IF_ERROR(cuda::RmsNorm(sc.kva, b.kv_norm, T, Dh, eps, sc.kv, bs_kv));
  CUDA_RETURN_IF_ERROR(cuda::ApplyRope(sc.kv, T, 1, Dh, rd, cs, sn, false, bs_kv));
  CUDA_RETURN_IF_ERROR(cuda::Fp8SimInplace(sc.kv, T, Dh, Dh - rd, 64, rounds, bs_kv));
  CUDA_RETURN_IF_ERROR(cuda::KvStageRecords(geom, tok, T, sc.kv, bs_kv));
  CUDA_RETURN_IF_ERROR(br.Done(kBranchKv));

  // The query: wq_a's output's norm and quantisation (qbuf2, shared with the indexer's wq_b),
  // wq_b, the per-head norm and RoPE.
  CUDA_RETURN_IF_ERROR(
      cuda::RmsNormQuant(sc.qa, b.q_norm, T, qlr, eps, sc.qr, sc.qbuf2, sc.sbuf2, st));
  if (b.has_indexer) RETURN_IF_ERROR(IndexerSelect());
  CUDA_RETURN_IF_ERROR(Gemv8(b.wq_b, sc.qbuf2, sc.sbuf2, T, sc.q, st));
  CUDA_RETURN_IF_ERROR(cuda::HeadRmsNormRope(sc.q, T, H, Dh, eps, rd, cs, sn, st));
  if (b.has_indexer) CUDA_RETURN_IF_ERROR(br.Wait(st, kBranchIndexQ));
  return absl::OkStatus();
}

// The indexer's query from qbuf2, then (with the new keys) each chunk's scores and top-k
// selections, which stay on the device (sel_base: where KvBuildCandidates reads), on one branch.
absl::Status AttentionLayer::IndexerSelect() {
  void* const topk_scratch = s.topk_scratch;
  CUDA_RETURN_IF_ERROR(br.Fork(kBranchIndexQ, st));
  CUDA_RETURN_IF_ERROR(Gemv8(b.index_wq_b, sc.qbuf2, sc.sbuf2, T, sc.iq, bs_iq));
  CUDA_RETURN_IF_ERROR(cuda::IndexerPrepQ(sc.iq, T, nh, ihd, rd, cs, sn, fp64_, bs_iq));
  CUDA_RETURN_IF_ERROR(br.Wait(bs_iq, kBranchIndex));
  CUDA_RETURN_IF_ERROR(br.Wait(bs_iq, kBranchIndexW));
  if (plan.index_one_launch && plan.index_k > 0) {
    CUDA_RETURN_IF_ERROR(cuda::KvIndexerScoresTokens({.q = sc.iq,
                                                      .w = sc.iw,
                                                      .g = geom,
                                                      .positions = sc.pos,
                                                      .T = T,
                                                      .heads = nh,
                                                      .ratio = 4,
                                                      .n_cols = plan.index_cols,
                                                      .scores = im.scores.as<float>()},
                                                     tok, bs_iq));
    CUDA_RETURN_IF_ERROR(cuda::IndexerTopK(im.scores.as<float>(), T, plan.index_cols, plan.index_k,
                                           im.sel.as<int32_t>(), topk_scratch, bs_iq));
  }
  for (size_t i = 0; i < nc && !plan.index_one_launch; ++i) {
    if (n_sel[i] == 0) continue;
    const int64_t S = row0[i + 1] - row0[i], slice = plan.score_rows[i];
    // Scores straight from the chunk's MXFP4 keys in the pool (decoded per staged tile), for
    // `slice` rows at a time (each row's scores and selections depend on that row alone).
    for (int64_t r0 = 0; r0 < S; r0 += slice) {
      const int64_t rows = std::min(slice, S - r0), t0 = row0[i] + r0;
      CUDA_RETURN_IF_ERROR(cuda::KvIndexerScores({.q = sc.iq + t0 * nh * ihd,
                                                  .w = sc.iw + t0 * nh,
                                                  .g = geom,
                                                  .positions = sc.pos + t0,
                                                  .T = rows,
                                                  .heads = nh,
                                                  .ratio = 4,
                                                  .n_cols = n_cols[i],
                                                  .scores = im.scores.as<float>()},
                                                 s.dtables + table_off[i],
                                                 table_off[i + 1] - table_off[i], bs_iq));
      CUDA_RETURN_IF_ERROR(cuda::IndexerTopK(im.scores.as<float>(), rows, n_cols[i], n_sel[i],
                                             im.sel.as<int32_t>() + sel_base[i] + r0 * n_sel[i],
                                             topk_scratch, bs_iq));
    }
  }
  CUDA_RETURN_IF_ERROR(br.Done(kBranchIndexQ));
  return absl::OkStatus();
}

// Every token's candidate list (record addresses: the staged raw KV, the rings, the compressed
// entries), one attention launch for all sequences (ending in the output's inverse RoPE; per
// attn_rows tokens in prefill), then the last W positions of each chunk into its ring records.
// Where one launch covers all T tokens the candidates' rows are decoded with the candidate list.
absl::Status AttentionLayer::Attention() {
  const int64_t attn_rows = s.attn_rows;
  CUDA_RETURN_IF_ERROR(br.Wait(st, kBranchKv));
  if (b.has_compressor) CUDA_RETURN_IF_ERROR(br.Wait(st, kBranchComp));
  uint64_t* cand = im.cand.as<uint64_t>();
  const bool one_launch = attn_rows >= T;
  CUDA_RETURN_IF_ERROR(
      cuda::KvBuildCandidates(geom, tok, T, im.sel.as<int32_t>(), n_cand[l], cand, st,
                              one_launch ? im.kvrows.as<cuda::bf16_t>() : nullptr));
  for (int64_t t0 = 0; t0 < T; t0 += attn_rows) {
    const int64_t n = std::min(attn_rows, T - t0);
    CUDA_RETURN_IF_ERROR(cuda::KvSparseAttention({.q = sc.q + t0 * H * Dh,
                                                  .cand = cand + t0 * n_cand[l],
                                                  .sink = b.sink,
                                                  .T = n,
                                                  .n_heads = H,
                                                  .head_dim = Dh,
                                                  .nope = kvl.nope,
                                                  .n_cand = n_cand[l],
                                                  .scale = scale,
                                                  .out = sc.o + t0 * H * Dh,
                                                  .rows = im.kvrows.as<cuda::bf16_t>(),
                                                  .rows_decoded = one_launch,
                                                  .rope_cos = cs + t0 * (rd / 2),
                                                  .rope_sin = sn + t0 * (rd / 2),
                                                  .rope_dim = rd},
                                                 st));
  }
  // The chunks' last W positions into the rings (read again by the next step's attention), off
  // the critical path: the next layer's kv work follows it on the same branch, and the step joins
  // the branch after its last layer.
  CUDA_RETURN_IF_ERROR(br.Fork(kBranchKv, st));
  CUDA_RETURN_IF_ERROR(cuda::KvRingRecords(geom, tok, T, sc.kv, bs_kv));
  CUDA_RETURN_IF_ERROR(br.Done(kBranchKv));
  return absl::OkStatus();
}

// wo_a, wo_b and the sublayer's HcPost into sc.mid.
absl::Status AttentionLayer::Output() {
  CUDA_RETURN_IF_ERROR(cuda::GroupedOutputProjection(sc.o, T, G, c.o_lora_rank, H * Dh / G,
                                                     b.wo_a.w, b.wo_a.s, sc.z, st));
  // TP 1: wo_b runs the HcPost in its epilogue (decode); TP > 1: the HcPost rounds the
  // all-reduced sum itself.
  const cuda::HcPostOperands attn_post{cuda::Raw(sc.h),  sc.post, sc.comb, hc, dim,
                                       cuda::Raw(sc.mid)};
  if (s.defer_comb) CUDA_RETURN_IF_ERROR(br.Wait(st, kBranchHc));
  if (im.tp == 1) {
    CUDA_RETURN_IF_ERROR(cuda::QuantizeActE4m3(sc.z, T, b.wo_b.in, sc.qbuf, sc.sbuf, st));
    CUDA_RETURN_IF_ERROR(cuda::Fp8LinearHcPost({.q = sc.qbuf,
                                                .s_act = sc.sbuf,
                                                .rows = T,
                                                .w = b.wo_b.w,
                                                .w_scale = b.wo_b.s,
                                                .out = b.wo_b.out,
                                                .in = b.wo_b.in,
                                                .y = sc.attn,
                                                .hp = attn_post},
                                               st));
  } else {
    CUDA_RETURN_IF_ERROR(Lin8(b.wo_b, sc.z, T, sc, sc.part, st));
    RETURN_IF_ERROR(AllReduceParts(s, l, T * dim, kAttnArBegin));
    CUDA_RETURN_IF_ERROR(cuda::HcPostF32(sc.part, T, attn_post, st));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchAttentionSublayer(StepState& s, int l) { return AttentionLayer(s, l).Run(); }

}  // namespace ss::gpu::cuda_backend_internal
