#include "coordinator/py_json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace ss::chat {
namespace {

// Python's float_repr_style "short" with repr's rules (Python/pystrtod.c, mode 'r').
void AppendPyFloat(double d, std::string* out) {
  if (std::isnan(d)) {
    *out += "NaN";
    return;
  }
  if (std::isinf(d)) {
    *out += d < 0 ? "-Infinity" : "Infinity";
    return;
  }
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(r.ptr - buf));  // "-d.ddde+XX"
  bool negative = false;
  if (!sci.empty() && sci.front() == '-') {
    negative = true;
    sci.remove_prefix(1);
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e)) {
    if (c != '.') digits += c;
  }
  const int exp10 = std::atoi(std::string(sci.substr(e + 1)).c_str());
  const int decpt = exp10 + 1;  // value = 0.DIGITS * 10^decpt
  const int ndigits = static_cast<int>(digits.size());
  if (negative) *out += '-';
  if (decpt <= -4 || decpt > 16) {
    *out += digits[0];
    if (ndigits > 1) {
      *out += '.';
      out->append(digits, 1, std::string::npos);
    }
    char ebuf[16];
    std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    *out += ebuf;
  } else if (decpt <= 0) {
    *out += "0.";
    out->append(static_cast<size_t>(-decpt), '0');
    *out += digits;
  } else if (decpt >= ndigits) {
    *out += digits;
    out->append(static_cast<size_t>(decpt - ndigits), '0');
    *out += ".0";
  } else {
    out->append(digits, 0, static_cast<size_t>(decpt));
    *out += '.';
    out->append(digits, static_cast<size_t>(decpt), std::string::npos);
  }
}

}  // namespace

void AppendPyJsonString(std::string_view text, std::string* out) {
  out->reserve(out->size() + text.size() + 2);
  *out += '"';
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char esc[8];
          std::snprintf(esc, sizeof(esc), "\\u%04x", c);
          *out += esc;
        } else {
          *out += ch;
        }
    }
  }
  *out += '"';
}

void AppendPyJson(const nlohmann::ordered_json& value, std::string* out) {
  using V = nlohmann::ordered_json::value_t;
  switch (value.type()) {
    case V::null:
      *out += "null";
      return;
    case V::boolean:
      *out += value.get<bool>() ? "true" : "false";
      return;
    case V::number_integer:
      *out += std::to_string(value.get<int64_t>());
      return;
    case V::number_unsigned:
      *out += std::to_string(value.get<uint64_t>());
      return;
    case V::number_float:
      AppendPyFloat(value.get<double>(), out);
      return;
    case V::string:
      AppendPyJsonString(value.get_ref<const std::string&>(), out);
      return;
    case V::array: {
      *out += '[';
      bool first = true;
      for (const auto& item : value) {
        if (!first) *out += ", ";
        first = false;
        AppendPyJson(item, out);
      }
      *out += ']';
      return;
    }
    case V::object: {
      *out += '{';
      bool first = true;
      for (auto it = value.begin(); it != value.end(); ++it) {
        if (!first) *out += ", ";
        first = false;
        AppendPyJsonString(it.key(), out);
        *out += ": ";
        AppendPyJson(it.value(), out);
      }
      *out += '}';
      return;
    }
    case V::binary:
    case V::discarded:
      *out += "null";
      return;  // never produced by parsing JSON text
  }
}

std::string PyJsonDumps(const nlohmann::ordered_json& value) {
  std::string out;
  AppendPyJson(value, &out);
  return out;
}

}  // namespace ss::chat
