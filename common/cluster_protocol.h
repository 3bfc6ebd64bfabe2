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
inline constexpr uint32_t kClusterProtocolVersion = 3;

// Bytes of an NCCL unique id (ncclUniqueId; gpu_worker/nccl_comm.h NcclComm::kUniqueIdBytes), as
// the coordinator checks it without NCCL.
inline constexpr size_t kNcclUniqueIdBytes = 128;

// The Rendezvous group name of stage `stage`'s TP group.
inline std::string TpGroupName(int stage) { return "tp/stage" + std::to_string(stage); }

}  // namespace ss
