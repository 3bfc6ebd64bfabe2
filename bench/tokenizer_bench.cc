// Single-threaded Tokenizer::Encode throughput on English prose, as MB/s and as ratios to two
// baselines measured in the same run: a memcpy of the text, and PreTokenize alone (added-token
// matching + the PCRE2 Split passes, without BPE). Encode runs once on the whole text and once
// in --chunk-byte calls (request-sized: Encode's memo of repeated pieces lives for one call, so
// small calls repeat more BPE work). Two texts of about --mb MB each:
//   cases-prose: the ascii_prose texts of cases.jsonl, repeated (few distinct words);
//   zipf-prose:  sentences of vocab words (" the", " model", ...) drawn with Zipf(1) over their
//                ids, which BPE assigns roughly by frequency, so the word mix is varied.
//
//   build/bin/tokenizer_bench [--tokenizer FILE] [--cases FILE] [--mb N] [--chunk BYTES]
//                             [--repeats N]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "coordinator/tokenizer.h"
#include "nlohmann/json.hpp"

namespace {

using Clock = std::chrono::steady_clock;

template <typename F>
double Best(int repeats, F&& f) {
  double best = 1e30;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

std::string CasesProse(const std::string& cases, size_t bytes) {
  std::vector<std::string> texts;
  std::ifstream in(cases);
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("category", "") == "ascii_prose") texts.push_back(j["text"]);
  }
  std::string out;
  for (size_t i = 0; !texts.empty() && out.size() < bytes; ++i) {
    out += texts[i % texts.size()];
    out += i % 4 == 3 ? "\n\n" : " ";
  }
  return out;
}

std::string ZipfProse(const ss::Tokenizer& tok, size_t bytes) {
  std::vector<std::string> words;  // " word" tokens, lowercase letters only, in id order
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    auto b = tok.TokenBytes(id);
    if (!b || b->size() < 3 || (*b)[0] != ' ' || tok.IsAddedToken(id)) continue;
    if (std::all_of(b->begin() + 1, b->end(), [](char c) { return c >= 'a' && c <= 'z'; })) {
      words.emplace_back(*b);
    }
  }
  std::vector<double> cdf(words.size());
  double sum = 0;
  for (size_t i = 0; i < words.size(); ++i) cdf[i] = sum += 1.0 / (i + 1);
  std::mt19937_64 rng(20251129);
  std::uniform_real_distribution<double> u(0, sum);
  std::uniform_int_distribution<int> len(5, 20), punct(0, 9);
  std::string out;
  for (int sentence = 0; out.size() < bytes; ++sentence) {
    const int n = len(rng);
    for (int w = 0; w < n; ++w) {
      std::string word = words[std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin()];
      if (w == 0) {
        word.erase(0, out.empty() || out.back() == '\n' ? 1 : 0);
        word[word[0] == ' ' ? 1 : 0] -= 'a' - 'A';
      }
      out += word;
      if (w + 1 < n && punct(rng) == 0) out += ',';
    }
    out += sentence % 6 == 5 ? ".\n\n" : ".";
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tok_path = SS_TOKENIZER_JSON;
  std::string cases = SS_TOKENIZER_DATA "/cases.jsonl";
  double mb = 4;
  int repeats = 3;
  size_t chunk = 4096;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokenizer")) tok_path = argv[i + 1];
    if (!std::strcmp(argv[i], "--cases")) cases = argv[i + 1];
    if (!std::strcmp(argv[i], "--mb")) mb = std::max(0.01, std::atof(argv[i + 1]));
    if (!std::strcmp(argv[i], "--repeats")) repeats = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--chunk")) chunk = std::max(1, std::atoi(argv[i + 1]));
  }
  const auto t0 = Clock::now();
  auto loaded = ss::Tokenizer::Load(tok_path);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", std::string(loaded.status().message()).c_str());
    return 1;
  }
  const ss::Tokenizer& tok = **loaded;
  std::printf("load %s: %.3f s\n", tok_path.c_str(),
              std::chrono::duration<double>(Clock::now() - t0).count());

  const size_t bytes = static_cast<size_t>(mb * (1 << 20));
  const std::pair<const char*, std::string> texts[] = {{"cases-prose", CasesProse(cases, bytes)},
                                                       {"zipf-prose", ZipfProse(tok, bytes)}};
  std::printf("%-12s %8s %9s %9s %8s %10s %10s %10s\n", "text", "MB", "encode_s", "MB/s", "B/token",
              "memcpy_s", "x_memcpy", "x_presplit");
  for (const auto& [name, text] : texts) {
    if (text.empty()) {
      std::fprintf(stderr, "%s: no text (is %s readable?)\n", name, cases.c_str());
      return 1;
    }
    std::string copy(text.size(), '\0');
    const double t_copy = Best(repeats, [&] {
      std::memcpy(copy.data(), text.data(), text.size());
      asm volatile("" : : "r"(copy.data()) : "memory");
    });
    size_t pieces = 0;
    const double t_split = Best(repeats, [&] { pieces = tok.PreTokenize(text)->size(); });
    size_t ntok = 0;
    const double t_enc = Best(repeats, [&] { ntok = tok.Encode(text)->size(); });
    const double t_chunks = Best(repeats, [&] {
      for (size_t i = 0; i < text.size(); i += chunk) {
        // Cut at a character boundary.
        size_t end = std::min(text.size(), i + chunk);
        while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
        if (!tok.Encode(std::string_view(text).substr(i, end - i)).ok()) std::abort();
        i = end - chunk;
      }
    });
    const double mbytes = text.size() / 1e6;
    std::printf("%-12s %6.2f %9.3f %7.2f %8.2f %10.5f %9.0f %10.2f %14.2f\n", name, mbytes, t_enc,
                mbytes / t_enc, double(text.size()) / ntok, t_copy, t_enc / t_copy, t_enc / t_split,
                mbytes / t_chunks);
    std::printf("  %zu tokens, %zu pieces; PreTokenize alone %.3f s (%.2f MB/s)\n", ntok, pieces,
                t_split, mbytes / t_split);
  }
  return 0;
}
