// Which arithmetic the cuda backend gives the sums the reference forms exactly in double: the
// compressors' softmax denominators, pooled values and RMS sums, and the Hadamard butterflies of
// the indexer's query and keys (gpu_worker/kernels/compressor.h and indexer.h).
//  * on: double, in the reference's order (exp as float(exp(double))): bit-identical by
//    construction.
//  * off: fp32 only (TwoSum-compensated sums, CUDA's expf within 2 ulp, the fp32 butterfly): the
//    double sums rounded once but for rare cases, so an output may differ from the reference's in
//    its last bits (bench/RESULTS.md, "--fp64_sums": the golden set with it). For GPUs whose FP64
//    runs at a small fraction of FP32 (1/64 on an RTX 3090).
//  * auto (the default): on where the device runs FP64 at 1/4 of its FP32 rate or better
//    (data-centre GPUs: 1/2), else off.
// Host code, no CUDA, in common/ because three folders parse it: the GPU worker's flags,
// `splitserve up`'s --fp64-sums and splitserve-golden's; the cuda backend resolves auto against its
// device (cudaDevAttrSingleToDoublePrecisionPerfRatio).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ss::gpu {

enum class Fp64Sums { kAuto, kOn, kOff };

inline absl::StatusOr<Fp64Sums> ParseFp64Sums(absl::string_view s) {
  if (s == "auto") return Fp64Sums::kAuto;
  if (s == "on") return Fp64Sums::kOn;
  if (s == "off") return Fp64Sums::kOff;
  return absl::InvalidArgumentError(
      absl::StrCat("--fp64_sums '", s, "': expected auto, on or off"));
}

inline const char* Fp64SumsName(Fp64Sums m) {
  return m == Fp64Sums::kOn ? "on" : m == Fp64Sums::kOff ? "off" : "auto";
}

// Whether the sums run in double on a device whose FP32 rate is single_to_double times its FP64
// rate (≤ 0: unknown, taken as fast FP64).
inline bool UseFp64Sums(Fp64Sums mode, int single_to_double) {
  if (mode != Fp64Sums::kAuto) return mode == Fp64Sums::kOn;
  return single_to_double <= 4;
}

}  // namespace ss::gpu
