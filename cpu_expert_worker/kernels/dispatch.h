// The one dispatch table of the expert kernels: the scalar definition and each SIMD variant
// compiled into the binary, chosen at start from CPUID (ARCHITECTURE.md "Kernels").
//
// Startup: `ParseIsa(flag)` ("auto" = DetectIsa()), then `KernelFor(isa)` once; log and export
// KernelFor's name. KernelFor refuses an ISA the CPU (and OS) cannot execute, so no code path
// ever runs an unsupported instruction. All functions are thread-safe.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "cpu_expert_worker/kernels/expert_kernels.h"

namespace ss::expert {

enum class Isa {
  kScalar = 0,  // portable C++; the definition
  kAvx2 = 1,    // AVX2 + FMA (Zen 2, Haswell and later)
  kAvx512 = 2,  // AVX-512 F + BW + VL + DQ + VNNI (Cascade Lake, Ice Lake, Zen 4 and later;
                //   Skylake-SP, without VNNI, runs the AVX2 kernels)
  kAmx = 3,     // avx512 plus VBMI, AMX-TILE, AMX-INT8: tiles for calls of several activation rows
                //   (Sapphire Rapids and later; Linux 5.16+, which grants the tile state)
};

// "scalar", "avx2", "avx512", "amx"; "unknown" for a value outside the enum.
const char* IsaName(Isa isa);

// Whether this CPU and OS can run `isa` (CPUID feature bits with OS-enabled register state,
// via __builtin_cpu_supports; for amx also the kernel's permission to use the tile data state,
// requested for the process on the first call: arch_prctl ARCH_REQ_XCOMP_PERM).
bool IsaSupported(Isa isa);

// The best supported ISA: amx if avx512 and VBMI, AMX-TILE, AMX-INT8 are present and the OS grants
// the tile state, else avx512 if F, BW, VL, DQ and VNNI are present, else avx2 if AVX2 and FMA are,
// else scalar. (Every variant gives the scalar definition's bits.)
Isa DetectIsa();

// "auto" (= DetectIsa()), "scalar", "avx2", "avx512" or "amx". Does not check support; KernelFor
// does.
absl::StatusOr<Isa> ParseIsa(std::string_view name);

// The kernel for `isa`: InvalidArgument for a value outside the enum, FailedPrecondition if
// this CPU lacks it. The pointer is to a static table entry.
absl::StatusOr<const ExpertKernel*> KernelFor(Isa isa);

}  // namespace ss::expert
