#include "common/kv_record.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/bf16.h"
#include "common/codecs.h"

namespace ss {

void EncodeKvRecord(const float* entry, uint8_t* rec) {
  for (int t = 0; t < kKvTiles; ++t) {
    const float* x = entry + t * kKvTile;
    float amax = 0.0f;
    for (int i = 0; i < kKvTile; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float s = Pow2Scale(amax, kFp8AmaxFloor, kE4m3Max);
    for (int i = 0; i < kKvTile; ++i) {
      rec[kKvNopeOffset + t * kKvTile + i] =
          FloatToE4m3(std::clamp(x[i] / s, -kE4m3Max, kE4m3Max));
    }
    rec[kKvScaleOffset + t] = Ue8m0FromPow2(s);
  }
  for (int i = 0; i < kKvRopeDim; ++i) {
    const uint16_t b = FloatToBf16(entry[kKvNopeDim + i]);
    rec[kKvRopeOffset + 2 * i] = static_cast<uint8_t>(b & 0xff);
    rec[kKvRopeOffset + 2 * i + 1] = static_cast<uint8_t>(b >> 8);
  }
  rec[kKvPadOffset] = 0;
}

void DecodeKvRecord(const uint8_t* rec, float* out) {
  for (int t = 0; t < kKvTiles; ++t) {
    const float s = Ue8m0ToFloat(rec[kKvScaleOffset + t]);
    for (int i = 0; i < kKvTile; ++i) {
      out[t * kKvTile + i] = E4m3ToFloat(rec[kKvNopeOffset + t * kKvTile + i]) * s;
    }
  }
  for (int i = 0; i < kKvRopeDim; ++i) {
    const uint16_t b = static_cast<uint16_t>(rec[kKvRopeOffset + 2 * i] |
                                             (rec[kKvRopeOffset + 2 * i + 1] << 8));
    out[kKvNopeDim + i] = Bf16ToFloat(b);
  }
}

}  // namespace ss
