// API key lists (coordinator/api_keys.h): lists that would have turned authentication off or kept
// stray whitespace are errors, never an empty or padded key set.
#include "coordinator/api_keys.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace ss {
namespace {

using Keys = std::vector<std::string>;

TEST(ApiKeysTest, TrimsAndSplitsOnCommasAndLines) {
  auto k = ParseApiKeys("a, b", "test");
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(*k, (Keys{"a", "b"}));
  k = ParseApiKeys("# keys\n  sk-one  \n\nsk-two,sk-three\r\n", "test");
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(*k, (Keys{"sk-one", "sk-two", "sk-three"}));
}

TEST(ApiKeysTest, EmptyListsAndEntriesAreErrors) {
  for (const char* text :
       {"", ",", " ", " , ", "a,,b", "a,", "\n\n", "# only a comment\n", "a b", "a\tb", "a\x01"}) {
    auto k = ParseApiKeys(text, "SPLITSERVE_API_KEYS");
    EXPECT_FALSE(k.ok()) << "'" << text << "' gave " << k->size() << " keys";
    if (!k.ok()) {
      EXPECT_NE(k.status().message().find("SPLITSERVE_API_KEYS"), std::string::npos);
    }
  }
}

TEST(ApiKeysTest, ErrorsNeverQuoteAKey) {
  auto k = ParseApiKeys("sk-secret-one,,sk-secret-two", "test");
  ASSERT_FALSE(k.ok());
  EXPECT_EQ(k.status().message().find("secret"), std::string::npos) << k.status();
  k = ParseApiKeys("sk-secret one", "test");
  ASSERT_FALSE(k.ok());
  EXPECT_EQ(k.status().message().find("secret"), std::string::npos) << k.status();
}

TEST(ApiKeysTest, ReadsAFile) {
  const std::string path = ::testing::TempDir() + "/api_keys_test_keys";
  {
    std::ofstream out(path);
    out << "sk-a\nsk-b\n";
  }
  auto k = ReadApiKeysFile(path);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(*k, (Keys{"sk-a", "sk-b"}));
  std::remove(path.c_str());
  k = ReadApiKeysFile(path);
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find(path), std::string::npos);
}

}  // namespace
}  // namespace ss
