// The coordinator's continuous-batching scheduler: which tokens of which sequences the next
// micro-batch runs, under a token budget, the KV blocks of one pipeline and the pipeline's depth.
// Pure logic: no I/O, no clocks, no threads. The coordinator's step loop feeds it requests,
// cancellations and completed micro-batches, and sends the plans it returns to the GPU workers.
//
// Life of a request
//   Submit() checks the request against the limits (length, KV capacity, queue) and queues it,
//   or refuses it with a SubmitOutcome. Step() admits queued requests in arrival order and plans
//   their prompt in chunks (prefill); a chunk that reaches the end of the prompt samples the
//   first token. From then on every step plans one decode token per sequence. Complete() hands
//   back a micro-batch's sampled tokens; a sequence finishes on EOS / a stop condition reported
//   with its token, or on its max_new_tokens-th token (kLength), and its KV is freed at once.
//   Cancel() (client disconnect, stop string found by the detokenizer) frees the KV at any time.
//
// One step (Step())
//   1. Decode first: one token for every running sequence whose prompt is done and that is not
//      in flight, oldest first, while the token budget lasts (see below for one without room).
//   2. Then chunked prefill, oldest first: first the admitted sequences with prompt left, then
//      the waiting queue in arrival order (FIFO; the queue head blocks the ones behind it). A
//      chunk is min(prompt left, budget left, what its KV blocks can hold).
//   Chunk policy: max_tokens_per_step (the cluster's max_batch_tokens, vLLM's
//   --max-num-batched-tokens) is both the step's token budget and the largest prefill chunk;
//   a prefill chunk gets whatever budget the step's decode tokens leave. Every step that finds a
//   free micro-batch first gives each running decoding sequence that is not in flight its one
//   token (the config requires max_tokens_per_step >= max_running, so the budget always covers
//   them), so a long prompt's chunks never starve decoding: with 8192 tokens a step (`splitserve
//   up` where the cuda backend may stream a chunk's routed experts to the GPU, which reads every
//   expert's weights once per chunk however many tokens it carries), a 32K-token prompt takes
//   four to five steps beside the decodes, each of which gets a token in every one of them.
//   The plan is tagged with a micro-batch id. Up to `num_micro_batches` (= pipeline stages)
//   micro-batches are in flight; a sequence is in at most one of them, so a sequence that is in
//   flight is not planned again until its micro-batch completes.
//
// KV admission: optimistic, with preemption by recompute
//   A request is refused at Submit (kExceedsKvCapacity) when its worst case, prompt +
//   max_new_tokens - 1 processed tokens (the last sampled token is never fed back), does not fit
//   in the whole pool: such a request could never finish. Otherwise it is admitted as soon as
//   its first chunk fits in the free blocks, without reserving its worst case. A prefill chunk
//   shrinks to what its blocks and the free ones can hold. A sequence that cannot hold even one
//   more token (its table is full and no block is free) preempts the youngest sequence that
//   holds KV and arrived after it, and repeats until the token fits; when there is none (it is
//   the youngest), it sits the step out, keeping its blocks. The victim's blocks are freed, its
//   entry leaves the plan being built (or, when it is in flight, its result is dropped when that
//   micro-batch completes) and it goes back to the front of the waiting queue. It will be
//   re-prefilled from position 0 over its prompt and the tokens it has generated so far (recompute:
//   the caller keeps the token ids; a preempted sequence's tokens already reported by Complete stay
//   valid). Newly admitted requests never preempt, and admission stops at the first waiting request
//   that does not fit, so younger requests cannot take blocks from older ones; a step that
//   preempted admits nothing. Priority: the token budget goes to decode first; KV blocks go by
//   arrival order.
//
//   No livelock. Invariant: every sequence holding KV arrived before every waiting request
//   (admission is in arrival order; a preempted sequence goes to the front, and it is younger
//   than every sequence that still holds KV). Claim: in every Step() that finds a free
//   micro-batch slot, the oldest unfinished request is planned at least one token unless it is
//   in flight. If it holds KV it may preempt every other sequence (all younger), after which it
//   alone holds blocks, and its worst case fits in the pool (checked at Submit); it gets budget
//   because the decode phase plans at most max_running - 1 younger sequences and the config
//   requires max_tokens_per_step >= max_running. If nothing holds KV, every block is free and it
//   is admitted (the admission watermark does not apply to an empty pool). It is never
//   preempted (nobody is older), so it finishes after at most (prompt chunks + max_new_tokens)
//   schedulings; then the next oldest is the oldest, and by induction every request finishes.
//   The randomized stress test checks the claim at every step.
//
// Prefix caching (kv_accounting.h; SchedulerConfig::prefix_caching)
//   At admission a request's prompt (after a preemption: prompt and generated tokens) is looked
//   up in the cache: the longest cached prefix of whole blocks with a resume snapshot, at most
//   prefill_target - 1 tokens (the last one is computed to sample), is shared instead of
//   computed, and the first chunk starts there with a restore (StepPlan::restores). Admission
//   counts only the blocks the hit does not bring. Each sequence's prefill is cut so that a chunk
//   ends at its last block boundary S = floor(prefill_target / B) x B, and after that chunk the
//   workers save a snapshot at S (StepPlan::saves), when no snapshot exists there yet and the pool
//   has the blocks to spare (beyond the admission watermark). When a micro-batch completes, the
//   blocks its sequences filled are registered in the cache and its snapshots committed, so the
//   cache only ever holds state that a successful step wrote. Sequences cancelled or preempted
//   in flight register nothing; their snapshots are freed. prefix_cache_queries / hits count the
//   prompt tokens and the cached tokens of every request's first admission (vLLM counts tokens).
//
// In-flight micro-batches and freed blocks
//   Cancel and preemption free a sequence's blocks even when it is in flight, and a later
//   micro-batch may hand those blocks to another sequence. That is safe because every stage
//   runs micro-batches in the order they were planned: at each stage the in-flight one's writes
//   to the block happen before the later one's. Workers must keep that order.
//
// Thread-compatibility: not thread-safe. One thread (the coordinator's step loop) owns a
// Scheduler and calls everything; the gateway's threads hand it submissions and cancellations
// through a queue. No method blocks; none allocates on the steady-state decode path except to
// grow a block table or the plan's vectors past their previous size.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/kv_accounting.h"

