#include "gpu_worker/cuda/cuda_backend_kv.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/kv_cost_model.h"
#include "common/status.h"
#include "gpu_worker/cuda_status.h"
#include "gpu_worker/kernels/compressor.h"
#include "gpu_worker/kernels/paged_kv.h"
#include "gpu_worker/memory_plan.h"

namespace ss::gpu {
namespace {

// Each compressor's kv | score pair starts on a 256-byte boundary, as its own cudaMalloc did.
constexpr int64_t kStateAlignFloats = 64;

}  // namespace

absl::StatusOr<KvLayout> KvLayout::Create(const ModelConfig& c, int first_layer, int end_layer,
                                          int64_t block_tokens, bool fp8_records) {
  KvLayout k;
  k.block_tokens = block_tokens;
  k.rope = c.rope_head_dim;
  k.nope = c.head_dim - c.rope_head_dim;
  k.key_dim = c.index_head_dim;
  if (k.nope < 64 || k.nope % 64 != 0 || k.rope % 4 != 0 || k.rope > 256 || k.nope > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("paged KV: head_dim ", c.head_dim, " with rope_head_dim ", c.rope_head_dim,
                     " is no fp8_ds_mla record (nope a positive multiple of 64)"));
  }
  if (!fp8_records) {
    k.nope = 0;
    k.rope = c.head_dim;
  }
  k.record_bytes = cuda::KvRecordBytes(k.nope, k.rope);
  k.key_bytes = cuda::KvKeyBytes(k.key_dim);
  k.window = c.window_size;
  int64_t off = 0;
  for (int l = first_layer; l < end_layer; ++l) {
    Layer y;
    y.ratio = c.compress_ratio(l);
    if (y.ratio > 0) {
      if (block_tokens % y.ratio != 0 || block_tokens % 4 != 0) {
        return absl::InvalidArgumentError(absl::StrCat("paged KV: kv_block_tokens ", block_tokens,
                                                       " is not a multiple of layer ", l,
                                                       "'s compress ratio ", y.ratio));
      }
      y.main_off = off;
      off += block_tokens / y.ratio * k.record_bytes;
      if (y.ratio == 4) {
        if (k.key_dim % 32 != 0) {
          return absl::InvalidArgumentError("paged KV: index_head_dim not a multiple of 32");
        }
        y.has_indexer = true;
        y.key_off = off;
        off += block_tokens / 4 * k.key_bytes;
      }
    }
    k.layers.push_back(y);
  }
  // The block size and the window packing are the cost model's, the coordinator's and the
  // memory plan's figures; the entry sizes and the offsets above must agree with them.
  sched::KvCostOptions ko;
  ko.block_tokens = block_tokens;
  ko.first_layer = first_layer;
  ko.end_layer = end_layer;
  ko.include_mtp = false;
  ko.indexer_keys = sched::IndexerKeyFormat::kMxfp4;
  ko.main_entries = fp8_records ? sched::MainEntryFormat::kFp8DsMla : sched::MainEntryFormat::kBf16;
  ASSIGN_OR_RETURN(const sched::KvCostModel cost, sched::KvCostModel::FromModelConfig(c, ko));
  k.block_bytes = cost.block_bytes;
  k.win_per_block = cost.windows_per_block;
  k.window_blocks = cost.fixed_blocks;
  // One sequence's compressor states: kv | score of coff·m × coff·d floats per compressor.
  int64_t state_bytes = 0;
  auto carve = [&](int64_t ratio, int64_t d, int64_t& at, int64_t& half) {
    const int64_t coff = ratio == 4 ? 2 : 1;
    half = coff * ratio * coff * d;
    at = k.state_floats;
    k.state_floats += (2 * half + kStateAlignFloats - 1) / kStateAlignFloats * kStateAlignFloats;
    state_bytes += 2 * half * 4;
  };
  for (Layer& y : k.layers) {
    if (y.ratio > 0) carve(y.ratio, c.head_dim, y.comp_state_off, y.comp_n);
    if (y.has_indexer) carve(y.ratio, k.key_dim, y.index_state_off, y.index_n);
  }
  // A resume snapshot's carried slots: of every ratio-4 layer's compressors (kv and score each
  // [8, 2·d], slot-major), slots 0..3, the first half of kv and of score.
  for (const Layer& y : k.layers) {
    if (y.ratio != 4) continue;
    for (auto [at, half] :
         {std::pair{y.comp_state_off, y.comp_n}, {y.index_state_off, y.index_n}}) {
      if (at < 0) continue;
      k.carry.push_back({at, half / 2 * 4});
      k.carry.push_back({at + half, half / 2 * 4});
      k.carry_bytes += half * 4;
    }
  }
  k.snapshot_blocks = k.window_blocks + (k.carry_bytes + k.block_bytes - 1) / k.block_bytes;
  if (cost.entry_bytes != k.record_bytes || cost.index_entry_bytes != k.key_bytes ||
      cost.state_bytes != state_bytes || cost.carry_bytes != k.carry_bytes ||
      cost.snapshot_blocks != k.snapshot_blocks ||
      (off > 0 && (off + 7) / 8 * 8 != k.block_bytes) ||
      k.win_per_block * k.record_bytes > k.block_bytes ||
      k.window_blocks * k.win_per_block < static_cast<int64_t>(k.layers.size()) * k.window) {
    return absl::InternalError(absl::StrCat(
        "paged KV: the pool's layout (records of ", k.record_bytes, " B, keys of ", k.key_bytes,
        " B, ", off, " B of entries per block, ", state_bytes, " B of compressor state, ",
        k.carry_bytes, " B carried by a snapshot in ", k.snapshot_blocks,
        " blocks) disagrees with the KV cost model ", cost.DebugString()));
  }
  return k;
}

