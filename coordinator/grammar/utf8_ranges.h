// UTF-8 pieces of the grammar compiler: decoding the grammar text, encoding literals, normalising
// code point classes and turning a code point range into the byte-range sequences that encode
// exactly it (so the automaton runs on bytes and a token may end inside a character). Internal to
// ss_grammar; pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ss::grammar {

// Decodes one well-formed UTF-8 character at the start of `s` (no overlongs, surrogates or values
// above U+10FFFF): its length, or 0 when `s` does not start with one.
size_t DecodeUtf8(std::string_view s, uint32_t* cp);

// Sorted, merged, surrogate-free inclusive ranges; with `negated` the complement within
// U+0000..U+10FFFF (surrogates excluded).
std::vector<std::pair<uint32_t, uint32_t>> NormalizeRanges(
    std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negated);

// One byte range per position of an encoded character.
struct ByteRange {
  uint8_t lo;
  uint8_t hi;
  bool operator==(const ByteRange&) const = default;
};
using ByteSeq = std::vector<ByteRange>;

// Sequences whose union of byte strings is exactly the UTF-8 encodings of [lo, hi] (a range free
// of surrogates). At most a few dozen sequences per range.
std::vector<ByteSeq> Utf8Sequences(uint32_t lo, uint32_t hi);

}  // namespace ss::grammar
