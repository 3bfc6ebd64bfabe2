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

// Default of --gpu-prefill-ring-mib: the staging ring's device memory, MiB (0: no streamed path).
inline constexpr int64_t kDefaultGpuPrefillRingMiB = 1024;
// Default of --gpu_prefill_slot_kib: the size each slot of the ring aims at (gpu_worker/
// streamed_prefill.h PlanRing).
inline constexpr int64_t kGpuPrefillSlotBytes = int64_t{256} << 20;

}  // namespace ss::gpu
