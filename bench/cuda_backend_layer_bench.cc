// One Flash-shaped layer of the cuda backend (gpu_worker/cuda/cuda_backend.h): decode at batch 1
// and 8 with 8K and 64K tokens of context per sequence, and the 8K-token prefill chunk. Needs a
// CUDA device.
//
//   build/bin/cuda_backend_layer_bench [checkpoint dir, default /tmp/ss_flash_layers] [--profile]
//
// The checkpoint is generated (tests/tools/checkpoint_generator.h, random weights) with the
// Flash config but 2 layers (compress ratio 4: CSA with the indexer; 128: HCA), a 1024-token
// vocabulary and 8 routed experts. Routed experts are excluded (issue 5's figures: attention,
// router, shared expert): CudaBackendOptions::exclude_routed_experts, so nothing goes to the host
// inside a step. Each layer runs as a middle pipeline stage fed random bf16 streams, or with
// --first-stage as a first stage (token embeddings in; fp32 streams out, as a middle stage).
//
// Decode sequences are positioned at the context with CudaBackend::FillSequenceForBenchmark
// (zeroed KV records, random indexer keys: the bytes a step reads are the same as after a real
// prefill, and the indexer's scores differ from key to key). Figures per layer:
// wall ms per step (Run, from the host's call to its output on the host: the upload of the
// streams, every kernel, the download), the bytes it must read (the layer's device weights + per
// sequence the window ring, and the compressed entries / indexer keys the step reads), those
// bytes per second, and that as a fraction of a device-to-device copy measured in the same run
// (bytes read + written per second, as gpu_kernels_bench). A second, shorter pass with
// StageTimings (CUDA events recorded in the step) splits the step into attention and MoE.
// Prefill: one 8K-token chunk from position 0 (the second of two runs), tokens per second.
//
// --tp N (N GPUs) runs each layer tensor-parallel over N ranks, one thread and one GPU each, joined
// by an in-process NCCL group (NcclComm::CreateGroup): step times are the slowest rank's, and the
// timed pass adds the seconds each step spends in the NCCL collectives (StageTimings::allreduce,
// rank 0: the all-reduce after attention and the one after the MoE).
//
// Then both layers run as one stage: its step pays the step's fixed costs once for two layers, so
// F = t(layer 0) + t(layer 1) − t(both) is the fixed cost of a step, and t(layer) − F a layer's
// marginal time in a stage of many layers (a Flash stage holds 11-43), printed with its fraction
// of the copy (decode) or its tokens per second (prefill; the prefill lines also give the layers'
// own GPU time from the StageTimings events of a third, timed pass).
//
// Decode runs under CUDA graphs, TP included (CudaBackend::set_decode_graphs; the ms/step figure);
// each configuration is also timed launched kernel by kernel (the "launched" line).
//
// --pp P (with --tp N or alone) runs a stack of 2·P such layers as P pipeline stages of TP N,
// stage to stage over gRPC as splitserve does (bench/pipeline_stack.h); decode only.
// --stage-transport nccl sends the streams over NCCL stage links instead (needs two GPUs).
//
// --fp64_sums on|off|auto sets CudaBackendOptions::fp64_sums (default auto: double on an H200);
// the first line says which arithmetic ran.
//
// --profile runs only three batch-1 8K decode steps of each layer between cudaProfilerStart and
// cudaProfilerStop (for `ncu --profile-from-start off`); --profile_context 65536 profiles 64K,
// --profile_batch 8 eight sequences a step; --profile_prefill profiles an 8K prefill chunk instead.
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/pipeline_stack.h"
#include "common/bf16.h"
#include "common/model/model.h"
#include "common/model_config.h"
#include "gpu_worker/cuda/cuda_backend.h"
#include "gpu_worker/nccl_comm.h"
#include "tests/tools/checkpoint_generator.h"

namespace {

constexpr char kConfig[] = R"({
  "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
  "vocab_size": 1024, "hidden_size": 4096, "num_hidden_layers": 2, "num_attention_heads": 64,
  "num_key_value_heads": 1, "head_dim": 512, "qk_rope_head_dim": 64, "q_lora_rank": 1024,
  "o_groups": 8, "o_lora_rank": 1024, "sliding_window": 128, "compress_ratios": [4, 128],
  "compress_rope_theta": 160000, "rope_theta": 10000,
  "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                   "beta_fast": 32, "beta_slow": 1},
  "max_position_embeddings": 1048576, "index_n_heads": 64, "index_head_dim": 128,
  "index_topk": 512, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 6,
  "moe_intermediate_size": 2048, "num_hash_layers": 0, "scoring_func": "sqrtsoftplus",
  "topk_method": "noaux_tc", "norm_topk_prob": true, "routed_scaling_factor": 1.5,
  "swiglu_limit": 10.0, "hidden_act": "silu", "hc_mult": 4, "hc_sinkhorn_iters": 20,
  "hc_eps": 1e-06, "rms_norm_eps": 1e-06, "num_nextn_predict_layers": 0,
  "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                          "weight_block_size": [128, 128], "activation_scheme": "dynamic"},
  "expert_dtype": "fp4", "tie_word_embeddings": false, "bos_token_id": 0, "eos_token_id": 1,
  "torch_dtype": "bfloat16"
})";

