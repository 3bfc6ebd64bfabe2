// `splitserve up`'s terminal (coordinator/console.h): the children's lines pass through whole,
// the status line is erased before them and drawn again after.
#include "coordinator/console.h"

#include <unistd.h>

#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ss {
namespace {

void Put(int fd, const std::string& s) {
  ASSERT_EQ(write(fd, s.data(), s.size()), static_cast<ssize_t>(s.size()));
}

TEST(Console, StatusLineErasedBeforeTheChildrensLinesAndDrawnAgainAfter) {
  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  absl::StatusOr<std::unique_ptr<Console>> c = Console::Create(out, /*relay=*/true);
  ASSERT_TRUE(c.ok()) << c.status();
  Console& console = **c;
  const int fd = dup(console.child_fd());  // a child's copy
  ASSERT_GE(fd, 0);
  console.SetStatus("bar");
  Put(fd, "one\ntwo\n");
  Put(fd, "thr");  // a line without its end: copied, ended, when the pipe closes
  close(fd);
  console.Stop();
  console.ClearStatus();
  EXPECT_EQ(testing_util::ReadAll(out),
            "\r\033[Kbar\r"
            "\r\033[Kone\ntwo\nbar\r"
            "\r\033[Kthr\nbar\r"
            "\r\033[K");
  std::fclose(out);
}

TEST(Console, WithoutTheRelayOnlyTheStatusLine) {
  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  absl::StatusOr<std::unique_ptr<Console>> c = Console::Create(out, /*relay=*/false);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->child_fd(), -1);
  EXPECT_EQ((*c)->columns(), 80);  // not a terminal
  (*c)->SetStatus("a");
  (*c)->SetStatus("b");
  (*c)->ClearStatus();
  (*c)->ClearStatus();  // nothing to erase
  (*c)->Stop();
  EXPECT_EQ(testing_util::ReadAll(out), "\r\033[Ka\r\r\033[Kb\r\r\033[K");
  std::fclose(out);
}

}  // namespace
}  // namespace ss
