// WriteFileAtomically (common/file_write.h): whole files, replaced whole, and a failure that
// names the file and leaves nothing behind.
#include "common/file_write.h"

#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ss {
namespace {

TEST(FileWriteTest, WritesWholeFilesAndReplacesThem) {
  testing_util::TempDir dir("ss_file_write");
  const std::string path = dir / "port";
  ASSERT_TRUE(WriteFileAtomically(path, "12345\n").ok());
  EXPECT_EQ(testing_util::ReadAll(path), "12345\n");
  ASSERT_TRUE(WriteFileAtomically(path, "7\n").ok());
  EXPECT_EQ(testing_util::ReadAll(path), "7\n");
  // Only the file itself is left (no temporary beside it).
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().string(), path);
    ++entries;
  }
  EXPECT_EQ(entries, 1);
}

TEST(FileWriteTest, AFailureNamesTheFile) {
  testing_util::TempDir dir("ss_file_write");
  const absl::Status s = WriteFileAtomically(dir / "missing/port", "1\n");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find(dir / "missing/port"), std::string::npos) << s;
  EXPECT_FALSE(std::filesystem::exists(dir / "missing"));
}

}  // namespace
}  // namespace ss