std::vector<int32_t> KvLayout::StageTable(std::span<const int32_t> table, int64_t table_fixed,
                                          std::string* error) const {
  const int64_t fixed = table_fixed == 0 ? window_blocks : table_fixed;
  if (fixed < window_blocks || static_cast<int64_t>(table.size()) < fixed) {
    *error =
        absl::StrCat("a block table of ", table.size(), " blocks with ", fixed,
                     " fixed blocks does not hold this stage's ", window_blocks, " window blocks");
    return {};
  }
  std::vector<int32_t> out(table.begin(), table.begin() + window_blocks);
  out.insert(out.end(), table.begin() + fixed, table.end());
  return out;
}

cuda::KvGeom KvLayout::Geom(int l, const uint8_t* pool) const {
  cuda::KvGeom g;
  const Layer& y = layers[l];
  g.pool = reinterpret_cast<uint64_t>(pool);
  g.block_bytes = block_bytes;
  g.nope = static_cast<int32_t>(nope);
  g.rope = static_cast<int32_t>(rope);
  g.record_bytes = static_cast<int32_t>(record_bytes);
  g.window = static_cast<int32_t>(window);
  g.win_per_block = static_cast<int32_t>(win_per_block);
  g.win_base = static_cast<int32_t>(l * window);
  g.first_entry_block = static_cast<int32_t>(window_blocks);
  g.ratio = static_cast<int32_t>(y.ratio);
  g.entries_per_block = y.ratio > 0 ? static_cast<int32_t>(block_tokens / y.ratio) : 1;
  g.main_off = static_cast<int32_t>(y.main_off);
  g.key_dim = static_cast<int32_t>(key_dim);
  g.keys_per_block = static_cast<int32_t>(block_tokens / 4);
  g.key_off = static_cast<int32_t>(y.key_off);
  return g;
}

std::string KvFit::Describe() const {
  return absl::StrCat("free ", GiB(free_bytes), " holds reserve ", GiB(reserve_bytes),
                      " + compressor state ", GiB(sequences * state_bytes), " (", sequences,
                      " sequences x ", MiB(state_bytes), ") + KV pool ", GiB(pool_bytes), " (",
                      pool_blocks, " blocks: ", kv_tokens, " tokens)");
}

