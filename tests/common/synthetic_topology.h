// Test helpers: NUMA topologies of machines this one is not, from hwloc synthetic descriptions
// (NumaTopology::FromSynthetic).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/numa_topology.h"

namespace ss::synthetic_topology {

// Two sockets of 32 cores with 2 hyperthreads each, numbered as Linux does (core c: CPUs c and
// c + 64).
inline constexpr char kTwoSockets[] = "pack:2 numa:1 core:32 pu:2(indexes=2*64:1*2)";

// [first, end) as a list.
inline std::vector<int> Range(int first, int end) {
  std::vector<int> v;
  for (int c = first; c < end; ++c) v.push_back(c);
  return v;
}

// The topology of `description` with `allowed` CPUs (empty: all); a test failure and null if
// hwloc refuses it.
inline std::unique_ptr<NumaTopology> Synthetic(const std::string& description,
                                               const std::vector<int>& allowed = {}) {
  absl::StatusOr<std::unique_ptr<NumaTopology>> t =
      NumaTopology::FromSynthetic(description, allowed);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

}  // namespace ss::synthetic_topology
