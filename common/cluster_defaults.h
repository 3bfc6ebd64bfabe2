// Defaults that more than one process or config must agree on, defined once: the coordinator's
// cluster config (coordinator/cluster_config.h), `splitserve up`, the GPU workers' standalone flags
// and the KV cost model all take them from here.
#pragma once

namespace ss {

// Tokens per paged KV block: a multiple of every compress ratio (4 and 128 for Flash), so every
// block holds whole compressed entries (common/kv_cost_model.h).
inline constexpr int kDefaultKvBlockTokens = 128;

// How often a GPU worker reports to the coordinator (cluster config heartbeat_interval_ms).
inline constexpr int kDefaultHeartbeatIntervalMs = 1000;

// The OpenAI-compatible HTTP API's port (vLLM's): the coordinator's --port and `up --port`.
inline constexpr int kDefaultHttpPort = 8000;

}  // namespace ss
