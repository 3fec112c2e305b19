// The bytes a client sends on one connection, through the server's HTTP request parser (framing, limits, chunked
// and gzip or deflate bodies), as parse_http_requests reads them without a socket. The first byte sets the size of
// the reads the bytes arrive in; what is parsed must not depend on it. The bytes are also parsed under tight limits,
// so that every limit is reached.
#include "core/error.h"
#include "fuzz_support.h"
#include "server/http_request_parser.h"

namespace {

using jambo::server::HttpRequest;
using jambo::server::ParsedRequests;

bool same_request(const HttpRequest& a, const HttpRequest& b) {
  return a.method == b.method && a.target == b.target && a.path == b.path && a.version == b.version &&
         a.keep_alive == b.keep_alive && a.headers == b.headers && a.body == b.body;
}

// The same requests, then the same end; except that a malformed field of an unfinished header may be refused at
// once when the bytes after it came in the same read, and only once more bytes come when they did not.
bool same_parse(const ParsedRequests& a, const ParsedRequests& b) {
  if (a.requests.size() != b.requests.size()) return false;
  for (size_t i = 0; i < a.requests.size(); ++i)
    if (!same_request(a.requests[i], b.requests[i])) return false;
  if ((a.refusal && b.incomplete) || (a.incomplete && b.refusal)) return true;
  return a.incomplete == b.incomplete && a.refusal.has_value() == b.refusal.has_value() &&
         (!a.refusal || a.refusal->status == b.refusal->status);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace jambo;
  if (size == 0) return 0;
  const std::string_view bytes = fuzz::as_text(data + 1, size - 1);
  const server::HttpLimits limits;
  const ParsedRequests in_small_reads = server::parse_http_requests(bytes, limits, 1 + data[0] % 64);
  JAMBO_ASSERT(same_parse(in_small_reads, server::parse_http_requests(bytes, limits)));
  server::HttpLimits tight;
  tight.max_body_bytes = 64;
  tight.max_header_bytes = 256;
  tight.max_header_fields = 4;
  (void)server::parse_http_requests(bytes, tight, 1 + data[0] % 64);
  return 0;
}
