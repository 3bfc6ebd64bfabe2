// The GPU worker's flag table (gpu_worker/worker_config.h): each flag parsed, refused with a clear
// error where invalid or where the backend cannot take it, and the expert stores of a rank's
// slices.
#include "gpu_worker/worker_config.h"

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gpu_worker/routed_experts_client.h"
#include "gtest/gtest.h"
#include "tests/gpu_worker/gpu_worker_test_util.h"

namespace ss::gpu {
namespace {

using testing_util::kTinyA;

TEST(GpuWorkerConfig, GpuExpertsAreAutoACountOrAFractionOnTheCudaBackend) {
  WorkerFlags f;
  f.model = kTinyA;
  for (const char* bad : {"-1", "1.5", "x", "nan", "inf", "AUTO", "auto4"}) {
    f.gpu_experts = bad;
    absl::StatusOr<WorkerConfig> r = ParseWorkerConfig(f);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("expected auto, a number"), std::string::npos)
        << r.status();
  }
  for (const char* gpu_only : {"4", "auto"}) {
    f.gpu_experts = gpu_only;
    absl::StatusOr<WorkerConfig> r = ParseWorkerConfig(f);
    ASSERT_FALSE(r.ok()) << gpu_only;  // the cpu backend has no GPU
    EXPECT_NE(r.status().message().find("needs --backend cuda"), std::string::npos) << r.status();
  }
  f.gpu_experts = "0";
  f.gpu_experts_profile = "/p.json";
  EXPECT_FALSE(ParseWorkerConfig(f).ok());  // a profile without experts to place
#ifdef SS_HAVE_CUDA
  f.backend = "cuda";
  f.gpu_experts = "4";
  absl::StatusOr<WorkerConfig> c = ParseWorkerConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gpu_experts, 4);
  EXPECT_EQ(c->gpu_experts_fraction, 0.0);
  EXPECT_EQ(c->gpu_experts_profile, "/p.json");
  f.gpu_experts = "0.25";
  c = ParseWorkerConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gpu_experts, 0);
  EXPECT_EQ(c->gpu_experts_fraction, 0.25);
  EXPECT_EQ(c->gpu_experts_rebalance_s, 10.0);  // on by default
  EXPECT_FALSE(c->gpu_experts_auto);
  f.gpu_experts = "auto";  // with the profile: it places auto's budget
  c = ParseWorkerConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->gpu_experts_auto);
  EXPECT_EQ(c->gpu_experts, 0);
  EXPECT_EQ(c->gpu_experts_fraction, 0.0);
  EXPECT_EQ(c->gpu_experts_profile, "/p.json");
  bool described = false;
  for (const std::string& line : c->Describe()) {
    described = described || line ==
                                 "gpu_experts = auto (what the KV pool leaves), placed by "
                                 "/p.json, rebalanced every 10 s";
  }
  EXPECT_TRUE(described);
  f.gpu_experts_rebalance_s = 0;  // never
  ASSERT_TRUE(ParseWorkerConfig(f).ok());
#endif
  f.backend = "cpu";
  f.gpu_experts = "0";
  f.gpu_experts_profile.clear();
  f.gpu_experts_rebalance_s = 30;
  ASSERT_TRUE(ParseWorkerConfig(f).ok());
  for (double bad : {-1.0, 1e9, std::nan("")}) {
    f.gpu_experts_rebalance_s = bad;
    EXPECT_FALSE(ParseWorkerConfig(f).ok()) << bad;
  }
}

// --dummy_router_skew (common/dummy_weights.h): carried into the weight source with --load_format
// dummy; refused with real weights, and when negative or not finite.
TEST(GpuWorkerConfig, DummyRouterSkewNeedsDummyWeights) {
  WorkerFlags f;
  f.model = kTinyA;
  f.dummy_router_skew = 0.2;
  absl::Status st = ParseWorkerConfig(f).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("--dummy_router_skew needs --load_format dummy"), std::string::npos)
      << st;
  f.load_format = "dummy";
  absl::StatusOr<WorkerConfig> c = ParseWorkerConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->source.router_skew, 0.2);
  f.dummy_router_skew = -1;
  st = ParseWorkerConfig(f).status();
  EXPECT_NE(st.message().find("--dummy-router-skew -1"), std::string::npos) << st;
  f.dummy_router_skew = std::nan("");
  EXPECT_EQ(ParseWorkerConfig(f).status().code(), absl::StatusCode::kInvalidArgument);
  f.load_format = "auto";
  f.dummy_router_skew = 0;
  c = ParseWorkerConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->source.router_skew, 0.0);
}

