// Integer rounding shared by host code: blocks of a size, rows padded to a multiple.
#pragma once

#include <concepts>
#include <type_traits>

namespace ss {

// ceil(a / b) for a >= 0, b > 0.
template <std::integral A, std::integral B>
constexpr std::common_type_t<A, B> CeilDiv(A a, B b) {
  using T = std::common_type_t<A, B>;
  return (static_cast<T>(a) + static_cast<T>(b) - 1) / static_cast<T>(b);
}

// The least multiple of `to` that is >= v, for v >= 0, to > 0.
template <std::integral A, std::integral B>
constexpr std::common_type_t<A, B> RoundUp(A v, B to) {
  return CeilDiv(v, to) * static_cast<std::common_type_t<A, B>>(to);
}

}  // namespace ss
