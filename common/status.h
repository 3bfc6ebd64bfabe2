// Status helpers over absl::Status / absl::StatusOr used at every fallible boundary.
//
//   RETURN_IF_ERROR(expr);            // returns the status of expr if it is not OK
//   ASSIGN_OR_RETURN(auto x, expr);   // x = *expr, or returns expr.status()
//
// Both work in functions returning absl::Status or any absl::StatusOr<T>.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SS_STATUS_CONCAT_INNER(a, b) a##b
#define SS_STATUS_CONCAT(a, b) SS_STATUS_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)                \
  do {                                       \
    ::absl::Status ss_status_ = (expr);      \
    if (!ss_status_.ok()) return ss_status_; \
  } while (0)

#define SS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(*tmp)

#define ASSIGN_OR_RETURN(lhs, expr) \
  SS_ASSIGN_OR_RETURN_IMPL(SS_STATUS_CONCAT(ss_statusor_, __LINE__), lhs, expr)
