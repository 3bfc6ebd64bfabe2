// Fuzz target: config.json (common/model_config.h) and the cluster config
// (coordinator/cluster_config.h) on arbitrary text. Invariant: a config or an error, never a
// crash; an accepted cluster config survives a JSON round trip and gives every GPU worker a
// role.
#include <cstdint>
#include <string>

#include "common/model_config.h"
#include "coordinator/cluster_config.h"
#include "proto/cluster.pb.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

const ss::ModelConfig& TinyA() {
  static const ss::ModelConfig c = [] {
    auto m = ss::LoadModelConfig(SS_TINY_A_DIR);
    ss::fuzz::Require(m.ok(), "loading tests/data/tiny-a/config.json");
    return *m;
  }();
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ss::fuzz::Input in(data, size);
  const uint8_t which = in.Byte();
  const std::string text(in.Rest());
  if (which & 1) {
    (void)ss::ParseModelConfig(text);
    return 0;
  }
  auto config = ss::coord::ParseClusterConfig(text, TinyA());
  if (!config.ok()) return 0;
  // An accepted config serialises and parses back to the same config, and names a role for
  // every GPU worker.
  const std::string json = ss::coord::ClusterConfigToJson(*config);
  auto again = ss::coord::ParseClusterConfig(json, TinyA());
  ss::fuzz::Require(again.ok(), "ClusterConfigToJson's output does not parse");
  ss::fuzz::Require(ss::coord::ClusterConfigToJson(*again) == json,
                    "the cluster config does not survive a JSON round trip");
  for (const std::string& id : config->GpuWorkerIds()) {
    ss::fuzz::Require(ss::coord::RoleFor(*config, id).ok(), "a configured GPU worker has no role");
  }
  return 0;
}
