#include "bench/pipeline_stack.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/bf16.h"
#include "gpu_worker/cuda/cuda_backend.h"
#include "gpu_worker/nccl_comm.h"
#if SS_BENCH_PP_GRPC
#include "coordinator/cluster_config.h"
#include "gpu_worker/gpu_worker_service.h"
#include "gpu_worker/nccl_stage_link.h"
#include "gpu_worker/stage_transfer.h"
#endif

namespace ss::bench {

int64_t LayerKvBytes(const ModelConfig& c, int64_t ratio, int64_t ctx) {
  const int64_t rec = 584, key = c.index_head_dim / 2 + c.index_head_dim / 32;
  int64_t kv = c.window_size * rec;
  if (ratio == 4) {
    kv += (ctx / 4) * key + std::min<int64_t>(c.index_topk, ctx / 4) * rec;
  } else if (ratio == 128) {
    kv += (ctx / 128) * rec;
  }
  return kv;
}

#if !SS_BENCH_PP_GRPC

bool PipelineStackAvailable() { return false; }

int RunPipelineStack(const std::shared_ptr<const model::Model>&, int, int, int, double, bool) {
  std::fprintf(stderr, "--pp needs the services build (gRPC carries the streams between stages)\n");
  return 1;
}

#else

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool Check(const absl::Status& s, const char* what) {
  if (!s.ok()) std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
  return s.ok();
}

constexpr int kLayersPerStage = 2;

// One (stage, rank): its backend, the server whose inbox it takes its streams from (stage > 0;
// shut down by its destructor) and the sender to the next stage's same rank (all but the last).
struct Rank {
  int stage = 0, rank = 0, device = 0;
  std::unique_ptr<gpu::CudaBackend> backend;
  std::unique_ptr<gpu::GpuWorkerServer> server;
  std::unique_ptr<gpu::StreamSender> sender;
  std::unique_ptr<gpu::NcclStageLink> link_in, link_out;  // --stage-transport nccl
  // The last step's timestamps (seconds).
  double start = 0, ran = 0, pushed = 0;
  bool ok = true;
};

}  // namespace

bool PipelineStackAvailable() { return true; }

