#include "cpu_expert_worker/kernels/dispatch.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "cpu_expert_worker/kernels/expert_driver.h"
#include "cpu_expert_worker/kernels/linear4.h"

namespace ss::expert {
namespace {

constexpr internal::IsaOps kScalarOps{&internal::Linear4Scalar, &internal::QuantizeActScalar, 0};
constexpr internal::IsaOps kAvx2Ops{&internal::Linear4Avx2, &internal::QuantizeActAvx2, 8,
                                    &internal::Linear4PairAvx2};
constexpr internal::IsaOps kAvx512Ops{&internal::Linear4Avx512, &internal::QuantizeActAvx512, 16,
                                      &internal::Linear4PairAvx512};
constexpr internal::IsaOps kAmxOps{&internal::Linear4Amx, &internal::QuantizeActAvx512, 16,
                                   &internal::Linear4PairAmx};

template <const internal::IsaOps& kOps>
absl::Status Run(const ExpertCall& c, void* ws, size_t bytes) {
  return internal::RunExperts(kOps, c, ws, bytes);
}
template <const internal::IsaOps& kOps>
absl::Status GateUp(const GateUpCall& c, void* ws, size_t bytes) {
  return internal::GateUp(kOps, c, ws, bytes);
}
template <const internal::IsaOps& kOps>
absl::Status Down(const DownCall& c, void* ws, size_t bytes) {
  return internal::Down(kOps, c, ws, bytes);
}
template <const internal::IsaOps& kOps>
void QuantizeAct(const float* x, int64_t n, uint8_t* codes, float* scales) {
  kOps.quantize(x, n, codes, scales, nullptr, nullptr);
}
template <const internal::IsaOps& kOps>
void QuantizeRow(const uint16_t* x, int64_t n, float* q, float* scales) {
  internal::QuantizeBf16Row(kOps, x, n, q, scales);
}

// Indexed by Isa.
constexpr ExpertKernel kKernels[] = {
    {"scalar", kScalarOps.tile_rows, &Run<kScalarOps>, &QuantizeAct<kScalarOps>,
     &QuantizeRow<kScalarOps>, &GateUp<kScalarOps>, &Down<kScalarOps>},
    {"avx2", kAvx2Ops.tile_rows, &Run<kAvx2Ops>, &QuantizeAct<kAvx2Ops>, &QuantizeRow<kAvx2Ops>,
     &GateUp<kAvx2Ops>, &Down<kAvx2Ops>},
    {"avx512", kAvx512Ops.tile_rows, &Run<kAvx512Ops>, &QuantizeAct<kAvx512Ops>,
     &QuantizeRow<kAvx512Ops>, &GateUp<kAvx512Ops>, &Down<kAvx512Ops>},
    {"amx", kAmxOps.tile_rows, &Run<kAmxOps>, &QuantizeAct<kAmxOps>, &QuantizeRow<kAmxOps>,
     &GateUp<kAmxOps>, &Down<kAmxOps>},
};

// Linux's permission for this process to use AMX's tile data state (XTILEDATA), asked once.
bool AmxPermitted() {
  static const bool permitted = [] {
    constexpr long kReqXcompPerm = 0x1023;  // ARCH_REQ_XCOMP_PERM
    constexpr long kXtiledata = 18;         // XFEATURE_XTILEDATA
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
  }();
  return permitted;
}

}  // namespace

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAmx:
      return "amx";
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
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vnni");
    case Isa::kAmx:
      return IsaSupported(Isa::kAvx512) && __builtin_cpu_supports("avx512vbmi") &&
             __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-int8") &&
             AmxPermitted();
  }
  return false;
}

Isa DetectIsa() {
  if (IsaSupported(Isa::kAmx)) return Isa::kAmx;
  if (IsaSupported(Isa::kAvx512)) return Isa::kAvx512;
  if (IsaSupported(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kScalar;
}

absl::StatusOr<Isa> ParseIsa(std::string_view name) {
  if (name == "auto") return DetectIsa();
  if (name == "scalar") return Isa::kScalar;
  if (name == "avx2") return Isa::kAvx2;
  if (name == "avx512") return Isa::kAvx512;
  if (name == "amx") return Isa::kAmx;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown ISA \"", std::string(name), "\" (expected auto, scalar, avx2, avx512 or amx)"));
}

absl::StatusOr<const ExpertKernel*> KernelFor(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
    case Isa::kAvx2:
    case Isa::kAvx512:
    case Isa::kAmx:
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
