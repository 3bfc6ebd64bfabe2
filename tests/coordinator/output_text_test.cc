// Stop strings and logprob bookkeeping of the gateway's output (coordinator/output_text.h), on
// the real DeepSeek tokenizer.
#include "coordinator/output_text.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace ss {
namespace {

// Feeds `text` cut at `cuts` (sorted offsets) and checks that the emitted text only grows into
// the final result; returns the result.
std::string FeedSplit(const std::vector<std::string>& stops, const std::string& text,
                      const std::vector<size_t>& cuts, bool* stopped) {
  StopStringMatcher m(stops);
  std::string out;
  size_t prev = 0;
  for (size_t i = 0; i <= cuts.size(); ++i) {
    const size_t end = i < cuts.size() ? cuts[i] : text.size();
    out += m.Feed(std::string_view(text).substr(prev, end - prev));
    prev = end;
  }
  out += m.Finish();
  *stopped = m.stopped();
  return out;
}

std::string Whole(const std::vector<std::string>& stops, const std::string& text, bool* stopped) {
  return FeedSplit(stops, text, {}, stopped);
}

TEST(StopStringMatcherTest, CutsBeforeTheStopString) {
  bool stopped = false;
  EXPECT_EQ(Whole({"is 4"}, "this is 3, this is 4!", &stopped), "this is 3, this ");
  EXPECT_TRUE(stopped);
  EXPECT_EQ(Whole({"zzz"}, "no match here", &stopped), "no match here");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(Whole({}, "no stops", &stopped), "no stops");
  EXPECT_EQ(Whole({""}, "empty stop ignored", &stopped), "empty stop ignored");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(Whole({"abc"}, "abc", &stopped), "");
  EXPECT_TRUE(stopped);
  // The first stop string to complete wins; of those ending together, the longest.
  EXPECT_EQ(Whole({"abc", "b"}, "xabc", &stopped), "xa");
  EXPECT_EQ(Whole({"bc", "abc"}, "xabc", &stopped), "x");
  EXPECT_EQ(Whole({"\n\n", "。"}, "第一。第二\n\n", &stopped), "第一");
}

TEST(StopStringMatcherTest, IncludeStopReturnsTheStopStringItself) {
  StopStringMatcher m({"is 4", "zzz"}, /*include_stop=*/true);
  std::string out;
  for (const char* piece : {"this is 3, th", "is i", "s 4! and more"}) out += m.Feed(piece);
  out += m.Finish();
  EXPECT_EQ(out, "this is 3, this is 4");
  EXPECT_TRUE(m.stopped());
}

TEST(StopStringMatcherTest, HoldsBackWhatMayStillBecomeAStopString) {
  StopStringMatcher m({"</end>"});
  EXPECT_EQ(m.Feed("text </"), "text ");
  EXPECT_EQ(m.held_bytes(), 2u);
  EXPECT_EQ(m.Feed("e"), "");
  EXPECT_EQ(m.Feed("x"), "</ex");  // not a stop string after all
  EXPECT_EQ(m.Feed(" </en"), " ");
  EXPECT_EQ(m.Feed("d> more"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.Feed("later"), "");
  EXPECT_EQ(m.Finish(), "");

  StopStringMatcher tail({"STOP"});
  EXPECT_EQ(tail.Feed("ends with ST"), "ends with ");
  EXPECT_EQ(tail.Finish(), "ST");  // the end: released
  EXPECT_FALSE(tail.stopped());
}

// Every split of the text gives the same result, and what has been emitted is always a prefix of
// it: a stream never shows text that later turns out to be part of a stop string.
TEST(StopStringMatcherTest, AnySplitGivesTheSameText) {
  const std::vector<std::vector<std::string>> stop_sets = {
      {"is 4"}, {"aab"}, {"ab", "ba"}, {"\n\n", "</think>"}, {"答案", "🎉"}, {"xyz"}};
  const std::vector<std::string> texts = {
      "this is 3, this is 4!", "aaaab",      "aaba", "thinking...</thi></think>answer\n\n",
      "思考 答 答案 🎉",        "xy xy xyxyz"};
  std::mt19937 rng(7);
  for (const auto& stops : stop_sets) {
    for (const auto& text : texts) {
      bool whole_stopped = false;
      const std::string whole = Whole(stops, text, &whole_stopped);
      for (int trial = 0; trial < 200; ++trial) {
        std::vector<size_t> cuts;
        for (size_t i = 1; i < text.size(); ++i) {
          if (rng() % 3 == 0) cuts.push_back(i);
        }
        StopStringMatcher m(stops);
        std::string out;
        size_t prev = 0;
        for (size_t i = 0; i <= cuts.size(); ++i) {
          const size_t end = i < cuts.size() ? cuts[i] : text.size();
          out += m.Feed(std::string_view(text).substr(prev, end - prev));
          ASSERT_EQ(whole.compare(0, out.size(), out), 0) << text << " emitted " << out;
          prev = end;
        }
        out += m.Finish();
        EXPECT_EQ(out, whole) << text;
        EXPECT_EQ(m.stopped(), whole_stopped) << text;
      }
    }
  }
}

class OutputTextTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto tok = Tokenizer::Load(SS_TOKENIZER_JSON);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = tok->release();
  }
  static void TearDownTestSuite() { delete tokenizer_; }
  std::vector<int32_t> Ids(const std::string& text) {
    auto ids = tokenizer_->Encode(text);
    EXPECT_TRUE(ids.ok());
    return *ids;
  }
  static std::vector<TokenLogprobs> Logprobs(size_t n) {
    std::vector<TokenLogprobs> lps(n);
    for (size_t i = 0; i < n; ++i) lps[i].logprob = -static_cast<float>(i);
    return lps;
  }
  static inline Tokenizer* tokenizer_ = nullptr;
};

