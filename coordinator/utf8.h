// UTF-8 helpers for text that crosses token boundaries: validation, lossy conversion (the rules
// of Rust's String::from_utf8_lossy, which `tokenizers` uses to decode) and the complete-prefix
// test a streaming detokeniser needs. Pure functions, safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ss::utf8 {

// One decoding step at p[0..n), n >= 1: a whole character of `len` bytes; an invalid sequence
// whose maximal subpart is `len` bytes (overlongs, surrogates, > U+10FFFF, stray continuation
// bytes); or a valid prefix of `len` bytes cut off by the end of the input.
enum class Kind { kChar, kInvalid, kTruncated };
struct Step {
  Kind kind;
  size_t len;
};
Step Next(const unsigned char* p, size_t n);

// Offset of the first byte that is not part of valid UTF-8 (a truncated character at the end
// counts), or std::string_view::npos when `s` is valid.
size_t FirstInvalid(std::string_view s);

// `bytes` with each maximal invalid subsequence, and a truncated character at the end, replaced
// by one U+FFFD. The result is valid UTF-8; valid input comes back unchanged.
std::string Lossy(std::string_view bytes);

// Length of the longest prefix of `bytes` that does not end in a truncated character: what follows
// it (at most 3 bytes) is the start of a character more bytes could complete. Lossy of the prefix
// followed by Lossy of the rest plus later bytes equals Lossy of everything.
size_t CompletePrefix(std::string_view bytes);

// Appends code point `cp` (< 0x110000, not a surrogate) as UTF-8.
void Append(uint32_t cp, std::string* out);

}  // namespace ss::utf8