absl::StatusOr<KvFit> FitKvPool(const KvLayout& layout, int64_t kv_tokens, int64_t extra_sequences,
                                int64_t free_bytes, int64_t reserve_bytes, int64_t sequences) {
  if (kv_tokens < 0 || extra_sequences < 0 || free_bytes < 0 || reserve_bytes < 0 ||
      sequences < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV pool fit: kv_tokens ", kv_tokens, ", extra sequences ", extra_sequences, ", free ",
        free_bytes, " B, reserve ", reserve_bytes, " B, sequences ", sequences));
  }
  KvFit f;
  f.free_bytes = free_bytes;
  f.reserve_bytes = reserve_bytes;
  f.sequences = sequences;
  f.state_bytes = layout.state_floats * 4;
  const int64_t room = free_bytes - reserve_bytes - sequences * f.state_bytes;
  const int64_t extra = layout.PoolBlocks(0, extra_sequences);
  if (kv_tokens == 0) {
    const int64_t blocks = layout.block_bytes > 0 && room > 0 ? room / layout.block_bytes : 0;
    f.kv_tokens = (blocks - extra) * layout.block_tokens;
    f.pool_blocks = blocks;
  } else {
    f.kv_tokens = kv_tokens;
    f.pool_blocks = layout.PoolBlocks(kv_tokens, extra_sequences);
  }
  f.pool_bytes = f.pool_blocks * layout.block_bytes;
  if (f.kv_tokens < 1 || f.pool_bytes > room) {
    const int64_t need = kv_tokens > 0 ? f.pool_bytes : (extra + 1) * layout.block_bytes;
    return absl::FailedPreconditionError(absl::StrCat(
        "the KV pool does not fit on the device: of ", GiB(free_bytes), " free, the reserve takes ",
        GiB(reserve_bytes), " and ", sequences, " sequences' compressor states ",
        GiB(sequences * f.state_bytes), ", leaving ", GiB(std::max<int64_t>(room, 0)),
        " for a pool that needs ", GiB(need), " (",
        kv_tokens > 0 ? absl::StrCat(kv_tokens, " tokens") : std::string("one block"), " plus ",
        extra,
        " window blocks); lower --kv_tokens (0 sizes the pool to the free memory), the "
        "running sequences or the layers per GPU"));
  }
  return f;
}

KvPool::~KvPool() {
  ReleaseAll();
  cudaFree(pool_);
}