TEST_F(OutputTextTest, NoStopReturnsTheDecodedTextAndEveryLogprob) {
  const std::string text = "Hello, 世界 🎉 and more";
  const auto ids = Ids(text);
  const auto lps = Logprobs(ids.size());
  OutputText out(*tokenizer_, {});
  OutputText::Piece all;
  for (size_t i = 0; i < ids.size(); ++i) {
    all.Append(out.Add(std::span(ids).subspan(i, 1), std::span(lps).subspan(i, 1)));
  }
  all.Append(out.Finish());
  EXPECT_EQ(all.text, text);
  EXPECT_FALSE(out.stopped());
  EXPECT_EQ(out.tokens(), ids.size());
  ASSERT_EQ(all.logprobs.size(), ids.size());
  // Each entry's offset is where its id's bytes start in the text.
  size_t offset = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(all.logprobs[i].id, ids[i]);
    EXPECT_EQ(all.logprobs[i].logprobs.logprob, -static_cast<float>(i));
    // An id ending inside a character reports where its complete text starts: at most `offset`.
    EXPECT_LE(all.logprobs[i].text_offset, offset);
    offset += tokenizer_->TokenBytes(ids[i])->size();
  }
}

TEST_F(OutputTextTest, StopAcrossIdsCutsTextTokensAndLogprobs) {
  const std::string text = "The answer is 42. Done here.";
  const auto ids = Ids(text);
  ASSERT_GT(ids.size(), 6u);
  const auto lps = Logprobs(ids.size());
  // "s 4" spans at least two ids.
  for (int32_t id : ids) {
    EXPECT_EQ(tokenizer_->TokenBytes(id)->find("s 4"), std::string_view::npos);
  }
  OutputText out(*tokenizer_, {"s 4"});
  OutputText::Piece all;
  size_t fed = 0;
  for (size_t i = 0; i < ids.size() && !out.stopped(); ++i, ++fed) {
    all.Append(out.Add(std::span(ids).subspan(i, 1), std::span(lps).subspan(i, 1)));
  }
  EXPECT_TRUE(out.stopped());
  all.Append(out.Finish());
  EXPECT_EQ(all.text, "The answer i");
  EXPECT_EQ(out.tokens(), fed);
  // The ids up to the one completing the stop string are taken; entries only for returned text.
  std::string prefix;
  size_t n = 0;
  while (n < ids.size() && prefix.size() < all.text.size()) {
    prefix += *tokenizer_->TokenBytes(ids[n++]);
  }
  EXPECT_EQ(all.logprobs.size(), n);
  EXPECT_LT(all.logprobs.size(), out.tokens() + 1);

  // Adding everything in one event stops at the same place and takes no more ids.
  OutputText once(*tokenizer_, {"s 4"});
  OutputText::Piece p = once.Add(ids, lps);
  EXPECT_TRUE(once.stopped());
  EXPECT_EQ(p.text, all.text);
  EXPECT_EQ(once.tokens(), out.tokens());
  EXPECT_EQ(p.logprobs.size(), all.logprobs.size());
}

TEST_F(OutputTextTest, StopStringsMatchOnlyAfterMinTokens) {
  const std::string text = "ab. cd. ef. gh.";
  const auto ids = Ids(text);
  size_t first_dot_id = 0;  // the id whose text holds the first "."
  for (std::string seen; seen.find('.') == std::string::npos; ++first_dot_id) {
    seen += *tokenizer_->TokenBytes(ids[first_dot_id]);
  }
  ASSERT_LT(first_dot_id + 2, ids.size());
  // min_tokens covering the first ".": the text up to there passes unmatched; the next "." stops.
  OutputText out(*tokenizer_, {"."}, false, first_dot_id);
  OutputText::Piece all = out.Add(ids, {});
  all.Append(out.Finish());
  EXPECT_TRUE(out.stopped());
  EXPECT_EQ(all.text, "ab. cd");
  OutputText plain(*tokenizer_, {"."});
  EXPECT_EQ(plain.Add(ids, {}).text, "ab");
}

TEST_F(OutputTextTest, StreamedLogprobsWaitForTheirText) {
  // While "<" may start the stop string "<end>", the id holding it keeps its logprob entry.
  const auto a = Ids("value");
  const auto b = Ids(" <");
  OutputText out(*tokenizer_, {"<end>"});
  auto p = out.Add(a, Logprobs(a.size()));
  EXPECT_EQ(p.text, "value");
  EXPECT_EQ(p.logprobs.size(), a.size());
  p = out.Add(b, Logprobs(b.size()));
  EXPECT_EQ(p.text, " ");
  EXPECT_TRUE(p.logprobs.empty());
  p = out.Finish();
  EXPECT_EQ(p.text, "<");
  EXPECT_EQ(p.logprobs.size(), b.size());
}

}  // namespace
}  // namespace ss
