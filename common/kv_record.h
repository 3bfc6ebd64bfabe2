// The "fp8_ds_mla" KV cache record (spec §4.2): one 512-dim latent KV entry (a raw window entry
// or a compressed entry) in 584 bytes. This header is the single definition of the layout; the
// CPU codec below and the CUDA kernels (gpu_worker/kernels/paged_kv.h) both use it.
//
// Per-token AoS order (the record of slot i starts at byte i * kKvRecordBytes of a pool):
//
//   bytes [  0, 448)  nope dims 0..447 as e4m3 codes, q = e4m3(clamp(x / s_tile, ±448))
//   bytes [448, 576)  rope dims 448..511 as 64 little-endian bf16 values (unquantised)
//   bytes [576, 583)  7 ue8m0 scale bytes, one per 64-dim nope tile: s = 2^(byte − 127)
//   byte   583        padding, always 0
//
// (FlashMLA places the 7+1 scale bytes of a whole page after the page's 576-byte parts; the
// per-token bytes are the same, only their placement differs. We keep them inside the record.)
//
// The tile scale is the model's FP8 simulation scale, s = Pow2Scale(amax, 1e-4, 448) (spec §5.3),
// and e4m3 rounding is round-to-nearest-even. Exactness: an entry whose nope dims went through
// Fp8SimInplace(x, 448, 64, /*round_e4m3=*/true) round-trips bit for bit (the re-derived scale is
// the same, or half of it when the rounded tile max lands on 224·s; every value is still on the
// grid). Any other entry is quantised: each decoded nope value is within half an e4m3 ulp (times
// s) of the input. Rope dims are stored as bf16 and round-trip exactly for bf16-valued inputs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ss {

inline constexpr int kKvDim = 512;
inline constexpr int kKvNopeDim = 448;
inline constexpr int kKvRopeDim = 64;
inline constexpr int kKvTile = 64;
inline constexpr int kKvTiles = kKvNopeDim / kKvTile;  // 7

inline constexpr size_t kKvNopeOffset = 0;
inline constexpr size_t kKvRopeOffset = kKvNopeOffset + kKvNopeDim;       // 448
inline constexpr size_t kKvScaleOffset = kKvRopeOffset + kKvRopeDim * 2;  // 576
inline constexpr size_t kKvPadOffset = kKvScaleOffset + kKvTiles;         // 583
inline constexpr size_t kKvRecordBytes = kKvPadOffset + 1;                // 584

static_assert(kKvNopeDim + kKvRopeDim == kKvDim);
static_assert(kKvTiles * kKvTile == kKvNopeDim && kKvTiles == 7);
static_assert(kKvRopeOffset == 448 && kKvScaleOffset == 576 && kKvPadOffset == 583);
static_assert(kKvRecordBytes == 584, "fp8_ds_mla record is 584 bytes (spec §4.2)");
static_assert(kKvRopeOffset % 2 == 0, "rope bf16 values must be 2-byte aligned");
static_assert(kKvRecordBytes % 8 == 0, "records stay 8-byte aligned inside a pool");

// entry: 512 float values (nope dims 0..447, rope dims 448..511), expected bf16-representable
// (rope values are rounded to bf16 RNE otherwise). rec: kKvRecordBytes bytes, fully written.
void EncodeKvRecord(const float* entry, uint8_t* rec);

// out: 512 floats; nope dims are e4m3 · s (exact, bf16-representable), rope dims the stored bf16.
void DecodeKvRecord(const uint8_t* rec, float* out);

}  // namespace ss