namespace ss::sched {

// The caller's request id (unique among the requests the scheduler knows: waiting, running, or
// cancelled while still in flight).
using RequestId = uint64_t;

struct SchedulerConfig {
  // Longest sequence, prompt + max_new_tokens (the model's max_position_embeddings or less).
  int64_t max_model_len = 0;
  // Tokens (decode + prefill) in one micro-batch. Must be >= max_running.
  int64_t max_tokens_per_step = 2048;
  // Sequences holding KV at once (the workers' batch limit).
  int64_t max_running = 256;
  // Requests waiting for admission; a Submit beyond it is kQueueFull (the gateway's 503).
  // Preempted sequences re-enter the queue regardless.
  int64_t max_waiting = 1024;
  // Micro-batches in flight at once: the number of pipeline stages.
  int64_t num_micro_batches = 1;
  // A new request is admitted only if this many blocks stay free after its first chunk (fewer
  // preemptions when decoding sequences grow), unless no sequence holds KV.
  int64_t admission_watermark_blocks = 0;
  // Automatic prefix caching (see the header comment).
  bool prefix_caching = false;
};

struct Request {
  RequestId id = 0;
  int64_t prompt_tokens = 0;
  int64_t max_new_tokens = 0;
  // The prompt's ids (prompt_tokens of them) for prefix caching; empty: this request neither
  // uses nor fills the cache.
  std::span<const int32_t> prompt;
  // False: the request fills the cache but never resumes from it (e.g. its sampler needs the
  // whole prompt's ids on the workers).
  bool reuse_prefix = true;
};

enum class SubmitOutcome {
  kQueued,
  kQueueFull,          // max_waiting requests are waiting: retry later (503 + Retry-After)
  kInvalid,            // prompt_tokens < 1 or max_new_tokens < 1
  kTooLong,            // prompt + max_new_tokens > max_model_len (400 prompt too long)
  kExceedsKvCapacity,  // its worst case does not fit in the whole KV pool: it can never run
  kDuplicateId,        // the id is already known to the scheduler
};

enum class CancelOutcome {
  kCancelled,  // it was waiting or running; its KV is free now
  kUnknownId,  // never submitted, already finished or already cancelled
};

enum class StepOutcome {
  kPlanned,           // `plan` holds a micro-batch to run
  kIdle,              // nothing to run now (nothing queued, or everything runnable in flight)
  kNoFreeMicroBatch,  // num_micro_batches are in flight: complete one first
};

enum class FinishReason {
  kNone,    // not finished
  kEos,     // sampled the end-of-sequence token
  kStop,    // a stop token or stop condition reported by the caller with the token
  kLength,  // max_new_tokens tokens generated (set by the scheduler)
};

std::string_view ToString(SubmitOutcome o);
std::string_view ToString(CancelOutcome o);
std::string_view ToString(StepOutcome o);
std::string_view ToString(FinishReason r);

// One decode token: the sequence feeds its last sampled token at `position` and samples.
struct DecodeEntry {
  RequestId id = 0;
  int64_t position = 0;
  bool operator==(const DecodeEntry&) const = default;
};

// Positions [start, start + length) of a sequence's prompt (after a preemption: prompt and the
// tokens generated before it). `samples` when the chunk ends the prompt: its last position
// samples the next token. A chunk with start == 0 begins a sequence: workers reset its state.
struct PrefillChunk {
  RequestId id = 0;
  int64_t start = 0;
  int64_t length = 0;
  bool samples = false;
  bool operator==(const PrefillChunk&) const = default;
};

// A prefill chunk's sequence resumes from a cached prefix: the workers restore the snapshot in
// `snapshot` (its blocks) before running the chunk, which starts at `tokens`.
struct Restore {
  RequestId id = 0;
  int64_t tokens = 0;
  uint64_t snapshot_id = 0;
  std::vector<int32_t> snapshot;
  bool operator==(const Restore&) const = default;
};

// After the micro-batch ran, the workers save `id`'s resume snapshot at `position` into `blocks`
// under the name `snapshot_id`.
struct Save {
  RequestId id = 0;
  int64_t position = 0;
  uint64_t snapshot_id = 0;
  std::vector<int32_t> blocks;
  bool operator==(const Save&) const = default;
};

// A request admitted in this step for the first time, and its cache hit (0: none).
struct Admission {
  RequestId id = 0;
  int64_t cached_tokens = 0;
  bool operator==(const Admission&) const = default;
};

struct StepPlan {
  uint64_t micro_batch_id = 0;        // consecutive from 0
  std::vector<DecodeEntry> decode;    // oldest first
  std::vector<PrefillChunk> prefill;  // oldest first
  // Sequences preempted while planning this step; their KV is gone (see the header comment).
  std::vector<RequestId> preempted;
  std::vector<Restore> restores;      // prefix caching: chunks that resume from the cache
  std::vector<Save> saves;            // prefix caching: snapshots to save after the chunks
  std::vector<Admission> admissions;  // first admissions
  // Snapshots evicted or abandoned since the previous plan: the workers may forget them.
  std::vector<uint64_t> dropped_snapshots;

