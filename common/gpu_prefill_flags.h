// The spellings of the streamed-prefill flags (gpu_worker/streamed_prefill.h): the GPU worker's
// --gpu_prefill_threshold / --gpu_prefill_ring_mib, `splitserve up`'s --gpu-prefill-threshold /
// --gpu-prefill-ring-mib and `splitserve-gpu-worker --plan`'s ring. Host code, no CUDA, in common/
// because the coordinator's launcher parses them too (as common/fp64_sums.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ss::gpu {

// --gpu-prefill-threshold: auto | off | N (N >= 1 rows).
struct GpuPrefillThreshold {
  enum class Mode { kAuto, kOff, kRows } mode = Mode::kAuto;
  int64_t rows = 0;  // kRows
  // "auto", "off", "512"
  std::string ToString() const {
    return mode == Mode::kAuto ? "auto" : mode == Mode::kOff ? "off" : absl::StrCat(rows);
  }
};

// InvalidArgument naming the value and the accepted spellings (case and surrounding blanks
// ignored).
inline absl::StatusOr<GpuPrefillThreshold> ParseGpuPrefillThreshold(std::string_view text) {
  const std::string given(text);
  const std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(given));
  GpuPrefillThreshold t;
  if (v == "auto") return t;
  if (v == "off") {
    t.mode = GpuPrefillThreshold::Mode::kOff;
    return t;
  }
  int64_t rows = 0;
  if (absl::SimpleAtoi(v, &rows) && rows >= 1) {
    t.mode = GpuPrefillThreshold::Mode::kRows;
    t.rows = rows;
    return t;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--gpu-prefill-threshold '", given,
                   "': expected auto, off, or a row count N >= 1 (stream every step of at least "
                   "N rows)"));
}

// --gpu-prefill-ring-mib: auto | MIB, the staging ring's device memory (0: no streamed path).
// auto, the default, is sized at start (gpu_worker/ring_budget.h): kAutoGpuPrefillRingMiB's
// largest that leaves the KV pool its tokens, kBaseGpuPrefillRingMiB where routed experts are
// resident or the worker does not fill its GPU.
struct GpuPrefillRing {
  bool is_auto = true;
  int64_t mib = 0;  // !is_auto
  // "auto", "1024"
  std::string ToString() const { return is_auto ? "auto" : absl::StrCat(mib); }
};

// The largest ring a flag accepts, MiB (1 TiB).
inline constexpr int64_t kMaxGpuPrefillRingMiB = int64_t{1} << 20;
// The ring auto keeps when it does not grow, and the golden tool's default, MiB.
inline constexpr int64_t kBaseGpuPrefillRingMiB = 1024;
// The rings auto tries, largest first, MiB: 3 GiB keeps one RTX 3090's copy engine busy through
// a layer's attention at 8K-token chunks (bench/RESULTS.md, "Projection to RTX 3090s, session
// 30"); the last is kBaseGpuPrefillRingMiB.
inline constexpr int64_t kAutoGpuPrefillRingMiB[] = {3072, 2048, 1024};

// InvalidArgument naming `flag`, the value and the accepted spellings (case and surrounding
// blanks ignored).
inline absl::StatusOr<GpuPrefillRing> ParseGpuPrefillRing(std::string_view text,
                                                          std::string_view flag) {
  const std::string given(text);
  const std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(given));
  GpuPrefillRing r;
  if (v == "auto") return r;
  if (absl::SimpleAtoi(v, &r.mib) && r.mib >= 0 && r.mib <= kMaxGpuPrefillRingMiB) {
    r.is_auto = false;
    return r;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      std::string(flag), " '", given,
      "': expected auto or a size in MiB from 0 (no streamed path) to ", kMaxGpuPrefillRingMiB));
}
// Default of --gpu_prefill_slot_kib: the size each slot of the ring aims at (gpu_worker/
// streamed_prefill.h PlanRing).
inline constexpr int64_t kGpuPrefillSlotBytes = int64_t{256} << 20;

}  // namespace ss::gpu
