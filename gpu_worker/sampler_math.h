// The host sampler's arithmetic over the vocabulary (gpu_worker/sampler.h), written so that the
// compiler vectorises it and shared with the rule's plain statement
// (tests/gpu_worker/sampler_reference.h), so that both draw the same token:
//   WeightExp(x)  e^x for x <= 0, the weight of an id whose tempered logit is x below the
//                 likeliest's: within 2 ulp of exp(x) for x in [-708, 0] (a degree-13 Taylor
//                 polynomial of e^r, |r| <= ln2 / 2, scaled by 2^n), and 0 below -708 (where e^x is
//                 under 2^-1021, less than any weight that can matter beside the likeliest's 1) and
//                 for -inf;
//   SumWeights(w) the weights' sum as 8 running sums, sum k taking the ids = k (mod 8) in id
//                 order, then added pairwise ((0+1)+(2+3))+((4+5)+(6+7)).
// Branch-free and call-free, with every operation rounded on its own (the build's
// -ffp-contract=off): the same bits from the vectorised loops and from one call.
#pragma once

#include <bit>
#include <cstdint>
#include <span>

namespace ss::gpu {

inline double WeightExp(double x) {
  constexpr double kLog2e = 1.4426950408889634074;
  constexpr double kLn2Hi = 6.93147180369123816490e-01;  // fdlibm's split of ln 2
  constexpr double kLn2Lo = 1.90821492927058770002e-10;
  constexpr double kRound = 0x1.8p52;  // adding it rounds to an integer, kept in the low bits
  const double xc = x < -708.0 ? -708.0 : x;
  const double kd = xc * kLog2e + kRound;
  const double n = kd - kRound;
  const double r = (xc - n * kLn2Hi) - n * kLn2Lo;
  // e^r = sum r^i / i!, i <= 13: the first term left out is under 2^-57 of the sum.
  double p = 1.0 / 6227020800.0;
  p = p * r + 1.0 / 479001600.0;
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  // 2^n from kd's low bits (n in [-1022, 0]): the exponent field n + 1023.
  const double scale = std::bit_cast<double>((std::bit_cast<uint64_t>(kd) + 1023) << 52);
  return x < -708.0 ? 0.0 : p * scale;
}

inline double SumWeights(std::span<const double> w) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const size_t n = w.size(), whole = n - n % 8;
  for (size_t i = 0; i < whole; i += 8) {
    for (size_t k = 0; k < 8; ++k) s[k] += w[i + k];
  }
  for (size_t i = whole; i < n; ++i) s[i - whole] += w[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

}  // namespace ss::gpu