int RunPipelineStack(const std::shared_ptr<const model::Model>& model, int tp, int pp, int n_dev,
                     double copy_bw, bool links) {
  const ModelConfig& c = model->config();
  if (c.n_layers < kLayersPerStage * pp) {
    std::fprintf(stderr, "--pp %d needs %d layers, the checkpoint has %lld\n", pp,
                 kLayersPerStage * pp, static_cast<long long>(c.n_layers));
    return 1;
  }
  const int64_t width = c.hc_mult * c.dim;
  absl::StatusOr<std::vector<int> > assigned = coord::AssignCudaDevices(pp, tp, n_dev, links);
  if (!Check(assigned.status(), "GPU layout")) return 1;
  std::vector<std::vector<int> > devices(pp);
  for (int s = 0; s < pp; ++s) {
    for (int r = 0; r < tp; ++r) devices[s].push_back((*assigned)[s * tp + r]);
  }
  std::printf("TP %d x PP %d, %d layers per stage, %d GPUs, streams over %s%s\n", tp, pp,
              kLayersPerStage, n_dev, links ? "NCCL links" : "gRPC",
              tp * pp > n_dev ? " (stages share GPUs; one micro-batch runs through the stages one "
                                "after another)"
                              : "");
  std::vector<std::vector<std::unique_ptr<gpu::NcclComm> > > comms(pp);
  if (tp > 1) {
    for (int s = 0; s < pp; ++s) {
      auto g = gpu::NcclComm::CreateGroup(devices[s]);
      if (!Check(g.status(), "NCCL group")) return 1;
      comms[s] = std::move(*g);
    }
  }
  std::vector<std::vector<Rank> > ranks(pp);
  for (auto& stage : ranks) stage.resize(tp);
  const ClusterCredential credential = *ClusterCredential::FromToken(*GenerateClusterToken());
  // fn(rank) for every rank of every stage, each on its own thread; false if any returned false.
  auto all = [&](auto fn) {
    std::vector<std::thread> th;
    for (auto& stage : ranks) {
      for (Rank& k : stage) th.emplace_back([&fn, &k] { k.ok = fn(k); });
    }
    for (std::thread& t : th) t.join();
    bool ok = true;
    for (auto& stage : ranks) {
      for (Rank& k : stage) ok = ok && k.ok;
    }
    return ok;
  };
  for (int s = 0; s < pp; ++s) {
    for (int r = 0; r < tp; ++r) {
      Rank& k = ranks[s][r];
      k.stage = s;
      k.rank = r;
      k.device = devices[s][r];
      if (s > 0 && !links) {
        auto srv = gpu::GpuWorkerServer::Start("127.0.0.1:0", "pp-bench", credential);
        if (!Check(srv.status(), "stream server")) return 1;
        k.server = std::move(*srv);
      }
    }
  }
  for (int s = 0; s + 1 < pp && !links; ++s) {
    for (int r = 0; r < tp; ++r) {
      ranks[s][r].sender = std::make_unique<gpu::StreamSender>(
          "127.0.0.1:" + std::to_string(ranks[s + 1][r].server->port()), credential);
    }
  }
  // Ranks of one stage are created together (their NCCL group meets in Create); stages in turn.
  for (int s = 0; s < pp; ++s) {
    std::printf("stage %d: layers %d-%d on GPU", s, kLayersPerStage * s,
                kLayersPerStage * (s + 1) - 1);
    for (int d : devices[s]) std::printf(" %d", d);
    std::printf("\n");
  }
  const bool created = all([&](Rank& k) {
    gpu::CudaBackendOptions o;
    // A middle stage of a longer pipeline: streams in, streams out.
    o.stage = k.stage + 1;
    o.num_stages = pp + 2;
    o.first_layer = kLayersPerStage * k.stage;
    o.end_layer = kLayersPerStage * (k.stage + 1);
    o.kv_tokens = 9 * 65536 + 16384;
    o.exclude_routed_experts = true;
    o.device = k.device;
    o.tp_rank = k.rank;
    o.tp_size = tp;
    o.comm = tp > 1 ? comms[k.stage][k.rank].get() : nullptr;
    auto b = gpu::CudaBackend::Create(model, o);
    if (!Check(b.status(), "create")) return false;
    k.backend = std::move(*b);
    return true;
  });
  if (!created) return 1;
  // The links: each (stage, rank) joins its outgoing link, then its incoming one, on its own
  // thread (a join blocks until the other end has joined).
  std::vector<std::vector<std::string> > link_ids(pp);
  for (int s = 0; s + 1 < pp && links; ++s) {
    for (int r = 0; r < tp; ++r) {
      auto id = gpu::NcclComm::NewUniqueId();
      if (!Check(id.status(), "NCCL id")) return 1;
      link_ids[s].push_back(*id);
    }
  }
  const bool linked = !links || all([&](Rank& k) {
    if (k.stage + 1 < pp) {
      auto l = gpu::NcclStageLink::Create(link_ids[k.stage][k.rank], true, k.device, "link out");
      if (!Check(l.status(), "link out")) return false;
      k.link_out = std::move(*l);
    }
    if (k.stage > 0) {
      auto l =
          gpu::NcclStageLink::Create(link_ids[k.stage - 1][k.rank], false, k.device, "link in");
      if (!Check(l.status(), "link in")) return false;
      k.link_in = std::move(*l);
    }
    return true;
  });
  if (!linked) return 1;

  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> streams(8 * width);
  for (float& v : streams) v = RoundBf16(nd(rng));
  // The first stage's input as bf16 on its GPUs (--stage-transport nccl: RunDevice).
  std::vector<std::shared_ptr<void> > first_in(tp);
  for (int r = 0; r < tp && links; ++r) {
    std::vector<uint16_t> b(streams.size());
    for (size_t i = 0; i < b.size(); ++i) b[i] = FloatToBf16(streams[i]);
    void* p = nullptr;
    cudaSetDevice(devices[0][r]);
    if (cudaMalloc(&p, b.size() * 2) != cudaSuccess ||
        cudaMemcpy(p, b.data(), b.size() * 2, cudaMemcpyHostToDevice) != cudaSuccess) {
      std::fprintf(stderr, "first stage's input: CUDA error\n");
      return 1;
    }
    first_in[r] = std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
  }
  uint64_t micro_batch = 1;

  for (const int64_t context : {int64_t{8192}, int64_t{65536}}) {
    for (const int batch : {1, 8}) {
      const bool filled = all([&](Rank& k) {
        k.backend->ReleaseAll();
        for (int q = 0; q < batch; ++q) {
          if (!Check(k.backend->FillSequenceForBenchmark(static_cast<uint64_t>(q), context),
                     "fill")) {
            return false;
          }
        }
        return true;
      });
      if (!filled) return 1;
      std::vector<int32_t> one(batch);
      std::vector<gpu::StageChunk> step(batch);
      int64_t next = context;
      // One micro-batch through every stage; per rank thread: take the streams (stage > 0), run,
      // push them on (all but the last stage). timings: per stage, rank 0's.
      auto run_step = [&](std::vector<gpu::StageTimings>* timings) {
        for (int q = 0; q < batch; ++q) {
          one[q] = static_cast<int32_t>(2 + (next * 7 + q) % 1000);
          step[q] = {static_cast<uint64_t>(q), next, std::span(&one[q], 1), true, {}, {}, 0};
        }
        const uint64_t id = micro_batch++;
        const bool ok = all([&](Rank& k) {
          const absl::Time deadline = absl::Now() + absl::Seconds(60);
          gpu::StageStreamsData in;
          if (links) {
            const void* dev_in = first_in[k.rank].get();
            if (k.stage > 0) {
              auto got = k.link_in->Receive(id, batch, width, deadline);
              if (!Check(got.status(), "receive")) return false;
              dev_in = got->streams;
            }
            k.start = Now();
            gpu::StageOutput out;
            gpu::StageTimings* tm = timings && k.rank == 0 ? &(*timings)[k.stage] : nullptr;
            if (!Check(k.backend->RunDevice(step, dev_in, &out, tm), "decode")) return false;
            k.ran = Now();
            if (k.link_out &&
                !Check(k.link_out->Send(id, out.rows, out.width, out.device_streams, {}, deadline),
                       "send")) {
              return false;
            }
            k.pushed = Now();
            return true;
          }
          if (k.stage > 0) {
            auto got = k.server->inbox().Take(id, deadline);
            if (!Check(got.status(), "take")) return false;
            in = std::move(*got);
          }
          k.start = Now();
          gpu::StageOutput out;
          gpu::StageTimings* tm = timings && k.rank == 0 ? &(*timings)[k.stage] : nullptr;
          if (!Check(
                  k.backend->Run(step, k.stage > 0 ? in.streams.data() : streams.data(), &out, tm),
                  "decode")) {
            return false;
          }
          k.ran = Now();
          if (k.sender) {
            gpu::StageStreamsData d{out.rows, out.width, std::move(out.streams), {}};
            if (!Check(k.sender->Push(id, d, deadline), "push")) return false;
          }
          k.pushed = Now();
          return true;
        });
        ++next;
        return ok;
      };
      const int warm = 6, iters = 30, timed = 5;
      std::vector<double> stage_ms(pp, 0), push_ms(pp, 0), ar_ms(pp, 0);
      double step_ms = 0;
      for (int i = 0; i < warm; ++i) {
        if (!run_step(nullptr)) return 1;
      }
      for (int i = 0; i < iters; ++i) {
        if (!run_step(nullptr)) return 1;
        double first = ranks[0][0].start, last = 0;
        for (int s = 0; s < pp; ++s) {
          double run = 0, push = 0;
          for (const Rank& k : ranks[s]) {
            first = std::min(first, k.start);
            last = std::max(last, k.ran);
            run = std::max(run, k.ran - k.start);
            push = std::max(push, k.pushed - k.ran);
          }
          stage_ms[s] += run * 1e3 / iters;
          push_ms[s] += push * 1e3 / iters;
        }
        step_ms += (last - first) * 1e3 / iters;
      }
      for (int i = 0; i < timed; ++i) {
        std::vector<gpu::StageTimings> tm(pp);
        if (!run_step(&tm)) return 1;
        for (int s = 0; s < pp; ++s) {
          for (double a : tm[s].allreduce) ar_ms[s] += a * 1e3 / timed / kLayersPerStage;
        }
      }
      const int64_t ctx = context + warm + iters / 2;
      std::printf(
          "TP %d x PP %d batch %d ctx %6lld: step %.3f ms (first stage's start to the last "
          "stage's end)\n",
          tp, pp, batch, static_cast<long long>(context), step_ms);
      for (int s = 0; s < pp; ++s) {
        double bytes = static_cast<double>(ranks[s][0].backend->info().weight_bytes);
        for (int l = kLayersPerStage * s; l < kLayersPerStage * (s + 1); ++l) {
          bytes += static_cast<double>(batch) *
                   static_cast<double>(LayerKvBytes(c, c.compress_ratio(l), ctx));
        }
        std::printf(
            "  stage %d: %.3f ms, %.1f MB read per rank, %.3f of D2D copy; NCCL "
            "all-reduce %.3f ms per layer",
            s, stage_ms[s], bytes / 1e6, bytes / (stage_ms[s] * 1e-3) / copy_bw, ar_ms[s]);
        if (s + 1 < pp) std::printf("; push to stage %d %.3f ms", s + 1, push_ms[s]);
        std::printf("\n");
      }
    }
  }
  return 0;
}

#endif  // SS_BENCH_PP_GRPC

}  // namespace ss::bench
