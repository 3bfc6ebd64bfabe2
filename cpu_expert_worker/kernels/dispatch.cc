#include "cpu_expert_worker/kernels/dispatch.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "cpu_expert_worker/kernels/expert_driver.h"
#include "cpu_expert_worker/kernels/linear4.h"

namespace ss::expert {
namespace {

absl::Status RunScalar(const ExpertCall& c, void* ws, size_t bytes) {
  return internal::RunExperts(&internal::Linear4Scalar, 0, c, ws, bytes);
}
absl::Status RunAvx2(const ExpertCall& c, void* ws, size_t bytes) {
  return internal::RunExperts(&internal::Linear4Avx2, 2, c, ws, bytes);
}
absl::Status RunAvx512(const ExpertCall& c, void* ws, size_t bytes) {
  return internal::RunExperts(&internal::Linear4Avx512, 4, c, ws, bytes);
}

// Indexed by Isa.
constexpr ExpertKernel kKernels[] = {
    {"scalar", &RunScalar},
    {"avx2", &RunAvx2},
    {"avx512", &RunAvx512},
};

}  // namespace

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

bool IsaSupported(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }
  return false;
}

Isa DetectIsa() {
  if (IsaSupported(Isa::kAvx512)) return Isa::kAvx512;
  if (IsaSupported(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kScalar;
}

absl::StatusOr<Isa> ParseIsa(std::string_view name) {
  if (name == "auto") return DetectIsa();
  if (name == "scalar") return Isa::kScalar;
  if (name == "avx2") return Isa::kAvx2;
  if (name == "avx512") return Isa::kAvx512;
  return absl::InvalidArgumentError(absl::StrCat("unknown ISA \"", std::string(name),
                                                 "\" (expected auto, scalar, avx2 or avx512)"));
}

absl::StatusOr<const ExpertKernel*> KernelFor(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
    case Isa::kAvx2:
    case Isa::kAvx512:
      if (!IsaSupported(isa)) {
        return absl::FailedPreconditionError(
            absl::StrCat("this CPU does not support the ", IsaName(isa), " expert kernels"));
      }
      return &kKernels[static_cast<int>(isa)];
  }
  return absl::InvalidArgumentError(
      absl::StrCat("no expert kernel for Isa value ", static_cast<int>(isa)));
}

}  // namespace ss::expert
