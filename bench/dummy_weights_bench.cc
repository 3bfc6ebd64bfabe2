// Generation rate of dummy weights (common/dummy_weights.h) for Flash-shaped tensors: one layer's
// trunk tensors and its first N routed experts (models/flash/config.json).
//
//  * checkpoint: MakeDummyCheckpoint with a filter selecting those tensors, on a pool of T
//    threads: fresh memory, first touch included, what a process start pays. Baseline in the
//    same run: a fresh anonymous mapping of the same bytes memset by the same pool in 1 MiB
//    pieces.
//  * per core: FillDummyTensor of the same tensors, one thread, into memory already touched.
//    Baseline: memcpy of the same bytes between touched buffers.
//
//   build/bin/dummy_weights_bench [--threads T] [--experts N] [--layer L] [--reps R]
//                                 [--config models/flash/config.json]
// Prints one line per figure and, last, name=value pairs.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/checkpoint_schema.h"
#include "common/dummy_weights.h"
#include "common/model_config.h"
#include "common/thread_pool.h"
#include "spdlog/spdlog.h"

namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

size_t Bytes(const ss::ExpectedTensor& t) {
  size_t n = ss::DTypeSize(t.dtype);
  for (int64_t d : t.shape) n *= static_cast<size_t>(d);
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = static_cast<int>(std::thread::hardware_concurrency()), experts = 16, layer = 7,
      reps = 3;
  std::string config = "models/flash/config.json";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--threads") {
      threads = std::atoi(v.c_str());
    } else if (a == "--experts") {
      experts = std::atoi(v.c_str());
    } else if (a == "--layer") {
      layer = std::atoi(v.c_str());
    } else if (a == "--reps") {
      reps = std::atoi(v.c_str());
    } else if (a == "--config") {
      config = v;
    } else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  spdlog::set_level(spdlog::level::warn);
  std::ifstream in(config);
  std::stringstream text;
  text << in.rdbuf();
  auto parsed = ss::ParseModelConfig(text.str(), config);
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s\n", std::string(parsed.status().message()).c_str());
    return 1;
  }
  const ss::ModelConfig& c = *parsed;

  // The layer's trunk and its experts 0..N-1.
  const std::string prefix = "layers." + std::to_string(layer) + ".";
  const ss::TensorFilter filter = [&](std::string_view name) {
    if (!name.starts_with(prefix)) return false;
    const std::string_view rest = name.substr(prefix.size());
    if (!rest.starts_with("ffn.experts.")) return true;
    return std::atoi(std::string(rest.substr(12)).c_str()) < experts;
  };
  std::vector<ss::ExpectedTensor> chosen;
  size_t bytes = 0;
  for (ss::ExpectedTensor& t : ss::ExpectedTensors(c)) {
    if (!filter(t.name)) continue;
    bytes += Bytes(t);
    chosen.push_back(std::move(t));
  }
  ss::ThreadPoolOptions po;
  po.num_threads = std::max(1, threads);
  po.spin_us = 0;
  po.name = "ss-bench";
  auto pool = ss::ThreadPool::Create(po);
  if (!pool.ok()) return 1;
  std::printf("layer %d of %s: %zu tensors (trunk + %d experts), %.3f GB; %d thread(s)\n", layer,
              config.c_str(), chosen.size(), experts, bytes / 1e9, po.num_threads);

  // Whole checkpoint on T threads (fresh memory) vs memset of fresh memory on T threads.
  std::vector<double> gen_s, set_s;
  for (int r = 0; r < reps; ++r) {
    Clock::time_point t0 = Clock::now();
    auto ck = ss::MakeDummyCheckpoint(c, 1, filter, pool->get());
    gen_s.push_back(SecondsSince(t0));
    if (!ck.ok()) {
      std::fprintf(stderr, "%s\n", std::string(ck.status().message()).c_str());
      return 1;
    }
    ck->reset();
    t0 = Clock::now();
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    ::madvise(p, bytes, MADV_HUGEPAGE);
    const size_t piece = size_t{1} << 20, pieces = (bytes + piece - 1) / piece;
    (void)(*pool)->ParallelFor(static_cast<int64_t>(pieces), [&](int64_t i, int) {
      const size_t b = i * piece;
      std::memset(static_cast<uint8_t*>(p) + b, 0x5a, std::min(piece, bytes - b));
    });
    set_s.push_back(SecondsSince(t0));
    ::munmap(p, bytes);
  }
  const double gen_gbs = bytes / 1e9 / Median(gen_s), set_gbs = bytes / 1e9 / Median(set_s);
  std::printf(
      "checkpoint on %d thread(s): %.2f GB/s (%.3f s); fresh memset %.2f GB/s; ratio %.2f\n",
      po.num_threads, gen_gbs, Median(gen_s), set_gbs, gen_gbs / set_gbs);

  // One thread, touched memory: FillDummyTensor vs memcpy.
  std::vector<uint8_t> dst(bytes, 1), src(bytes, 2);
  std::vector<double> fill_s, copy_s;
  for (int r = 0; r < reps; ++r) {
    Clock::time_point t0 = Clock::now();
    size_t off = 0;
    for (const ss::ExpectedTensor& t : chosen) {
      const size_t n = Bytes(t);
      if (!ss::FillDummyTensor(c, t, 1, dst.data() + off, n).ok()) return 1;
      off += n;
    }
    fill_s.push_back(SecondsSince(t0));
    t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    copy_s.push_back(SecondsSince(t0));
  }
  const double fill_gbs = bytes / 1e9 / Median(fill_s), copy_gbs = bytes / 1e9 / Median(copy_s);
  std::printf("per core (1 thread, touched memory): %.2f GB/s; memcpy %.2f GB/s; ratio %.2f\n",
              fill_gbs, copy_gbs, fill_gbs / copy_gbs);
  std::printf(
      "threads=%d bytes=%zu checkpoint_gbs=%.3f memset_gbs=%.3f fill_1t_gbs=%.3f "
      "memcpy_1t_gbs=%.3f\n",
      po.num_threads, bytes, gen_gbs, set_gbs, fill_gbs, copy_gbs);
  return 0;
}
