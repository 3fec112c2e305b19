// The server's HTTP/1.1 transport on Boost.Beast and Asio: a fixed pool of I/O threads runs every connection
// asynchronously, a small pool of workers runs the handlers that may take long. It owns the framing, the limits and
// the deadlines (HttpLimits), keep-alive and pipelining, streamed responses, clients that leave or stop reading, and a
// bounded shutdown. What a request means is the HttpHandler's business (server.cpp): request in, response out, now
// or later.
#pragma once

#include "server/http_request_parser.h"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace jambo::server {

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;       // the whole body; empty for a streamed one
  bool streamed = false;  // the body follows in pieces (chunked; on HTTP/1.0, until the connection closes)
  bool close = false;     // the connection closes after it
  std::string log_id;     // the access log's id=
};

// What a late response has ready when polled.
struct LateProgress {
  std::optional<HttpResponse> head;  // once: the response, or the head of a streamed one
  std::string body;                  // a streamed response's next bytes
  bool complete = false;             // nothing follows
  int logged_status = 0;             // with complete: the status to log and count, when not the head's
};

// A response that waits on work done elsewhere (the engine). The transport calls poll() on the connection's own
// strand once start() was called, after each wake(), and at least once a second, until it says complete.
class LateResponse {
 public:
  explicit LateResponse(std::string log_id) : log_id(std::move(log_id)) {}
  virtual ~LateResponse() = default;
  // wake may be called from any thread, any number of times, also after the end.
  virtual void start(std::function<void()> wake) = 0;
  virtual LateProgress poll() = 0;
  // The connection ends first: the client left or stopped reading, or the server stops. The work should stop.
  virtual void abandon() = 0;

  const std::string log_id;  // the access log's id=, also when no response is written
};

using HttpReply = std::variant<HttpResponse, std::shared_ptr<LateResponse>>;

// One line of the access log, once a request was answered or given up on.
struct HttpExchange {
  std::string method;  // "" when the request line could not be read
  std::string path;
  int status = 0;  // 499: the client left or stopped reading before the end
  bool streamed = false;
  size_t body_bytes = 0;
  std::optional<double> milliseconds;  // from the request's last byte; none for a request refused while read
  std::string id;
};

class HttpHandler {
 public:
  virtual ~HttpHandler() = default;
  // True when answering may take long (a body to parse, text to tokenize): the request is then answered on a
  // worker thread rather than on the I/O thread that read it.
  virtual bool takes_long(const HttpRequest& request) const = 0;
  virtual HttpReply answer(const HttpRequest& request) = 0;
  // The response to a request the transport refuses (malformed, too large, too slow) or a handler that threw.
  virtual HttpResponse refusal(int status, const std::string& message) = 0;
  // Every request answered, whatever its status, and every one given up on.
  virtual void answered(const HttpExchange& exchange) = 0;
};

class HttpTransport {
 public:
  HttpTransport(HttpHandler& handler, const HttpLimits& limits);
  ~HttpTransport();

  // Listens on host:port, which no other socket may share (throws jambo::Error naming them and why when it cannot);
  // returns the port.
  int bind(const std::string& host, int port);
  void run();  // serves until stop()
  // Stops accepting and ends every connection within a few seconds, whatever its clients do; safe from any thread.
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace jambo::server
