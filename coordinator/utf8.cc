#include "coordinator/utf8.h"

namespace ss::utf8 {

Step Next(const unsigned char* p, size_t n) {
  const unsigned c = p[0];
  if (c < 0x80) return {Kind::kChar, 1};
  size_t need;
  unsigned lo = 0x80, hi = 0xBF;  // range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    need = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 3;
    if (c == 0xE0) lo = 0xA0;  // overlong
    if (c == 0xED) hi = 0x9F;  // surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 4;
    if (c == 0xF0) lo = 0x90;  // overlong
    if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return {Kind::kInvalid, 1};
  }
  for (size_t k = 1; k < need; ++k) {
    if (k >= n) return {Kind::kTruncated, k};
    const unsigned b = p[k];
    if (b < (k == 1 ? lo : 0x80u) || b > (k == 1 ? hi : 0xBFu)) return {Kind::kInvalid, k};
  }
  return {Kind::kChar, need};
}

size_t FirstInvalid(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const Step st = Next(p + i, s.size() - i);
    if (st.kind != Kind::kChar) return i;
    i += st.len;
  }
  return std::string_view::npos;
}

std::string Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  for (size_t i = 0; i < bytes.size();) {
    const Step st = Next(p + i, bytes.size() - i);
    out.append(st.kind == Kind::kChar ? bytes.substr(i, st.len) : "\xEF\xBF\xBD");
    i += st.len;
  }
  return out;
}

size_t CompletePrefix(std::string_view bytes) {
  // A truncated character starts in the last 3 bytes at a byte that is not a continuation byte.
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t i = n - back;
    if ((p[i] & 0xC0) == 0x80) continue;
    return Next(p + i, back).kind == Kind::kTruncated ? i : n;
  }
  return n;
}

void Append(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace ss::utf8