TEST(GpuWorkerConfig, FlagsAreValidated) {
  WorkerFlags f;
  EXPECT_FALSE(ParseWorkerConfig(f).ok());  // --model missing
  f.model = kTinyA;
  auto c = ParseWorkerConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->worker_id, "stage0");
  EXPECT_EQ(c->end_layer, -1);
  EXPECT_EQ(c->source.model_dir, kTinyA);
  EXPECT_EQ(c->source.load_format, LoadFormat::kAuto);
  EXPECT_EQ(c->layer_timing_every, 16);
  f.layer_timing_every = -1;
  EXPECT_NE(ParseWorkerConfig(f).status().message().find("--layer_timing_every -1"),
            std::string::npos);
  f.layer_timing_every = 0;
  c = ParseWorkerConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->layer_timing_every, 0);
  f.layer_timing_every = 16;
  f.load_format = "dummy";
  f.hf_overrides = R"({"rope_scaling": {"factor": 4}})";
  c = ParseWorkerConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->source.dummy());
  EXPECT_EQ(c->source.hf_overrides, f.hf_overrides);
  f.load_format = "pt";
  EXPECT_NE(ParseWorkerConfig(f).status().message().find("--load-format 'pt'"), std::string::npos);
  f.load_format = "auto";
  f.hf_overrides = "{";
  EXPECT_NE(ParseWorkerConfig(f).status().message().find("--hf-overrides"), std::string::npos);
  f.hf_overrides = "";
  f.backend = "cuda";
#ifdef SS_HAVE_CUDA
  EXPECT_TRUE(ParseWorkerConfig(f).ok());  // accepted; a missing device fails at start-up
#else
  EXPECT_EQ(ParseWorkerConfig(f).status().code(), absl::StatusCode::kUnimplemented);
#endif
  // --kv_tokens 0: the cuda backend sizes its pool to the GPU's free memory; the cpu backend
  // has no such size.
  f.kv_tokens = 0;
#ifdef SS_HAVE_CUDA
  EXPECT_TRUE(ParseWorkerConfig(f).ok());
