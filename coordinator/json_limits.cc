#include "coordinator/json_limits.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ss {

absl::StatusOr<nlohmann::ordered_json> ParseJsonWithLimits(std::string_view text,
                                                           const JsonLimits& limits) {
  using Json = nlohmann::ordered_json;
  enum class Over { kNone, kDepth, kValues } over = Over::kNone;
  size_t values = 0;
  // `depth` is the number of containers open around the event. Returning false discards the
  // value (and, for a container, everything inside it): once a limit is passed the parser still
  // reads to the end, iteratively, but keeps nothing.
  auto callback = [&](int depth, Json::parse_event_t event, Json&) {
    using E = Json::parse_event_t;
    if (over != Over::kNone) return false;
    if (event == E::object_end || event == E::array_end) return true;
    if (++values > limits.max_values) {
      over = Over::kValues;
      return false;
    }
    if ((event == E::object_start || event == E::array_start) && depth >= limits.max_depth) {
      over = Over::kDepth;
      return false;
    }
    return true;
  };
  Json value = Json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/false);
  switch (over) {
    case Over::kDepth:
      return absl::ResourceExhaustedError(
          absl::StrCat("JSON nested deeper than ", limits.max_depth, " levels"));
    case Over::kValues:
      return absl::ResourceExhaustedError(
          absl::StrCat("JSON with more than ", limits.max_values, " values"));
    case Over::kNone:
      break;
  }
  if (value.is_discarded()) return absl::InvalidArgumentError("not valid JSON");
  return value;
}

const char* JsonTypeName(const nlohmann::ordered_json& v) {
  using T = nlohmann::ordered_json::value_t;
  switch (v.type()) {
    case T::null:
      return "null";
    case T::boolean:
      return "a boolean";
    case T::string:
      return "a string";
    case T::array:
      return "an array";
    case T::object:
      return "an object";
    case T::number_integer:
    case T::number_unsigned:
    case T::number_float:
      return "a number";
    default:
      return "an unsupported value";
  }
}

}  // namespace ss
