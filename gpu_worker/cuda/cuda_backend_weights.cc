// The cuda backend's weight upload: the stage's tensors copied from the checkpoint's mmap to the
// device in their own formats, a TP rank's share sliced on the host (cuda_backend.h "Tensor
// parallelism").
#include <cstring>

#include "common/status.h"
#include "gpu_worker/cuda/cuda_backend_internal.h"

namespace ss::gpu {

absl::StatusOr<void*> CudaBackend::Impl::Upload(const void* src, size_t bytes) {
  void* p = nullptr;
  CUDA_RETURN_IF_ERROR(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
  allocations.push_back(p);
  CUDA_RETURN_IF_ERROR(cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice));
  weight_bytes += static_cast<int64_t>(bytes);
  if (load_progress) load_progress->Add(static_cast<int64_t>(bytes));
  return p;
}
absl::StatusOr<const float*> CudaBackend::Impl::F32(const std::vector<float>& v) {
  ASSIGN_OR_RETURN(void* p, Upload(v.data(), v.size() * 4));
  return static_cast<const float*>(p);
}
absl::StatusOr<DevFp8> CudaBackend::Impl::Fp8(const model::Fp8Weight& w) {
  return Fp8Rows(w, {0, w.out});
}
// Output rows r of an FP8 weight (r.begin a multiple of 128: whole scale rows).
absl::StatusOr<DevFp8> CudaBackend::Impl::Fp8Rows(const model::Fp8Weight& w, Share r) {
  DevFp8 d{nullptr, nullptr, r.size(), w.in};
  if (r.size() == 0) return d;
  const int64_t nbi = (w.in + 127) / 128;
  ASSIGN_OR_RETURN(void* pw, Upload(w.w + r.begin * w.in, static_cast<size_t>(r.size() * w.in)));
  ASSIGN_OR_RETURN(void* ps, Upload(w.s + r.begin / 128 * nbi,
                                    static_cast<size_t>((r.size() + 127) / 128 * nbi)));
  d.w = cuda::AsE4m3(static_cast<const uint8_t*>(pw));
  d.s = cuda::AsUe8m0(static_cast<const uint8_t*>(ps));
  return d;
}
// Input columns k of an FP8 weight (k.begin a multiple of 128), copied row by row.
absl::StatusOr<DevFp8> CudaBackend::Impl::Fp8Cols(const model::Fp8Weight& w, Share k) {
  DevFp8 d{nullptr, nullptr, w.out, k.size()};
  if (k.size() == 0) return d;
  const int64_t nbo = (w.out + 127) / 128, nbi = (w.in + 127) / 128;
  const int64_t kb0 = k.begin / 128, nbk = (k.size() + 127) / 128;
  std::vector<uint8_t> hw(w.out * k.size()), hs(nbo * nbk);
  for (int64_t o = 0; o < w.out; ++o) {
    std::memcpy(hw.data() + o * k.size(), w.w + o * w.in + k.begin, k.size());
  }
  for (int64_t b = 0; b < nbo; ++b) std::memcpy(hs.data() + b * nbk, w.s + b * nbi + kb0, nbk);
  ASSIGN_OR_RETURN(void* pw, Upload(hw.data(), hw.size()));
  ASSIGN_OR_RETURN(void* ps, Upload(hs.data(), hs.size()));
  d.w = cuda::AsE4m3(static_cast<const uint8_t*>(pw));
  d.s = cuda::AsUe8m0(static_cast<const uint8_t*>(ps));
  return d;
}
absl::StatusOr<DevBf16> CudaBackend::Impl::Bf16(const model::Bf16Matrix& m) {
  return Bf16Rows(m, {0, m.rows});
}
absl::StatusOr<DevBf16> CudaBackend::Impl::Bf16Rows(const model::Bf16Matrix& m, Share r) {
  ASSIGN_OR_RETURN(
      void* p, Upload(m.data + r.begin * m.cols * 2, static_cast<size_t>(r.size() * m.cols * 2)));
  return DevBf16{cuda::AsBf16(static_cast<const uint16_t*>(p)), r.size(), m.cols};
}
absl::StatusOr<DevHc> CudaBackend::Impl::Hc(const model::HcWeights& h) {
  DevHc d;
  ASSIGN_OR_RETURN(d.fn, F32(h.fn));
  ASSIGN_OR_RETURN(d.base, F32(h.base));
  ASSIGN_OR_RETURN(d.scale, F32(h.scale));
  return d;
}
absl::StatusOr<DevCompressor> CudaBackend::Impl::Compressor(const model::CompressorWeights& c) {
  DevCompressor d;
  ASSIGN_OR_RETURN(d.ape, F32(c.ape));
  ASSIGN_OR_RETURN(d.wkv, Bf16(c.wkv));
  ASSIGN_OR_RETURN(d.wgate, Bf16(c.wgate));
  ASSIGN_OR_RETURN(d.norm, F32(c.norm));
  d.width = c.wkv.rows;
  return d;
}
// Block weights of this rank (cuda_backend.h "Tensor parallelism"; at TP = 1 every share is the
// whole tensor).
absl::StatusOr<DevBlock> CudaBackend::Impl::Block(const ModelConfig& c,
                                                  const model::BlockWeights& b) {
  DevBlock d;
  const model::AttentionWeights& a = b.attn;
  const int64_t Hr = c.n_heads / tp, Gr = c.o_groups / tp;
  const Share heads{rank * Hr, (rank + 1) * Hr};
  const Share group_rows{rank * Gr * c.o_lora_rank, (rank + 1) * Gr * c.o_lora_rank};
  d.ratio = a.ratio;
  ASSIGN_OR_RETURN(d.attn_norm, F32(b.attn_norm));
  ASSIGN_OR_RETURN(d.ffn_norm, F32(b.ffn_norm));
  ASSIGN_OR_RETURN(d.hc_attn, Hc(b.hc_attn));
  ASSIGN_OR_RETURN(d.hc_ffn, Hc(b.hc_ffn));
  ASSIGN_OR_RETURN(d.sink, F32(std::vector<float>(a.attn_sink.begin() + heads.begin,
                                                  a.attn_sink.begin() + heads.end)));
  ASSIGN_OR_RETURN(d.wq_a, Fp8(a.wq_a));
  ASSIGN_OR_RETURN(d.wq_b, Fp8Rows(a.wq_b, {heads.begin * c.head_dim, heads.end * c.head_dim}));
  ASSIGN_OR_RETURN(d.wkv, Fp8(a.wkv));
  ASSIGN_OR_RETURN(d.wo_a, Fp8Rows(a.wo_a, group_rows));
  ASSIGN_OR_RETURN(d.wo_b, tp == 1 ? Fp8(a.wo_b) : Fp8Cols(a.wo_b, group_rows));
  ASSIGN_OR_RETURN(d.q_norm, F32(a.q_norm));
  ASSIGN_OR_RETURN(d.kv_norm, F32(a.kv_norm));
  d.has_compressor = a.has_compressor;
  d.has_indexer = a.has_indexer;
  if (a.has_compressor) {
    ASSIGN_OR_RETURN(d.compressor, Compressor(a.compressor));
  }
  if (a.has_indexer) {
    ASSIGN_OR_RETURN(d.index_compressor, Compressor(a.indexer.compressor));
    ASSIGN_OR_RETURN(d.index_wq_b, Fp8(a.indexer.wq_b));
    ASSIGN_OR_RETURN(d.index_weights_proj, Bf16(a.indexer.weights_proj));
  }
  const model::MoeWeights& m = b.moe;
  ASSIGN_OR_RETURN(d.gate, Bf16(m.gate));
  if (m.hash) {
    ASSIGN_OR_RETURN(void* p, Upload(m.tid2eid.data(), m.tid2eid.size() * 4));
    d.tid2eid = static_cast<const int32_t*>(p);
  } else {
    ASSIGN_OR_RETURN(d.bias, F32(m.bias));
  }
  const Share inter = ShareOf(m.shared_w1.out, 128, tp, rank);
  d.shared_inter = inter.size();
  ASSIGN_OR_RETURN(d.shared_w1, Fp8Rows(m.shared_w1, inter));
  ASSIGN_OR_RETURN(d.shared_w2, tp == 1 ? Fp8(m.shared_w2) : Fp8Cols(m.shared_w2, inter));
  ASSIGN_OR_RETURN(d.shared_w3, Fp8Rows(m.shared_w3, inter));
  return d;
}

}  // namespace ss::gpu