  int64_t num_tokens() const;
  void Clear();
};

// A micro-batch's result for one sampling entry: every decode entry, then every prefill chunk
// with `samples`, in plan order.
struct SampledToken {
  RequestId id = 0;
  int32_t token = 0;
  FinishReason finish = FinishReason::kNone;  // kEos / kStop end the sequence
};

// What Complete() accepted: a token to stream to the client, and whether the sequence ended.
// Results of sequences cancelled or preempted since the plan are dropped and have no event.
struct TokenEvent {
  RequestId id = 0;
  int32_t token = 0;
  FinishReason finish = FinishReason::kNone;
  bool operator==(const TokenEvent&) const = default;
};

// Where a request stands (for metrics and tests).
struct RequestStatus {
  bool waiting = false;        // in the waiting queue (false: holds KV)
  bool in_flight = false;      // part of an in-flight micro-batch
  int64_t processed = 0;       // positions whose KV exists or is being computed
  int64_t prefill_target = 0;  // prompt + tokens generated before the last preemption
  int64_t generated = 0;       // tokens reported by Complete
  int64_t preemptions = 0;
  int64_t cached_tokens = 0;  // the prefix cache's hit at the first admission
};

class Scheduler {
 public:
  // InvalidArgument on a config that breaks the limits above or a pool too small for one token.
  static absl::StatusOr<Scheduler> Create(const SchedulerConfig& config, const KvCostModel& cost,
                                          int64_t total_kv_blocks);

  SubmitOutcome Submit(const Request& request);
  // Frees the request's KV now. An in-flight result of it is dropped when its micro-batch
  // completes, and its id may be submitted again only after that.
  CancelOutcome Cancel(RequestId id);
  // Plans the next micro-batch into `plan` (cleared first; its capacity is reused). `plan` is
  // untouched apart from Clear() unless kPlanned.
  StepOutcome Step(StepPlan* plan);
  // Takes back micro-batch `micro_batch_id` with `results` for its sampling entries in plan
  // order, and appends the accepted tokens to `events`. Micro-batches may complete in any order.
  // InvalidArgument, changing nothing, for an id that is not in flight or results that do not
  // match the plan.
  absl::Status Complete(uint64_t micro_batch_id, std::span<const SampledToken> results,
                        std::vector<TokenEvent>* events);

