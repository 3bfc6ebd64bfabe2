// The version of proto/cluster.proto's semantics (control plane, step stream, stage transfer),
// checked at registration, on every Status / Steps / PushStreams call, and refused with a status
// naming both versions. Bump on any change of a field's meaning (STYLE.md "Wire formats are
// versioned").
#pragma once

#include <cstdint>

namespace ss {

inline constexpr uint32_t kClusterProtocolVersion = 1;

}  // namespace ss