#endif
  f.backend = "cpu";
  EXPECT_EQ(ParseWorkerConfig(f).status().code(), absl::StatusCode::kInvalidArgument);
  f.kv_tokens = -1;
  f.backend = "cuda";
  EXPECT_FALSE(ParseWorkerConfig(f).ok());
  f.kv_tokens = WorkerFlags{}.kv_tokens;
  f.backend = "gpu";
  EXPECT_EQ(ParseWorkerConfig(f).status().code(), absl::StatusCode::kInvalidArgument);
  f.cuda_device = -1;
  f.backend = "cpu";
  EXPECT_FALSE(ParseWorkerConfig(f).ok());
  f.cuda_device = 0;
  EXPECT_EQ(ParseWorkerConfig(f)->fp64_sums, Fp64Sums::kAuto);
  f.fp64_sums = "off";
  EXPECT_EQ(ParseWorkerConfig(f)->fp64_sums, Fp64Sums::kOff);
  f.fp64_sums = "double";
  EXPECT_NE(ParseWorkerConfig(f).status().message().find("--fp64_sums 'double'"),
            std::string::npos);
  f.fp64_sums = "auto";
  f.backend = "cpu";
  f.num_stages = 2;
  f.layers = "0-3";
  EXPECT_NE(ParseWorkerConfig(f).status().message().find("--next_stage"), std::string::npos);
  f.next_stage = "127.0.0.1:5000";
  f.experts = "0-1=shm:a+grpc:10.0.0.2:7000,3=shm:b";
  c = ParseWorkerConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->first_layer, 0);
  EXPECT_EQ(c->end_layer, 4);
  ASSERT_EQ(c->experts.size(), 3u);
  EXPECT_EQ(c->experts[1].layer, 1);
  ASSERT_EQ(c->experts[1].endpoints.size(), 2u);
  EXPECT_EQ(c->experts[1].endpoints[1].grpc_address, "10.0.0.2:7000");
  EXPECT_EQ(c->experts[1].endpoints[1].slice_index, 1);
  EXPECT_EQ(c->experts[1].endpoints[1].slice_count, 2);
  EXPECT_EQ(c->experts[2].endpoints[0].shm_name, "b");
  for (const char* bad : {"0-1", "0=tcp:x", "0=grpc:nohost", "0=shm:a,0=shm:b"}) {
    f.experts = bad;
    EXPECT_FALSE(ParseWorkerConfig(f).ok()) << bad;
  }
  f.experts = "";
  f.layers = "0-1,3";
  EXPECT_FALSE(ParseWorkerConfig(f).ok());
  f.layers = "0-3";
  f.coordinator = "127.0.0.1:9";
  EXPECT_FALSE(ParseWorkerConfig(f).ok());  // standalone flags with a coordinator
  WorkerFlags g;
  g.model = kTinyA;
  g.coordinator = "127.0.0.1:9";
  EXPECT_FALSE(ParseWorkerConfig(g).ok());  // --worker_id required
  g.worker_id = "gpu0";
  EXPECT_TRUE(ParseWorkerConfig(g).ok());
  g.kv_tokens = 0;
  EXPECT_FALSE(ParseWorkerConfig(g).ok());
  g.kv_tokens = 16;
  g.tp_size = 2;
  EXPECT_FALSE(ParseWorkerConfig(g).ok());  // the TP rank comes from the coordinator's role
}

TEST(GpuWorkerConfig, StandaloneTpFlags) {
  WorkerFlags f;
  f.model = kTinyA;
  f.tp_size = 2;
  f.tp_rank = 1;
  // The cpu backend runs TP 1 only.
  EXPECT_NE(ParseWorkerConfig(f).status().message().find("TP 1 only"), std::string::npos);
  f.backend = "cuda";
#ifdef SS_HAVE_CUDA
  EXPECT_NE(ParseWorkerConfig(f).status().message().find("--nccl_id_file"), std::string::npos);
  f.nccl_id_file = "/tmp/id";
  auto c = ParseWorkerConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tp_rank, 1);
  EXPECT_EQ(c->tp_size, 2);
  f.tp_rank = 2;
  EXPECT_FALSE(ParseWorkerConfig(f).ok());
  f.tp_rank = 0;
  f.collective_timeout_ms = 0;
  EXPECT_FALSE(ParseWorkerConfig(f).ok());
#endif
}