  const SchedulerConfig& config() const { return config_; }
  const KvAccounting& kv() const { return kv_; }
  // Block table of `id` (empty while it holds no KV), valid until the next non-const call.
  std::span<const int32_t> BlockTable(RequestId id) const { return kv_.BlockTable(id); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_in_flight() const;
  // Requests the scheduler knows, cancelled ones still in flight excluded.
  int64_t num_requests() const { return static_cast<int64_t>(index_.size()); }
  bool Contains(RequestId id) const { return index_.contains(id); }
  // False for an unknown id.
  bool GetRequestStatus(RequestId id, RequestStatus* status) const;
  // Prefix cache counters (see the header comment), in tokens.
  int64_t prefix_cache_queries() const { return prefix_queries_; }
  int64_t prefix_cache_hits() const { return prefix_hits_; }

 private:
  struct Seq {
    RequestId id = 0;
    uint64_t arrival = 0;
    int64_t prompt_tokens = 0;
    int64_t max_new_tokens = 0;
    int64_t prefill_target = 0;
    int64_t processed = 0;
    int64_t generated = 0;
    int64_t preemptions = 0;
    int64_t cached_tokens = 0;
    bool admitted_once = false;
    bool reuse_prefix = false;
    std::vector<int32_t> tokens;  // prompt + generated ids, when prefix caching applies
    uint32_t occupancy = 0;       // bumped when the slot is freed: tells stale in-flight entries
    uint32_t incarnation = 0;     // bumped on preemption: its in-flight results are dropped
    bool live = false;
    bool waiting = false;
    bool in_flight = false;
    bool in_plan = false;
    bool plan_decode = false;  // with in_plan: a decode entry, else a prefill chunk
  };
  struct FlightEntry {
    uint32_t slot = 0;
    uint32_t occupancy = 0;
    uint32_t incarnation = 0;
    RequestId id = 0;
    bool samples = false;
    int64_t end = 0;  // the sequence's processed positions once this entry ran
  };
  struct PendingSave {
    uint32_t slot = 0;
    uint32_t occupancy = 0;
    uint32_t incarnation = 0;
    RequestId id = 0;
    int64_t position = 0;
    SnapshotTicket ticket;
  };
  struct MicroBatch {
    bool busy = false;
    uint64_t id = 0;
    int64_t num_sampling = 0;
    std::vector<FlightEntry> entries;  // plan order: decode entries, then prefill chunks
    std::vector<PendingSave> saves;
  };

  Scheduler(const SchedulerConfig& config, KvAccounting kv);

  uint32_t AllocSlot();
  void FreeSlot(uint32_t slot);
  // For a sequence holding KV: the most tokens it can hold with its blocks and the free ones,
  // after preempting younger sequences if it could not hold even one more token.
  int64_t MakeRoom(uint32_t slot, StepPlan* plan, int64_t* budget);
  void PreemptYoungest(StepPlan* plan, int64_t* budget);
  void RemoveRunning(uint32_t slot);
  void Finish(uint32_t slot);
  // Prefix caching: a chunk of `s` from `start` cut to end at its snapshot point, and the save
  // after a chunk that ends there.
  int64_t CutAtSnapshotPoint(const Seq& s, int64_t start, int64_t length) const;
  void MaybeSave(uint32_t slot, int64_t end, StepPlan* plan);
  // Registers a completed micro-batch's blocks and commits or aborts its snapshots.
  void CompleteCache(MicroBatch& mb);

  SchedulerConfig config_;
  KvAccounting kv_;
  std::vector<Seq> slots_;
  std::vector<uint32_t> free_slots_;
  absl::flat_hash_map<RequestId, uint32_t> index_;  // live requests
  // Ids cancelled while in flight: refused by Submit until their micro-batch completes.
  absl::flat_hash_set<RequestId> cancelled_in_flight_;
  std::vector<uint32_t> running_;  // sequences holding KV, in arrival order
  std::deque<uint32_t> waiting_;   // in arrival order
  std::vector<MicroBatch> micro_batches_;
  uint64_t next_arrival_ = 0;
  uint64_t next_micro_batch_ = 0;
  std::vector<PendingSave> planned_saves_;  // this Step's, moved to its micro-batch
  int64_t prefix_queries_ = 0, prefix_hits_ = 0;
};

}  // namespace ss::sched
