#include "coordinator/cors.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "httplib.h"

namespace ss {
namespace {

constexpr char kSafeMethods[] = "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT";
constexpr char kExposed[] = "X-Request-Id, X-Ignored-Fields, Retry-After";

bool Any(const std::vector<std::string>& list) {
  return std::find(list.begin(), list.end(), "*") != list.end();
}

bool OriginAllowed(const CorsPolicy& p, const std::string& origin) {
  return Any(p.origins) || std::find(p.origins.begin(), p.origins.end(), origin) != p.origins.end();
}

bool MethodAllowed(const CorsPolicy& p, const std::string& method) {
  if (Any(p.methods)) return true;
  return std::any_of(p.methods.begin(), p.methods.end(),
                     [&](const std::string& m) { return absl::EqualsIgnoreCase(m, method); });
}

bool HeaderAllowed(const CorsPolicy& p, absl::string_view header) {
  if (Any(p.headers)) return true;
  // Starlette always allows the CORS-safelisted request headers.
  for (const char* safe : {"accept", "accept-language", "content-language", "content-type"}) {
    if (absl::EqualsIgnoreCase(header, safe)) return true;
  }
  return std::any_of(p.headers.begin(), p.headers.end(),
                     [&](const std::string& h) { return absl::EqualsIgnoreCase(h, header); });
}

void AllowOrigin(const CorsPolicy& p, const std::string& origin, httplib::Response& res) {
  if (Any(p.origins) && !p.credentials) {
    res.set_header("Access-Control-Allow-Origin", "*");
  } else {
    res.set_header("Access-Control-Allow-Origin", origin);
    res.set_header("Vary", "Origin");
  }
  if (p.credentials) res.set_header("Access-Control-Allow-Credentials", "true");
}

}  // namespace

bool HandlePreflight(const CorsPolicy& policy, const httplib::Request& req,
                     httplib::Response& res) {
  if (req.method != "OPTIONS" || !req.has_header("Origin") ||
      !req.has_header("Access-Control-Request-Method")) {
    return false;
  }
  const std::string origin = req.get_header_value("Origin");
  const std::string method = req.get_header_value("Access-Control-Request-Method");
  const std::string requested = req.get_header_value("Access-Control-Request-Headers");
  std::vector<std::string> failures;
  if (!OriginAllowed(policy, origin)) failures.push_back("origin");
  if (!MethodAllowed(policy, method)) failures.push_back("method");
  for (absl::string_view h : absl::StrSplit(requested, ',', absl::SkipWhitespace())) {
    if (!HeaderAllowed(policy, absl::StripAsciiWhitespace(h))) {
      failures.push_back("headers");
      break;
    }
  }
  res.set_header("Access-Control-Max-Age", "600");
  if (!failures.empty()) {
    res.status = 400;
    res.set_content("Disallowed CORS " + absl::StrJoin(failures, ", "), "text/plain");
    return true;
  }
  AllowOrigin(policy, origin, res);
  res.set_header("Access-Control-Allow-Methods",
                 Any(policy.methods) ? kSafeMethods : absl::StrJoin(policy.methods, ", "));
  if (!requested.empty() && Any(policy.headers)) {
    res.set_header("Access-Control-Allow-Headers", requested);
  } else if (!Any(policy.headers)) {
    res.set_header("Access-Control-Allow-Headers",
                   absl::StrJoin(policy.headers, ", ") +
                       ", Accept, Accept-Language, Content-Language, Content-Type");
  }
  res.status = 200;
  res.set_content("OK", "text/plain");
  return true;
}

void AddCorsHeaders(const CorsPolicy& policy, const httplib::Request& req, httplib::Response& res) {
  if (!req.has_header("Origin")) return;
  const std::string origin = req.get_header_value("Origin");
  if (!OriginAllowed(policy, origin)) return;
  AllowOrigin(policy, origin, res);
  res.set_header("Access-Control-Expose-Headers", kExposed);
}

}  // namespace ss