constexpr int64_t kChunk = 8192;

// kConfig with `layers` layers of compress ratios 4, 128, 4, 128, ...
std::string StackConfig(int layers) {
  std::string s = kConfig;
  auto replace = [&](const std::string& from, const std::string& to) {
    s.replace(s.find(from), from.size(), to);
  };
  std::string ratios;
  for (int l = 0; l < layers; ++l) ratios += std::string(l ? ", " : "") + (l % 2 ? "128" : "4");
  replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": " + std::to_string(layers));
  replace("\"compress_ratios\": [4, 128]", "\"compress_ratios\": [" + ratios + "]");
  return s;
}

void Die(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Bytes read + written per second of a 1 GiB device-to-device copy.
double CopyBandwidth() {
  const size_t n = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, n) != cudaSuccess || cudaMalloc(&b, n) != cudaSuccess) return 0;
  cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
  cudaDeviceSynchronize();
  const int iters = 10;
  const double t0 = Now();
  for (int i = 0; i < iters; ++i) cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
  cudaDeviceSynchronize();
  const double t = (Now() - t0) / iters;
  cudaFree(a);
  cudaFree(b);
  return 2.0 * n / t;
}

}  // namespace

int main(int argc, char** argv) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  std::string dir = "/tmp/ss_flash_layers";
  bool profile = false;
  int64_t profile_context = 8192;
  int profile_batch = 1;
  bool first_stage = false, profile_prefill = false;
  int tp = 1, pp = 1;
  bool links = false;
  ss::gpu::Fp64Sums fp64_sums = ss::gpu::Fp64Sums::kAuto;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--profile") == 0) {
      profile = true;
    } else if (std::strcmp(argv[i], "--profile_context") == 0 && i + 1 < argc) {
      profile_context = std::atoll(argv[++i]);
    } else if (std::strcmp(argv[i], "--profile_prefill") == 0) {
      profile = profile_prefill = true;
    } else if (std::strcmp(argv[i], "--first-stage") == 0) {
      first_stage = true;
    } else if (std::strcmp(argv[i], "--profile_batch") == 0 && i + 1 < argc) {
      profile_batch = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--tp") == 0 && i + 1 < argc) {
      tp = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--pp") == 0 && i + 1 < argc) {
      pp = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--stage-transport") == 0 && i + 1 < argc) {
      links = std::strcmp(argv[++i], "nccl") == 0;
    } else if (std::strcmp(argv[i], "--fp64_sums") == 0 && i + 1 < argc) {
      const absl::StatusOr<ss::gpu::Fp64Sums> m = ss::gpu::ParseFp64Sums(argv[++i]);
      Die(m.status(), "--fp64_sums");
      fp64_sums = *m;
    } else {
      dir = argv[i];
    }
  }
  if (pp < 1 || pp > 16 || (pp > 1 && profile)) {
    std::fprintf(stderr, "--pp %d: expected 1..16, without --profile\n", pp);
    return 1;
  }
  if (pp > 1 && !ss::bench::PipelineStackAvailable()) {
    return ss::bench::RunPipelineStack(nullptr, tp, pp, n_dev, 0, links);  // says why it cannot
  }
  // --pp P: 2·P layers of compress ratios 4, 128, 4, 128, ... in their own directory.
  const std::string config = pp == 1 ? std::string(kConfig) : StackConfig(2 * pp);
  if (pp > 1 && dir == "/tmp/ss_flash_layers") dir += "_" + std::to_string(2 * pp);
  auto cfg = ss::ParseModelConfig(config);
  Die(cfg.status(), "config");
  // A checkpoint this bench generated before (its marker holds the config) is reused: the TP 2
  // run and the --profile run after a plain run skip the generation.
  const std::string marker = dir + "/.cuda_backend_layer_bench";
  bool reuse = false;
  if (std::FILE* f = std::fopen(marker.c_str(), "rb")) {
    std::string have(config.size() + 1, '\0');
    have.resize(std::fread(have.data(), 1, have.size(), f));
    std::fclose(f);
    reuse = have == config;
  }
  if (reuse) {
    std::printf("reusing %s\n", dir.c_str());
  } else {
    std::remove(marker.c_str());
    const double tg = Now();
    Die(ss::GenerateCheckpoint(*cfg, config, dir, 1, 1), "generate");
    std::printf("generated %s in %.1f s\n", dir.c_str(), Now() - tg);
    if (std::FILE* f = std::fopen(marker.c_str(), "wb")) {
      std::fwrite(config.data(), 1, config.size(), f);
      std::fclose(f);
    }
  }
  auto loaded = ss::model::Model::Load(dir);
  Die(loaded.status(), "load");
  std::shared_ptr<const ss::model::Model> model(std::move(*loaded));
  const ss::ModelConfig& c = model->config();
  const int64_t width = c.hc_mult * c.dim;
  const double copy_bw = profile ? 1.0 : CopyBandwidth();
  std::printf("D2D copy: %.1f GB/s (read + write)\n", copy_bw / 1e9);
  if (tp < 1 || tp > n_dev) {
    std::fprintf(stderr, "--tp %d needs %d CUDA devices, %d found\n", tp, tp, n_dev);
    return 1;
  }
  if (pp > 1) return ss::bench::RunPipelineStack(model, tp, pp, n_dev, copy_bw, links);
  std::vector<std::unique_ptr<ss::gpu::NcclComm>> comms;
  if (tp > 1) {
    std::vector<int> devices;
    for (int r = 0; r < tp; ++r) devices.push_back(r);
    auto g = ss::gpu::NcclComm::CreateGroup(devices);
    Die(g.status(), "NCCL group");
    comms = std::move(*g);
    std::printf("TP %d: one rank per GPU, in-process NCCL group\n", tp);
  }
  // fn(rank) on every rank, each on its own thread when TP > 1 (the ranks meet in collectives).
  auto all_ranks = [&](auto fn) {
    if (tp == 1) return fn(0);
    std::vector<std::thread> th;
    for (int r = 0; r < tp; ++r) th.emplace_back([&, r] { fn(r); });
    for (std::thread& t : th) t.join();
  };

  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> streams(kChunk * width);
  for (float& v : streams) v = ss::RoundBf16(nd(rng));
  std::vector<int32_t> tokens(kChunk);
  for (auto& t : tokens) t = static_cast<int32_t>(2 + rng() % 1000);

  auto kv_bytes = [&](int64_t m, int64_t ctx) { return ss::bench::LayerKvBytes(c, m, ctx); };
  // Decode ms/step per (stage: layer 0, layer 1, both), context, batch.
  double decode_ms[3][2][2] = {};
  double prefill_ms[3] = {};
  int64_t w0 = 0, w1 = 0;  // the single layers' weight bytes
  // Stages: each layer alone, then (not under --profile) both layers as one stage, whose step
  // pays the step's fixed costs (the host's preparation and upload, the graph launch, the
  // download and synchronisation) once for two layers: F = t(0) + t(1) − t(both) is that fixed
  // cost, and t(layer) − F a layer's marginal time in a stage of many layers.
  for (int layer = 0; layer < (profile ? 2 : 3); ++layer) {
    const bool both = layer == 2;
    std::vector<std::unique_ptr<ss::gpu::CudaBackend>> ranks(tp);
    all_ranks([&](int r) {
      ss::gpu::CudaBackendOptions o;
      o.stage = first_stage ? 0 : 1;
      o.num_stages = 3;
      o.first_layer = both ? 0 : layer;
      o.end_layer = both ? 2 : layer + 1;
      o.kv_tokens = 9 * 65536 + 2 * kChunk;
      o.exclude_routed_experts = true;
      o.device = r;
      o.tp_rank = r;
      o.tp_size = tp;
      o.comm = tp > 1 ? comms[r].get() : nullptr;
      o.fp64_sums = fp64_sums;
      auto b = ss::gpu::CudaBackend::Create(model, o);
      Die(b.status(), "create");
      ranks[r] = std::move(*b);
    });
    if (layer == 0) {
      std::printf("the reference's double sums in %s (--fp64_sums %s)\n",
                  ranks[0]->fp64_sums() ? "double" : "fp32", ss::gpu::Fp64SumsName(fp64_sums));
    }
    const int64_t ratio = both ? 0 : c.compress_ratio(layer);
    const int64_t wbytes = ranks[0]->info().weight_bytes;
    if (layer == 0) w0 = wbytes;
    if (layer == 1) w1 = wbytes;
    if (layer == 0) {
      std::printf("KV pool per GPU: %.1f MB for %lld tokens (paged fp8_ds_mla records)\n",
                  ranks[0]->info().kv_bytes / 1e6,
                  static_cast<long long>(ranks[0]->info().kv_tokens));
    }
    double prefill = 0;
    ss::gpu::StageTimings prefill_tm;  // rank 0's, of a third (timed) pass
    if (!profile || profile_prefill) {
      for (int rep = 0; rep < 3; ++rep) {
        if (profile && rep == 2) break;
        if (profile && rep == 1) cudaProfilerStart();
        const double t0 = Now();
        all_ranks([&](int r) {
          ranks[r]->ReleaseAll();
          ss::gpu::StageChunk ch{1000, 0, tokens, false, {}, {}, 0};
          ss::gpu::StageOutput out;
          Die(ranks[r]->Run(std::vector<ss::gpu::StageChunk>{ch}, streams.data(), &out,
                            r == 0 && rep == 2 ? &prefill_tm : nullptr),
              "prefill");
        });
        if (rep == 1) prefill = Now() - t0;  // the second one: warm, untimed
      }
      prefill_ms[layer] = prefill * 1e3;
      if (profile) {
        cudaProfilerStop();
        std::printf("layer ratio %lld: profiled an 8K prefill chunk, %.1f ms\n",
                    static_cast<long long>(ratio), prefill * 1e3);
        continue;
      }
    }
    for (const int64_t context : {int64_t{8192}, int64_t{65536}}) {
      for (const int batch : {1, 8}) {
        if (profile && (context != profile_context || batch != profile_batch)) continue;
        for (auto& b : ranks) {
          b->ReleaseAll();
          for (int s = 0; s < batch; ++s) {
            Die(b->FillSequenceForBenchmark(static_cast<uint64_t>(s), context), "fill");
          }
        }
        std::vector<int32_t> one(batch);
        std::vector<ss::gpu::StageChunk> step(batch);
        int64_t next = context;
        auto run_step = [&](ss::gpu::StageTimings* tm) {
          for (int s = 0; s < batch; ++s) {
            one[s] = tokens[next % kChunk];
            step[s] = {static_cast<uint64_t>(s), next, std::span(&one[s], 1), true, {}, {}, 0};
          }
          const double t0 = Now();
          all_ranks([&](int r) {
            ss::gpu::StageOutput out;
            Die(ranks[r]->Run(step, streams.data(), &out, r == 0 ? tm : nullptr), "decode");
          });
          ++next;
          return Now() - t0;
        };
        const int warm = 6, iters = profile ? 3 : 30, timed = 5;
        for (int i = 0; i < warm; ++i) run_step(nullptr);
        const int64_t replays0 = ranks[0]->graph_replays();
        if (profile) cudaProfilerStart();
        double t_sum = 0;
        const int64_t captures0 = ranks[0]->graph_captures();
        std::vector<double> each(iters);
        for (int i = 0; i < iters; ++i) t_sum += each[i] = run_step(nullptr);
        const double t = t_sum / iters;
        const int64_t captures = ranks[0]->graph_captures() - captures0;
        std::sort(each.begin(), each.end());
        const int64_t ctx = context + warm + iters / 2;
        const double bytes =
            static_cast<double>(wbytes) +
            static_cast<double>(batch) *
                (both ? kv_bytes(c.compress_ratio(0), ctx) + kv_bytes(c.compress_ratio(1), ctx)
                      : kv_bytes(ratio, ctx));
        decode_ms[layer][context == 8192 ? 0 : 1][batch == 1 ? 0 : 1] = t * 1e3;
        if (both) {
          const double f = decode_ms[0][context == 8192 ? 0 : 1][batch == 1 ? 0 : 1] +
                           decode_ms[1][context == 8192 ? 0 : 1][batch == 1 ? 0 : 1] - t * 1e3;
          std::printf(
              "%sstage of both layers batch %d ctx %6lld: decode %.3f ms/step, %.1f MB read, "
              "%.3f of D2D copy; fixed per-step cost F = %.3f ms\n",
              tp > 1 ? ("TP " + std::to_string(tp) + " ").c_str() : "", batch,
              static_cast<long long>(context), t * 1e3, bytes / 1e6, bytes / t / copy_bw, f);
          for (int k = 0; k < 2; ++k) {
            const double tl = (decode_ms[k][context == 8192 ? 0 : 1][batch == 1 ? 0 : 1] - f);
            const double bl = static_cast<double>(k == 0 ? w0 : w1) +
                              static_cast<double>(batch) * kv_bytes(c.compress_ratio(k), ctx);
            std::printf(
                "  layer ratio %3lld in a stage of many: %.3f ms/step marginal, %.3f of "
                "D2D copy\n",
                static_cast<long long>(c.compress_ratio(k)), tl, bl / (tl * 1e-3) / copy_bw);
          }
          continue;
        }
        if (profile) {
          cudaProfilerStop();
          std::printf(
              "layer ratio %lld: profiled %d batch-%d decode steps, %.3f ms/step (%lld as "
              "CUDA graphs)\n",
              static_cast<long long>(ratio), iters, batch, t_sum / iters * 1e3,
              static_cast<long long>(ranks[0]->graph_replays() - replays0));
          continue;
        }
        // The same steps launched kernel by kernel (every rank).
        const int64_t replays = ranks[0]->graph_replays() - replays0;
        double t_launched = 0;
        for (auto& b : ranks) b->set_decode_graphs(false);
        for (int i = 0; i < iters; ++i) t_launched += run_step(nullptr);
        for (auto& b : ranks) b->set_decode_graphs(true);
        t_launched /= iters;
        double attn = 0, moe = 0, ar = 0, t_timed = 0;
        for (int i = 0; i < timed; ++i) {
          ss::gpu::StageTimings tm;
          t_timed += run_step(&tm);
          attn += tm.attention[0];
          moe += tm.moe_gpu[0];
          ar += tm.allreduce[0];
        }
        std::printf(
            "%slayer ratio %3lld batch %d ctx %6lld: decode %.3f ms/step, %.1f MB read, %.1f GB/s "
            "= %.3f of D2D copy (timed pass: step %.3f, attention %.3f, moe %.3f, "
            "allreduce %.3f ms)\n",
            tp > 1 ? ("TP " + std::to_string(tp) + " ").c_str() : "", static_cast<long long>(ratio),
            batch, static_cast<long long>(context), t * 1e3, bytes / 1e6, bytes / t / 1e9,
            bytes / t / copy_bw, t_timed / timed * 1e3, attn / timed * 1e3, moe / timed * 1e3,
            ar / timed * 1e3);
        std::printf(
            "  steps: median %.3f ms, fastest %.3f, slowest %.3f; %lld of %d replayed a graph "
            "unchanged, %lld captured one (its key changed: sizes such as a sequence's "
            "compressed entries), %lld launched kernel by kernel (a new key)\n",
            each[iters / 2] * 1e3, each.front() * 1e3, each.back() * 1e3,
            static_cast<long long>(replays - captures), iters, static_cast<long long>(captures),
            static_cast<long long>(iters - replays));
        std::printf(
            "  CUDA graphs: %lld graph launches in the timed steps; launched kernel by "
            "kernel instead: %.3f ms/step (%.3f of D2D copy)\n",
            static_cast<long long>(replays), t_launched * 1e3, bytes / t_launched / copy_bw);
      }
    }
    if (!profile) {
      // The GPU's share: the layers' attention and MoE spans (events), without the step's upload
      // of the streams, its download and the host's preparation.
      double gpu = 0;
      for (size_t l = 0; l < prefill_tm.attention.size(); ++l) {
        gpu += prefill_tm.attention[l] + prefill_tm.moe_gpu[l] + prefill_tm.allreduce[l];
      }
      const std::string tag = tp > 1 ? "TP " + std::to_string(tp) + " " : "";
      if (!both) {
        std::printf(
            "%slayer ratio %3lld: prefill 8K chunk %.1f ms = %.0f tokens/s (layer on the "
            "GPU %.1f ms = %.0f tokens/s: attention %.1f ms, MoE %.1f ms)\n",
            tag.c_str(), static_cast<long long>(ratio), prefill * 1e3, kChunk / prefill, gpu * 1e3,
            kChunk / gpu, prefill_tm.attention[0] * 1e3, prefill_tm.moe_gpu[0] * 1e3);
      } else {
        const double f = prefill_ms[0] + prefill_ms[1] - prefill_ms[2];
        std::printf(
            "%sstage of both layers: prefill 8K chunk %.1f ms (layers on the GPU %.1f ms); "
            "fixed per-step cost F = %.1f ms\n",
            tag.c_str(), prefill_ms[2], gpu * 1e3, f);
        for (int k = 0; k < 2; ++k) {
          std::printf(
              "  layer ratio %3lld in a stage of many: prefill %.1f ms marginal = %.0f "
              "tokens/s\n",
              static_cast<long long>(c.compress_ratio(k)), prefill_ms[k] - f,
              kChunk / ((prefill_ms[k] - f) * 1e-3));
        }
      }
    }
  }
  return 0;
}
