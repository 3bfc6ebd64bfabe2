// CORS for the gateway, with Starlette's CORSMiddleware semantics (what vLLM runs):
// - a request with an allowed Origin gets Access-Control-Allow-Origin (the origin itself, or "*"
//   when every origin is allowed and credentials are not), Access-Control-Allow-Credentials when
//   allowed, Vary: Origin when the answer depends on the origin, and
//   Access-Control-Expose-Headers naming the gateway's own response headers;
// - a preflight (OPTIONS with Origin and Access-Control-Request-Method) is answered here: 200 with
//   the allowed methods and headers (Max-Age 600) when origin, method and every requested header
//   are allowed, else 400 naming what is not.
// Nothing is added for a request without an Origin, or with one that is not allowed (the browser
// then refuses the answer to the page).
#pragma once

#include <string>
#include <vector>

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace ss {

struct CorsPolicy {
  std::vector<std::string> origins;  // "*" = any
  bool credentials = false;
  std::vector<std::string> methods = {"*"};
  std::vector<std::string> headers = {"*"};
};

// True when the request was a preflight and `res` is its whole answer.
bool HandlePreflight(const CorsPolicy& policy, const httplib::Request& req, httplib::Response& res);
// Adds the headers of an actual (non-preflight) request.
void AddCorsHeaders(const CorsPolicy& policy, const httplib::Request& req, httplib::Response& res);

}  // namespace ss
