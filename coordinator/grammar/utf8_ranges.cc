#include "coordinator/grammar/utf8_ranges.h"

#include <algorithm>

#include "coordinator/utf8.h"

namespace ss::grammar {

size_t DecodeUtf8(std::string_view s, uint32_t* cp) {
  if (s.empty()) return 0;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  unsigned char c = p[0];
  size_t len;
  uint32_t v, min;
  if (c < 0x80) {
    *cp = c;
    return 1;
  } else if (c >= 0xC2 && c <= 0xDF) {
    len = 2, v = c & 0x1F, min = 0x80;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3, v = c & 0x0F, min = 0x800;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4, v = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (s.size() < len) return 0;
  for (size_t i = 1; i < len; ++i) {
    if ((p[i] & 0xC0) != 0x80) return 0;
    v = (v << 6) | (p[i] & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return len;
}

std::vector<std::pair<uint32_t, uint32_t>> NormalizeRanges(
    std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negated) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (auto [lo, hi] : ranges) {
    hi = std::min<uint32_t>(hi, 0x10FFFF);
    if (lo > hi) continue;
    if (!merged.empty() && lo <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, hi);
    } else {
      merged.emplace_back(lo, hi);
    }
  }
  if (negated) {
    std::vector<std::pair<uint32_t, uint32_t>> comp;
    uint32_t next = 0;
    for (auto [lo, hi] : merged) {
      if (lo > next) comp.emplace_back(next, lo - 1);
      next = hi + 1;
    }
    if (next <= 0x10FFFF) comp.emplace_back(next, 0x10FFFF);
    merged = std::move(comp);
  }
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (auto [lo, hi] : merged) {
    if (hi < 0xD800 || lo > 0xDFFF) {
      out.emplace_back(lo, hi);
      continue;
    }
    if (lo < 0xD800) out.emplace_back(lo, 0xD7FF);
    if (hi > 0xDFFF) out.emplace_back(0xE000, hi);
  }
  return out;
}

namespace {

ByteSeq Encode2(uint32_t lo, uint32_t hi) {
  std::string a, b;
  utf8::Append(lo, &a);
  utf8::Append(hi, &b);
  ByteSeq seq;
  for (size_t i = 0; i < a.size(); ++i) {
    seq.push_back({static_cast<uint8_t>(a[i]), static_cast<uint8_t>(b[i])});
  }
  return seq;
}

size_t EncodedLength(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

}  // namespace

std::vector<ByteSeq> Utf8Sequences(uint32_t lo, uint32_t hi) {
  // The splitting of Rust's regex-syntax utf8 module, with an explicit work list.
  std::vector<ByteSeq> out;
  std::vector<std::pair<uint32_t, uint32_t>> work = {{lo, hi}};
  while (!work.empty()) {
    auto [a, b] = work.back();
    work.pop_back();
    if (a > b) continue;
    static constexpr uint32_t kMax[] = {0x7F, 0x7FF, 0xFFFF};
    bool split = false;
    for (uint32_t m : kMax) {
      if (a <= m && m < b) {
        work.emplace_back(m + 1, b);
        work.emplace_back(a, m);
        split = true;
        break;
      }
    }
    if (split) continue;
    const size_t n = EncodedLength(a);
    for (size_t i = 1; i < n && !split; ++i) {
      uint32_t m = (1u << (6 * i)) - 1;
      if ((a & ~m) != (b & ~m)) {
        if ((a & m) != 0) {
          work.emplace_back((a | m) + 1, b);
          work.emplace_back(a, a | m);
          split = true;
        } else if ((b & m) != m) {
          work.emplace_back(b & ~m, b);
          work.emplace_back(a, (b & ~m) - 1);
          split = true;
        }
      }
    }
    if (split) continue;
    out.push_back(Encode2(a, b));
  }
  return out;
}

}  // namespace ss::grammar
