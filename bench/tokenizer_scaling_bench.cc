// Tokenizer::Encode time against input size, 10 KB to 8 MB in one call, for inputs chosen to hit
// every part of the encoder with long runs: the per-byte time of each size is printed as a ratio
// to the same input's 10 KB time measured in the same run, so a linear encoder prints ratios near
// 1 at every size and a quadratic one ratios that grow with the size (x800 at 8 MB).
//   digits:  random decimal digits (pre-split into 3-digit pieces, nearly all repeats: the memo);
//   prose:   the ascii_prose texts of cases.jsonl, repeated (ordinary text);
//   letters: random lower-case letters with no space (ONE pre-token as long as the input: BPE);
//   spaces:  spaces with an "x" every 64 KB (long whitespace runs: the look-ahead alternatives);
//   cjk:     random CJK ideographs (the CJK Split step's one long piece);
//   special: `<｜User｜>` repeated with a letter between (added-token matching).
//
//   build/bin/tokenizer_scaling_bench [--tokenizer FILE] [--cases FILE] [--max-mb 8]
//                                     [--only NAME] [--min-s 0.3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "coordinator/tokenizer.h"
#include "nlohmann/json.hpp"

namespace {

using Clock = std::chrono::steady_clock;

// Best time of Encode(text), repeating until `min_s` seconds have passed (at least once).
double TimeEncode(const ss::Tokenizer& tok, std::string_view text, double min_s, size_t* ntok) {
  double best = 1e30, total = 0;
  do {
    const auto t0 = Clock::now();
    auto ids = tok.Encode(text);
    const double t = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!ids.ok()) {
      std::fprintf(stderr, "encode: %s\n", std::string(ids.status().message()).c_str());
      std::exit(1);
    }
    *ntok = ids->size();
    best = std::min(best, t);
    total += t;
  } while (total < min_s);
  return best;
}

std::string Prose(const std::string& cases) {
  std::string out;
  std::ifstream in(cases);
  std::string line;
  int i = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || j.value("category", "") != "ascii_prose") continue;
    out += j["text"].get<std::string>();
    out += ++i % 4 == 0 ? "\n\n" : " ";
  }
  return out;
}

// `bytes` of input `name` (UTF-8, cut at a character boundary).
std::string Make(const std::string& name, size_t bytes, const std::string& prose) {
  std::mt19937_64 rng(20261201);
  std::string s;
  s.reserve(bytes + 8);
  if (name == "digits") {
    while (s.size() < bytes) s += static_cast<char>('0' + rng() % 10);
  } else if (name == "prose") {
    while (s.size() < bytes) s += prose;
  } else if (name == "letters") {
    while (s.size() < bytes) s += static_cast<char>('a' + rng() % 26);
  } else if (name == "spaces") {
    while (s.size() < bytes) s += s.size() % 65536 == 65535 ? 'x' : ' ';
  } else if (name == "cjk") {
    while (s.size() < bytes) {
      const uint32_t cp = 0x4E00 + rng() % (0x9FA5 - 0x4E00);
      s += static_cast<char>(0xE0 | (cp >> 12));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
  } else if (name == "special") {
    while (s.size() < bytes) {
      s += "<｜User｜>";
      s += static_cast<char>('a' + rng() % 26);
    }
  }
  size_t end = std::min(bytes, s.size());
  while (end < s.size() && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
  s.resize(end);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tok_path = SS_TOKENIZER_JSON;
  std::string cases = SS_TOKENIZER_DATA "/cases.jsonl";
  double max_mb = 8, min_s = 0.3;
  std::string only;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokenizer")) tok_path = argv[i + 1];
    if (!std::strcmp(argv[i], "--cases")) cases = argv[i + 1];
    if (!std::strcmp(argv[i], "--max-mb")) max_mb = std::atof(argv[i + 1]);
    if (!std::strcmp(argv[i], "--only")) only = argv[i + 1];
    if (!std::strcmp(argv[i], "--min-s")) min_s = std::atof(argv[i + 1]);
  }
  auto loaded = ss::Tokenizer::Load(tok_path);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", std::string(loaded.status().message()).c_str());
    return 1;
  }
  const ss::Tokenizer& tok = **loaded;
  const std::string prose = Prose(cases);
  if (prose.empty()) {
    std::fprintf(stderr, "no ascii_prose texts in %s\n", cases.c_str());
    return 1;
  }
  const size_t sizes[] = {10'000, 100'000, 1'000'000, 8'000'000};
  std::printf("tokenizer %s\n%-8s %10s %10s %9s %8s %9s\n", tok_path.c_str(), "input", "bytes",
              "tokens", "encode_s", "ns/B", "x_10KB");
  for (const char* name : {"digits", "prose", "letters", "spaces", "cjk", "special"}) {
    if (!only.empty() && only != name) continue;
    double base = 0;
    for (const size_t bytes : sizes) {
      if (bytes > max_mb * 1e6) break;
      const std::string text = Make(name, bytes, prose);
      size_t ntok = 0;
      const double t = TimeEncode(tok, text, bytes <= 100'000 ? min_s : 0, &ntok);
      const double ns_per_byte = t * 1e9 / text.size();
      if (base == 0) base = ns_per_byte;
      std::printf("%-8s %10zu %10zu %9.4f %8.2f %9.2f\n", name, text.size(), ntok, t, ns_per_byte,
                  ns_per_byte / base);
      std::fflush(stdout);
    }
  }
  return 0;
}