TEST(GpuWorkerConfig, StreamedPrefillFlags) {
  WorkerFlags f;
  f.model = kTinyA;
  absl::StatusOr<WorkerConfig> c = ParseWorkerConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gpu_prefill_threshold.mode, GpuPrefillThreshold::Mode::kAuto);
  // The ring is auto by default: the cuda backend sizes it at start (ring_budget.h).
  EXPECT_TRUE(c->gpu_prefill_ring_auto);
  EXPECT_EQ(c->gpu_prefill_ring_bytes, kBaseGpuPrefillRingMiB << 20);
  auto has_line = [](const WorkerConfig& wc, const std::string& line) {
    for (const std::string& l : wc.Describe()) {
      if (l == line) return true;
    }
    return false;
  };
  EXPECT_TRUE(has_line(*c, "gpu_prefill_threshold = auto (cuda backend only)"));
  EXPECT_EQ(c->gpu_prefill_slot_bytes, kGpuPrefillSlotBytes);
  EXPECT_TRUE(has_line(*c, absl::StrCat("gpu_prefill_ring = auto (sized at start) in slots of ~",
                                        kGpuPrefillSlotBytes >> 20, " MiB (cuda backend only)")));
  f.gpu_prefill_threshold = "512";
  f.gpu_prefill_ring_mib = " 256 ";
  c = ParseWorkerConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gpu_prefill_threshold.mode, GpuPrefillThreshold::Mode::kRows);
  EXPECT_EQ(c->gpu_prefill_threshold.rows, 512);
  EXPECT_EQ(c->gpu_prefill_ring_bytes, int64_t{256} << 20);
  EXPECT_FALSE(c->gpu_prefill_ring_auto);
  f.gpu_prefill_ring_mib = "0";  // no streamed path
  EXPECT_EQ(ParseWorkerConfig(f)->gpu_prefill_ring_bytes, 0);
  EXPECT_TRUE(has_line(*ParseWorkerConfig(f),
                       "gpu_prefill_ring = (none: no streamed path) (cuda backend only)"));
  f.gpu_prefill_ring_mib = "AUTO";
  f.gpu_prefill_threshold = "off";  // never streams: no ring either
  c = ParseWorkerConfig(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gpu_prefill_threshold.mode, GpuPrefillThreshold::Mode::kOff);
  EXPECT_EQ(c->gpu_prefill_ring_bytes, 0);
  EXPECT_FALSE(c->gpu_prefill_ring_auto);
  f.gpu_prefill_threshold = "0";
  EXPECT_NE(ParseWorkerConfig(f).status().message().find("--gpu-prefill-threshold '0'"),
            std::string::npos)
      << ParseWorkerConfig(f).status();
  f.gpu_prefill_threshold = "auto";
  for (const char* bad : {"-1", "1048577", "1g", ""}) {
    f.gpu_prefill_ring_mib = bad;
    EXPECT_EQ(ParseWorkerConfig(f).status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(ParseWorkerConfig(f).status().message().find(
                  absl::StrCat("--gpu_prefill_ring_mib '", bad, "': expected auto or a size")),
              std::string::npos)
        << ParseWorkerConfig(f).status();
  }
  f.gpu_prefill_ring_mib = "1024";
  f.gpu_prefill_slot_kib = 64;  // small slots (a tiny model's golden run gets many)
  ASSERT_TRUE(ParseWorkerConfig(f).ok()) << ParseWorkerConfig(f).status();
  EXPECT_EQ(ParseWorkerConfig(f)->gpu_prefill_slot_bytes, 64 << 10);
  EXPECT_TRUE(has_line(*ParseWorkerConfig(f),
                       "gpu_prefill_ring = 1024 MiB in slots of ~64 KiB (cuda backend only)"));
  f.gpu_prefill_slot_kib = 0;
  EXPECT_NE(ParseWorkerConfig(f).status().message().find("--gpu_prefill_slot_kib 0"),
            std::string::npos)
      << ParseWorkerConfig(f).status();
}

// CudaBackendOptions::expert_stores from a rank's experts: per remote layer its slices'
// shared-memory names in slice order ("" for gRPC), the layer's slice count; local layers none.
TEST(GpuWorkerConfig, ExpertStoresOfTheRanksSlices) {
  absl::StatusOr<std::vector<LayerExpertsConfig>> all =
      ParseExpertsSpec("0-1=shm:a+grpc:127.0.0.1:5000+shm:c+shm:d,3=shm:e");
  ASSERT_TRUE(all.ok()) << all.status();
  // TP rank 1 of 2 holds slices 1 and 3 of layers 0-1 and none of layer 3's one slice.
  std::map<int64_t, ExpertLayerStores> s = ExpertStoresOf(ExpertSlicesForRank(*all, 1, 2));
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].shm_names, (std::vector<std::string>{"", "d"}));
  EXPECT_EQ(s[0].slice_count, 4);
  EXPECT_EQ(s[1].shm_names, (std::vector<std::string>{"", "d"}));
  EXPECT_TRUE(s[3].shm_names.empty());
  EXPECT_EQ(s[3].slice_count, 1);
  // TP 1: every slice in order; a layer computed locally has no entry.
  std::vector<LayerExpertsConfig> one = *all;
  one.push_back({7, {}, 0});
  s = ExpertStoresOf(one);
  EXPECT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].shm_names, (std::vector<std::string>{"a", "", "c", "d"}));
  EXPECT_EQ(s[0].slice_count, 4);
  EXPECT_EQ(s[3].shm_names, (std::vector<std::string>{"e"}));
  EXPECT_EQ(s.count(7), 0u);
}

}  // namespace
}  // namespace ss::gpu
