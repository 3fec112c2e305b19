// Reads HTTP/1.x requests from raw bytes, without sockets, under the server's limits: the header's size and
// field count, the body's size once decoded (Content-Length, chunked, gzip or deflate), the framing rules. The
// connections of http_transport read through it, and so does parse_http_requests, the entry point for fuzzing.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace jambo::server {

// What one connection may send and how long it may take (docs/server.md, "Limits").
struct HttpLimits {
  size_t max_body_bytes = 16 << 20;                     // a body once decoded, and as sent
  size_t max_body_bytes_in_flight = size_t(1) << 30;    // the bodies of every connection, decoded, until answered
  size_t max_header_bytes = 64 << 10;                   // the request line and the header fields
  size_t max_header_fields = 100;                       // header fields, trailer fields included
  std::chrono::milliseconds request_timeout{10'000};    // a request's first byte to its last
  std::chrono::milliseconds keep_alive_timeout{5'000};  // a connection's wait for the next request's first byte
  std::chrono::milliseconds write_timeout{10'000};      // a response, or one streamed chunk, to be taken by the client
};

// The bytes that the request bodies of all connections hold at once, against HttpLimits::max_body_bytes_in_flight:
// each connection within its own limit, many connections together could otherwise take memory without bound.
class BodyBudget {
 public:
  explicit BodyBudget(size_t max_bytes) : max_bytes_(max_bytes) {}
  size_t max_bytes() const { return max_bytes_; }
  size_t bytes_held() const { return held_.load(); }
  bool try_take(size_t num_bytes);  // false, taking nothing, where it would go past the budget
  void give_back(size_t num_bytes);

 private:
  const size_t max_bytes_;
  std::atomic<size_t> held_{0};
};

// One body's share of a BodyBudget, given back when the last holder drops it (the request, once answered).
class BodyCharge {
 public:
  explicit BodyCharge(std::shared_ptr<BodyBudget> budget) : budget_(std::move(budget)) {}
  ~BodyCharge() { budget_->give_back(bytes_); }
  BodyCharge(const BodyCharge&) = delete;
  BodyCharge& operator=(const BodyCharge&) = delete;
  bool grow_to(size_t num_bytes);  // the body now holds num_bytes: takes the difference, false where refused
  const BodyBudget& budget() const { return *budget_; }

 private:
  std::shared_ptr<BodyBudget> budget_;
  size_t bytes_ = 0;
};

struct HttpRequest {
  std::string method;
  std::string target;     // as sent, query included
  std::string path;       // the target up to its '?'
  unsigned version = 11;  // 10 or 11
  bool keep_alive = true;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;  // decoded
  std::shared_ptr<BodyCharge> body_charge;  // the body's share of the server's budget, or null
  // The first header field of that name (case-insensitive), if any.
  std::optional<std::string_view> header(std::string_view name) const;
};

// A request the parser refuses: the status to answer with (400, 408, 413, 415, 417, 431, 501) and why. The
// connection closes after it, since the rest of its bytes cannot be framed.
struct HttpRefusal {
  int status = 400;
  std::string message;
};

class RequestParser {
 public:
  enum class Status {
    NeedMore,      // read more bytes into read_space()
    SendContinue,  // the header asks for "100 Continue" before the body is sent; parse() goes on after it
    Complete,      // take() the request
    Refused,       // answer refusal(), then close
  };

  // budget: what the bodies of every connection share (null: this parser's own limit alone).
  explicit RequestParser(const HttpLimits& limits, std::shared_ptr<BodyBudget> budget = nullptr);
  ~RequestParser();
  RequestParser(const RequestParser&) = delete;
  RequestParser& operator=(const RequestParser&) = delete;

  // Where the next bytes read from the client go, then commit() how many were read there.
  std::span<char> read_space();
  void commit(size_t num_bytes);
  Status parse();  // parses what was read

  bool started() const;                // a byte of the current request has arrived
  HttpRequest take();                  // after Complete: the request; the parser moves on to the next one
  const HttpRefusal& refusal() const;  // after Refused
  // As far as parsed: the current request's method and path, for the log line of a refused one ("" before).
  std::pair<std::string, std::string> method_and_path() const;

 private:
  struct State;
  Status refuse(HttpRefusal refusal);
  Status after_header();
  void start_next();

  const HttpLimits limits_;
  const std::shared_ptr<BodyBudget> budget_;
  std::unique_ptr<State> state_;
};

// Everything a connection sending `bytes` would get from the parser: the complete requests in order, the refusal
// after them if any, and whether bytes of an unfinished request are left. Bytes arrive in reads of at most
// `read_size` bytes, as a socket would deliver them. The entry point for fuzz targets.
struct ParsedRequests {
  std::vector<HttpRequest> requests;
  std::optional<HttpRefusal> refusal;
  bool incomplete = false;
};
ParsedRequests parse_http_requests(std::string_view bytes, const HttpLimits& limits, size_t read_size = 4096);

}  // namespace jambo::server
