// A CUDA injection library (CUDA_INJECTION64_PATH) that records every kernel's start, end and
// stream through CUPTI's activity API (concurrent kernels, CUDA-graph nodes included) and writes
// them at exit to $SS_TRACE_OUT as "start_ns,end_ns,stream,name" lines, for tests/device/
// timeline.sh on a GPU machine without Nsight Systems. With SS_TRACE_API=1 also every memcpy
// ("memcpy:<copy kind>:<bytes>", its stream) and every CUDA runtime call on the host
// ("api:<function>", the calling thread's id in the stream column), for tests/device/
// step_trace.py. With SS_TRACE_CORR=1 a memcpy's and a runtime call's name end in "@<correlation
// id>", which pairs a copy with the call that enqueued it (tests/device/streamed_trace.py). With
// SS_TRACE_TRIGGER=PATH the records so far are written as soon as PATH exists (checked every
// 100 ms; the file is written to SS_TRACE_OUT.tmp and renamed), for a process that may be killed
// rather than exit. Built here by timeline.sh's instructions
// (not part of the product build):
//   g++ -O2 -shared -fPIC -I/usr/local/cuda/include tests/device/kernel_trace.cc \
//     -L/usr/local/cuda/lib -lcupti -o .devpack/libss_kernel_trace.so
#include <cupti.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

struct KernelRecord {
  uint64_t start, end;
  uint32_t stream;
  std::string name;
};

std::mutex mu;
std::vector<KernelRecord>* records = nullptr;
bool with_corr = false;

std::string Corr(uint32_t id) { return with_corr ? "@" + std::to_string(id) : std::string(); }

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  constexpr size_t kBytes = 8 << 20;
  *buffer = static_cast<uint8_t*>(aligned_alloc(8, kBytes));
  *size = kBytes;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* r = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
    if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(r);
      records->push_back({m->start, m->end, m->streamId,
                          "memcpy:" + std::to_string(m->copyKind) + ":" + std::to_string(m->bytes) +
                              Corr(m->correlationId)});
      continue;
    }
    if (r->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(r);
      const char* name = nullptr;
      if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name) != CUPTI_SUCCESS) {
        name = nullptr;
      }
      records->push_back({a->start, a->end, a->threadId,
                          std::string("api:") + (name ? name : "?") + Corr(a->correlationId)});
      continue;
    }
    if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && r->kind != CUPTI_ACTIVITY_KIND_KERNEL) {
      continue;
    }
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(r);
    records->push_back({k->start, k->end, k->streamId, k->name ? k->name : "?"});
  }
  free(buffer);
}

void Flush() {
  cuptiActivityFlushAll(1);
  const char* env = std::getenv("SS_TRACE_OUT");
  const std::string path = env ? env : "kernel_trace.csv", tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return;
  std::lock_guard<std::mutex> lock(mu);
  for (const KernelRecord& k : *records) {
    std::fprintf(f, "%llu,%llu,%u,%s\n", static_cast<unsigned long long>(k.start),
                 static_cast<unsigned long long>(k.end), k.stream, k.name.c_str());
  }
  std::fclose(f);
  std::rename(tmp.c_str(), path.c_str());
}

// Flushes once when `trigger` exists.
void WatchTrigger(std::string trigger) {
  while (access(trigger.c_str(), F_OK) != 0) usleep(100000);
  Flush();
}

}  // namespace

extern "C" int InitializeInjection(void) {
  records = new std::vector<KernelRecord>();
  if (cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "kernel_trace: CUPTI activity setup failed\n");
    return 0;
  }
  const char* api = std::getenv("SS_TRACE_API");
  if (api != nullptr && std::string(api) == "1" &&
      (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS ||
       cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME) != CUPTI_SUCCESS)) {
    std::fprintf(stderr, "kernel_trace: CUPTI memcpy / runtime activity setup failed\n");
  }
  const char* corr = std::getenv("SS_TRACE_CORR");
  with_corr = corr != nullptr && std::string(corr) == "1";
  if (const char* trigger = std::getenv("SS_TRACE_TRIGGER")) {
    std::thread(WatchTrigger, std::string(trigger)).detach();
  }
  std::atexit(Flush);
  return 1;
}
