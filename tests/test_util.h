// Small helpers shared by tests.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

#include "gtest/gtest.h"

namespace ss::testing_util {

// A fresh directory under the test temp dir, removed when the object goes away.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "ss_test") {
    std::string tmpl =
        (std::filesystem::path(::testing::TempDir()) / (prefix + "_XXXXXX")).string();
    EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const {
    return (std::filesystem::path(path_) / name).string();
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace ss::testing_util
