// The cluster token the tests' services, clients and child processes share
// (proto/cluster_credential.h).
#pragma once

#include <stdlib.h>

#include "proto/cluster_credential.h"

namespace ss::testing_util {

inline constexpr char kTestClusterToken[] =
    "5b1f0c6e2d8a4f7391e0a6b2c4d8e1f35b1f0c6e2d8a4f7391e0a6b2c4d8e1f3";

// The credential in-process services and clients present.
inline ClusterCredential TestCredential() {
  return *ClusterCredential::FromToken(kTestClusterToken);
}

// Gives child processes started from now on the same token (SPLITSERVE_CLUSTER_TOKEN).
inline void ExportTestClusterToken() { setenv(kClusterTokenEnv, kTestClusterToken, 1); }

}  // namespace ss::testing_util
