// The version of proto/cluster.proto's semantics (control plane, step stream, stage transfer),
// checked at registration, on every Status / Steps / PushStreams call, and refused with a status
// naming both versions. Bump on any change of a field's meaning (STYLE.md "Wire formats are
// versioned").
#pragma once

#include <cstdint>
#include <string>

namespace ss {

// 2: TP in the processes (LayerExperts.slice_count, the TP group's NCCL id relayed by Rendezvous,
// plans fanned out to every TP rank, stage transfer rank r -> rank r).
// 3: StageStreams.bf16 (stage transfer in bf16 when the streams are bf16-exact).
// 4: Role.stage_transport and the stage links' ids "pp/stage<s>/rank<r>" (the nccl transport).
// 5: HeartbeatRequest.progress (a micro-batch stalls only while its workers show no progress).
// 6: SamplingParams.logit_bias and min_p.
// 7: SamplingParams penalties and prompt_tokens; SeqChunk.banned_tokens and allowed_tokens.
// 8: prefix caching: SeqChunk.restore_snapshot, StepPlan.save_snapshots and drop_snapshots.
inline constexpr uint32_t kClusterProtocolVersion = 8;

// Bytes of an NCCL unique id (ncclUniqueId; gpu_worker/nccl_comm.h NcclComm::kUniqueIdBytes), as
// the coordinator checks it without NCCL.
inline constexpr size_t kNcclUniqueIdBytes = 128;

// The Rendezvous group name of stage `stage`'s TP group.
inline std::string TpGroupName(int stage) { return "tp/stage" + std::to_string(stage); }

// The Rendezvous group name of the nccl stage transport's link from stage `stage`'s TP rank
// `rank` to stage + 1's (gpu_worker/stage_link.h); the sending worker publishes it.
inline std::string PpLinkName(int stage, int rank) {
  return "pp/stage" + std::to_string(stage) + "/rank" + std::to_string(rank);
}

}  // namespace ss