absl::Status KvPool::Init(const KvLayout& layout, int64_t kv_tokens, int64_t extra_sequences) {
  layout_ = layout;
  n_blocks_ = layout.PoolBlocks(kv_tokens, extra_sequences);
  if (n_blocks_ > 0x7fffffff) return absl::InvalidArgumentError("paged KV: too many blocks");
  const size_t bytes = static_cast<size_t>(n_blocks_ * layout.block_bytes);
  RETURN_IF_ERROR(
      CudaCheck(cudaMalloc(&pool_, std::max<size_t>(bytes, 256)), "cudaMalloc(KV pool)"));
  // Zeroed records decode to 0 (benchmark sequences read them unwritten).
  RETURN_IF_ERROR(CudaCheck(cudaMemset(pool_, 0, bytes), "cudaMemset(KV pool)"));
  free_.clear();
  for (int64_t b = n_blocks_ - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
  return absl::OkStatus();
}

absl::Status KvPool::Check(std::span<const uint64_t> seq_ids, std::span<const int64_t> ends,
                           std::span<const std::span<const int32_t>> tables) const {
  int external = -1;  // the pool's current kind, from its live sequences
  for (const auto& [id, s] : seqs_) {
    external = s.external ? 1 : 0;
    break;
  }
  int64_t need_own = 0;
  for (size_t i = 0; i < seq_ids.size(); ++i) {
    const bool ext = !tables[i].empty();
    const KvSeq* s = Find(seq_ids[i]);
    const int kind = ext ? 1 : 0;
    if (external >= 0 && external != kind && !(s != nullptr && seqs_.size() == 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", seq_ids[i],
                       ": a KV pool serves either the step plan's block tables or "
                       "its own allocator, not both at once"));
    }
    external = kind;
    const int64_t need = layout_.BlocksFor(ends[i]);
    if (ext) {
      if (static_cast<int64_t>(tables[i].size()) < need) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", seq_ids[i], ": its block table has ", tables[i].size(),
                         " blocks, and positions [0, ", ends[i], ") need ", need, " (",
                         layout_.window_blocks, " window blocks + ", need - layout_.window_blocks,
                         " blocks of ", layout_.block_tokens, " tokens)"));
      }
      for (int64_t k = 0; k < need; ++k) {
        const int32_t b = tables[i][k];
        if (b < 0 || b >= n_blocks_) {
          return absl::InvalidArgumentError(absl::StrCat("sequence ", seq_ids[i], ": block ", b,
                                                         " is outside the KV pool's ", n_blocks_,
                                                         " blocks"));
        }
      }
    } else {
      const int64_t have = s != nullptr && !s->external ? static_cast<int64_t>(s->table.size()) : 0;
      need_own += std::max<int64_t>(0, need - have);
    }
  }
  if (need_own > free_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV pool: the batch needs ", need_own,
                                                     " more blocks, ", free_blocks(), " free"));
  }
  return absl::OkStatus();
}

absl::Status KvPool::CheckSnapshot(std::span<const int32_t> blocks, const std::string& what) const {
  if (static_cast<int64_t>(blocks.size()) < layout_.snapshot_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a snapshot takes ", layout_.snapshot_blocks, " blocks (",
                     layout_.window_blocks, " window blocks + ", layout_.carry_bytes,
                     " B of compressor slots), ", blocks.size(), " given"));
  }
  for (int64_t k = 0; k < layout_.snapshot_blocks; ++k) {
    if (blocks[k] < 0 || blocks[k] >= n_blocks_) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": snapshot block ", blocks[k],
                                                     " is outside the KV pool's ", n_blocks_,
                                                     " blocks"));
    }
  }
  return absl::OkStatus();
}

absl::Status KvPool::CopyCarry(float* states, std::span<const int32_t> blocks, bool to_snapshot,
                               cudaStream_t stream) {
  const int64_t bb = layout_.block_bytes;
  int64_t at = 0;  // the byte stream's offset
  for (const KvLayout::CarryPiece& p : layout_.carry) {
    char* state = reinterpret_cast<char*>(states + p.state_off);
    for (int64_t done = 0; done < p.bytes;) {
      const int64_t k = layout_.window_blocks + at / bb, in = at % bb;
      const int64_t n = std::min(p.bytes - done, bb - in);
      char* block = reinterpret_cast<char*>(pool_) + blocks[k] * bb + in;
      RETURN_IF_ERROR(CudaCheck(
          cudaMemcpyAsync(to_snapshot ? block : state + done, to_snapshot ? state + done : block,
                          static_cast<size_t>(n), cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpyAsync(snapshot carried slots)"));
      done += n;
      at += n;
    }
  }
  return absl::OkStatus();
}

absl::Status KvPool::SaveSnapshot(const KvSeq& seq, std::span<const int32_t> blocks,
                                  cudaStream_t stream) {
  const int64_t bb = layout_.block_bytes;
  for (int64_t k = 0; k < layout_.window_blocks; ++k) {
    RETURN_IF_ERROR(
        CudaCheck(cudaMemcpyAsync(pool_ + blocks[k] * bb, pool_ + seq.table[k] * bb,
                                  static_cast<size_t>(bb), cudaMemcpyDeviceToDevice, stream),
                  "cudaMemcpyAsync(snapshot window block)"));
  }
  return CopyCarry(seq.states, blocks, true, stream);
}

absl::Status KvPool::Prepare(uint64_t seq_id, int64_t start, int64_t end,
                             std::span<const int32_t> table, std::span<const int32_t> restore,
                             cudaStream_t stream) {
  KvSeq& s = seqs_[seq_id];
  const int64_t need = layout_.BlocksFor(end);
  if (!table.empty()) {
    if (!s.external) {
      for (int32_t b : s.table) free_.push_back(b);
    }
    s.external = true;
    s.table.assign(table.begin(), table.begin() + need);
  } else {
    if (s.external) s.table.clear();
    s.external = false;
    while (static_cast<int64_t>(s.table.size()) < need) {
      if (free_.empty()) return absl::ResourceExhaustedError("KV pool: out of blocks");
      s.table.push_back(free_.back());
      free_.pop_back();
    }
  }
  if (s.layers.size() != layout_.layers.size()) {
    if (layout_.state_floats > 0) {
      if (!free_states_.empty()) {
        s.states = free_states_.back();
        free_states_.pop_back();
      } else {
        RETURN_IF_ERROR(CudaCheck(cudaMalloc(&s.states, layout_.state_floats * 4),
                                  "cudaMalloc(compressor states)"));
        ++state_allocations_;
      }
    }
    s.layers.assign(layout_.layers.size(), KvSeq::Layer{});
    for (size_t l = 0; l < layout_.layers.size(); ++l) {
      const KvLayout::Layer& y = layout_.layers[l];
      KvSeq::Layer& k = s.layers[l];
      if (y.comp_state_off >= 0) k.comp_state = s.states + y.comp_state_off;
      if (y.index_state_off >= 0) k.index_state = s.states + y.index_state_off;
      k.comp_n = y.comp_n;
      k.index_n = y.index_n;
    }
  }
  if (!restore.empty()) {
    if (!s.external) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", seq_id, ": resuming from a snapshot needs the step plan's block table"));
    }
    const int64_t bb = layout_.block_bytes;
    for (int64_t k = 0; k < layout_.window_blocks; ++k) {
      RETURN_IF_ERROR(
          CudaCheck(cudaMemcpyAsync(pool_ + s.table[k] * bb, pool_ + restore[k] * bb,
                                    static_cast<size_t>(bb), cudaMemcpyDeviceToDevice, stream),
                    "cudaMemcpyAsync(restore window block)"));
    }
    RETURN_IF_ERROR(CopyCarry(s.states, restore, false, stream));
    s.resumed = start;
  } else if (start == 0) {
    s.resumed = 0;
    for (KvSeq::Layer& k : s.layers) {
      if (k.comp_state != nullptr) {
        RETURN_IF_ERROR(CudaCheck(
            cuda::CompressorResetState(k.comp_state, k.comp_state + k.comp_n, k.comp_n, stream),
            "CompressorResetState"));
      }
      if (k.index_state != nullptr) {
        RETURN_IF_ERROR(CudaCheck(
            cuda::CompressorResetState(k.index_state, k.index_state + k.index_n, k.index_n, stream),
            "CompressorResetState"));
      }
    }
  }
  return absl::OkStatus();
}

KvSeq* KvPool::Find(uint64_t seq_id) {
  auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? nullptr : &it->second;
}
const KvSeq* KvPool::Find(uint64_t seq_id) const {
  auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? nullptr : &it->second;
}

void KvPool::Free(KvSeq& s) {
  if (s.states != nullptr) free_states_.push_back(s.states);
  s.states = nullptr;
  s.layers.clear();
  if (!s.external) {
    for (int32_t b : s.table) free_.push_back(b);
  }
  s.table.clear();
}

void KvPool::Release(uint64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  Free(it->second);
  seqs_.erase(it);
}

void KvPool::ReleaseAll() {
  for (auto& [id, s] : seqs_) Free(s);
  seqs_.clear();
  for (float* p : free_states_) cudaFree(p);
  free_states_.clear();
  state_allocations_ = 0;
}

}  // namespace ss::gpu
