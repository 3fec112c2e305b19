#include "server/server.h"

#include "chat_template/chat_template.h"
#include "server/connection_probe.h"
#include "server/engine_loop.h"
#include "server/metrics.h"
#include "server/openai_request.h"
#include "server/openai_response.h"

#include <fmt/format.h>
#include <httplib.h>

#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <stop_token>
#include <thread>

namespace jambo::server {

using nlohmann::json;

namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(100);
constexpr auto kHeartbeatInterval = std::chrono::seconds(1);
constexpr size_t kMaxRequestIdLength = 128;

void reply_json(httplib::Response& response, int status, const json& body) {
  response.status = status;
  response.set_content(to_wire(body), "application/json");
}

void reply_error(httplib::Response& response, int status, const std::string& message, const std::string& type,
                 const std::string& param = "") {
  reply_json(response, status, error_body(message, type, param));
}

void reply_error(httplib::Response& response, const ApiError& error) {
  reply_error(response, error.status, error.what(), error.type, error.param);
}

// httplib reads a form-encoded body (what `curl -d` sends without a Content-Type) only up to 8 KiB.
std::string too_large_message(const httplib::Request& request) {
  if (request.get_header_value("Content-Type").starts_with("application/x-www-form-urlencoded"))
    return "the request body is too large for Content-Type application/x-www-form-urlencoded (8 KiB); send "
           "Content-Type: application/json";
  return "the request body is too large";
}

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The caller's X-Request-Id, if it is one we can carry into ids and traces.
std::string caller_request_id(const httplib::Request& request) {
  if (!request.has_header("X-Request-Id")) return "";
  const std::string id = request.get_header_value("X-Request-Id");
  const bool printable = std::all_of(id.begin(), id.end(), [](char c) { return c > ' ' && c < 127; });
  if (id.empty() || id.size() > kMaxRequestIdLength || !printable)
    throw ApiError(400,
                   fmt::format("X-Request-Id must be 1 to {} printable characters without spaces", kMaxRequestIdLength),
                   "X-Request-Id");
  return id;
}

// Why httplib could not bind. It says only that it failed, but the errno of its failed bind() or listen() is
// still there: the close() and freeaddrinfo() that follow leave errno alone.
std::string bind_failure(int error) {
  if (error == EADDRINUSE) return "address already in use (is another server listening there?)";
  if (error == 0) return "not an address of this machine?";
  return std::strerror(error);
}

// What the access log needs of the request that this worker thread answers. httplib runs a request's routing, its
// handler, its content provider and its logger on one worker thread, one request after another.
struct AccessRecord {
  std::optional<std::chrono::steady_clock::time_point> arrival;  // none when httplib refused the request line
  std::string id;                                                // the response's id, when it has one
  bool streamed = false;
};
thread_local AccessRecord current_access;

// "POST /v1/completions 200 812B 35.2ms id=cmpl-abc-0"
std::string access_line(const httplib::Request& request, const httplib::Response& response,
                        const AccessRecord& access) {
  std::string line = fmt::format("{} {} {} ", request.method, request.path, response.status);
  line += access.streamed ? "stream" : fmt::format("{}B", response.body.size());
  if (access.arrival) {
    const std::chrono::duration<double, std::milli> duration = std::chrono::steady_clock::now() - *access.arrival;
    line += fmt::format(" {:.1f}ms", duration.count());
  }
  if (!access.id.empty()) line += fmt::format(" id={}", access.id);
  return line;
}

size_t longest(const std::vector<std::string>& strings) {
  size_t length = 0;
  for (const std::string& string : strings) length = std::max(length, string.size());
  return length;
}

}  // namespace

// One generation request on its way: what the streaming callback needs after the handler returned.
struct Exchange {
  GenerationRequest request;
  std::vector<std::string> engine_ids;  // one per prompt
  std::shared_ptr<RequestStream> stream;
  std::unique_ptr<ResponseBuilder> builder;
  std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
};

struct Server::Impl {
  Impl(engine::Engine& engine, const tokenizer::Tokenizer& tokenizer, const chat_template::ChatTemplate* chat_template,
       int64_t max_n, const ServerOptions& options);

  void add_routes();
  void add_access_log();
  void log_throughput(std::stop_token stop);
  void generate(const httplib::Request& http_request, httplib::Response& response, bool chat);
  void respond_whole(Exchange& exchange, const ConnectionProbe& connection, httplib::Response& response);
  void respond_streaming(std::shared_ptr<Exchange> exchange, httplib::Response& response);
  bool write_events(Exchange& exchange, httplib::DataSink& sink);
  void tokenize(const httplib::Request& http_request, httplib::Response& response);
  void detokenize(const httplib::Request& http_request, httplib::Response& response);
  json models() const;
  std::string next_id(const std::string& prefix, const std::string& caller_id);

  const tokenizer::Tokenizer& tokenizer;
  const chat_template::ChatTemplate* chat_template;
  ServerOptions options;
  ServerLimits limits;
  ServerMetrics metrics;
  EngineLoop loop;
  httplib::Server http;
  socket_t listening_socket = INVALID_SOCKET;  // the last one httplib made (its bind keeps the last)
  std::atomic<int64_t> num_ids{0};
  const int64_t started = unix_time();
};

Server::Impl::Impl(engine::Engine& engine, const tokenizer::Tokenizer& tokenizer,
                   const chat_template::ChatTemplate* chat_template, int64_t max_n, const ServerOptions& options)
    : tokenizer(tokenizer),
      chat_template(chat_template),
      options(options),
      limits{options.model_name, options.max_model_len, max_n, options.max_num_prompts, tokenizer.vocab_size()},
      loop(engine, options.max_num_requests) {
  // One worker per request the engine may hold, plus room for health, metrics and refusals.
  const size_t num_workers = size_t(options.max_num_requests) + 64;
  http.new_task_queue = [num_workers] { return new httplib::ThreadPool(num_workers); };
  http.set_payload_max_length(options.max_body_bytes);
  http.set_keep_alive_max_count(1000);
  // httplib's own options set SO_REUSEPORT, which lets a second server share the port without a word; SO_REUSEADDR
  // alone still lets a restarted server listen past its predecessor's TIME_WAIT connections. The socket is
  // remembered so that bind() can raise its backlog.
  http.set_socket_options([this](socket_t socket) {
    const int yes = 1;
    ::setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listening_socket = socket;
  });
  add_routes();
  if (options.log_requests) add_access_log();
}

// Unique even when callers repeat an X-Request-Id (retries, one id for a whole conversation).
std::string Server::Impl::next_id(const std::string& prefix, const std::string& caller_id) {
  return fmt::format("{}{}-{}", prefix, caller_id.empty() ? std::to_string(started) : caller_id, num_ids++);
}

void Server::Impl::add_routes() {
  http.Post("/v1/completions", [this](const httplib::Request& request, httplib::Response& response) {
    generate(request, response, false);
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& request, httplib::Response& response) {
    generate(request, response, true);
  });
  http.Get("/v1/models",
           [this](const httplib::Request&, httplib::Response& response) { reply_json(response, 200, models()); });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& response) {
    if (loop.is_alive()) return reply_json(response, 200, {{"status", "ok"}});
    reply_error(response, 503, loop.death_reason(), "server_error");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(metrics.render(loop.counters(), loop.is_alive()), "text/plain; version=0.0.4");
  });
  http.Post("/tokenize",
            [this](const httplib::Request& request, httplib::Response& response) { tokenize(request, response); });
  http.Post("/detokenize",
            [this](const httplib::Request& request, httplib::Response& response) { detokenize(request, response); });
  // Every error httplib answers itself (unknown route, body too large) gets an OpenAI error object.
  http.set_error_handler([](const httplib::Request& request, httplib::Response& response) {
    if (!response.body.empty()) return;
    const std::string message = response.status == 404   ? fmt::format("no route {} {}", request.method, request.path)
                                : response.status == 413 ? too_large_message(request)
                                                         : fmt::format("HTTP {}", response.status);
    reply_error(response, response.status, message, "invalid_request_error");
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& response, std::exception_ptr error) {
    reply_error(response, api_error_for(error));
  });
}

void Server::Impl::add_access_log() {
  http.set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
    current_access = {std::chrono::steady_clock::now(), "", false};
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // httplib calls it once the response is written, streamed ones too.
  http.set_logger([](const httplib::Request& request, const httplib::Response& response) {
    fmt::print(stderr, "jambo serve: {}\n", access_line(request, response, std::exchange(current_access, {})));
  });
}

// Every log interval, when the engine ran or its occupancy moved since the last line.
void Server::Impl::log_throughput(std::stop_token stop) {
  const auto interval = std::chrono::duration_cast<ThroughputLog::Clock::duration>(
      std::chrono::duration<double>(options.log_interval_seconds));
  ThroughputLog log(loop.counters(), ThroughputLog::Clock::now());
  std::mutex mutex;
  std::condition_variable_any stopped;
  std::unique_lock lock(mutex);
  while (!stopped.wait_for(lock, stop, interval, [&] { return stop.stop_requested(); }))
    if (const auto line = log.next(loop.counters(), ThroughputLog::Clock::now()))
      fmt::print(stderr, "jambo serve: {}\n", *line);
}

json Server::Impl::models() const {
  return {{"object", "list"},
          {"data", json::array({{{"id", options.model_name},
                                 {"object", "model"},
                                 {"created", started},
                                 {"owned_by", "jambo"},
                                 {"max_model_len", options.max_model_len}}})}};
}

void Server::Impl::generate(const httplib::Request& http_request, httplib::Response& response, bool chat) {
  try {
    const std::string caller_id = caller_request_id(http_request);
    auto exchange = std::make_shared<Exchange>();
    const json body = parse_body(http_request.body);
    if (chat && !chat_template)
      throw ApiError(400,
                     fmt::format("the model '{}' has no chat template (tokenizer_config.json)", options.model_name),
                     "messages");
    exchange->request = chat ? parse_chat_request(body, limits, tokenizer, *chat_template)
                             : parse_completion_request(body, limits, tokenizer);
    const GenerationRequest& request = exchange->request;
    const std::string id = next_id(chat ? "chatcmpl-" : "cmpl-", caller_id);
    response.set_header("X-Request-Id", caller_id.empty() ? id : caller_id);
    current_access.id = id;

    std::vector<engine::RequestSpec> specs;
    for (size_t p = 0; p < request.prompts.size(); ++p) {
      engine::RequestSpec spec = request.options;
      spec.id = request.prompts.size() == 1 ? id : fmt::format("{}-{}", id, p);
      spec.prompt_ids = request.prompts[p];
      exchange->engine_ids.push_back(spec.id);
      specs.push_back(std::move(spec));
    }
    const int64_t num_choices = int64_t(request.prompts.size()) * request.options.n;
    exchange->stream = std::make_shared<RequestStream>(num_choices, longest(request.options.stop.strings), &metrics);
    exchange->builder = std::make_unique<ResponseBuilder>(request, id, options.model_name, unix_time(), tokenizer);

    const EngineLoop::Admission admission = loop.submit(std::move(specs), exchange->stream);
    switch (admission.verdict) {
      case EngineLoop::Verdict::Accepted:
        break;
      case EngineLoop::Verdict::Rejected:
        throw ApiError(400, admission.message);
      case EngineLoop::Verdict::Failed:
        std::rethrow_exception(admission.error);  // a bug in jambo: a 500, below
      case EngineLoop::Verdict::Full:
        response.set_header("Retry-After", "1");
        // An idle keep-alive connection holds one of httplib's workers: a refused client must not keep one.
        response.set_header("Connection", "close");
        throw ApiError(429, admission.message, "", "rate_limit_exceeded");
      case EngineLoop::Verdict::Dead:
        throw ApiError(503, admission.message, "", "server_error");
    }
    if (request.stream) return respond_streaming(std::move(exchange), response);
    respond_whole(*exchange, ConnectionProbe(http_request), response);
  } catch (...) {
    const ApiError error = api_error_for(std::current_exception());
    metrics.count_request(error.status);
    reply_error(response, error);
  }
}

// Waits for the whole response; a client that left has its requests aborted at once (no one reads the answer).
void Server::Impl::respond_whole(Exchange& exchange, const ConnectionProbe& connection, httplib::Response& response) {
  while (!exchange.stream->is_finished()) {
    for (const StreamEvent& event : exchange.stream->take(kPollInterval)) exchange.builder->add(event);
    if (const auto error = exchange.stream->error()) throw ApiError(error->status, error->message, "", "server_error");
    if (connection.client_left()) {
      loop.abort(exchange.engine_ids);
      response.status = 499;  // nginx's "client closed request": for the metrics and the access log, no one reads it
      metrics.count_request(499);
      return;
    }
  }
  metrics.count_request(200);
  metrics.count_tokens(exchange.builder->num_prompt_tokens(), exchange.builder->num_completion_tokens());
  reply_json(response, 200, exchange.builder->response());
}

// Server-sent events; a write that fails means the client left: its requests are aborted at once.
void Server::Impl::respond_streaming(std::shared_ptr<Exchange> exchange, httplib::Response& response) {
  current_access.streamed = true;
  response.set_header("Cache-Control", "no-cache");
  response.set_chunked_content_provider(
      "text/event-stream", [this, exchange](size_t, httplib::DataSink& sink) { return write_events(*exchange, sink); },
      [this, exchange](bool success) {
        if (!success || !exchange->stream->is_finished()) loop.abort(exchange->engine_ids);
      });
}

bool Server::Impl::write_events(Exchange& exchange, httplib::DataSink& sink) {
  auto send = [&](const std::string& text) {
    exchange.last_write = std::chrono::steady_clock::now();
    return sink.write(text.data(), text.size());
  };
  for (const StreamEvent& event : exchange.stream->take(kPollInterval))
    if (!send(fmt::format("data: {}\n\n", to_wire(exchange.builder->add(event))))) return false;
  if (const auto error = exchange.stream->error()) {
    metrics.count_request(error->status);
    send(fmt::format("data: {}\n\n", to_wire(error_body(error->message, "server_error", ""))));
    sink.done();
    return true;
  }
  if (exchange.stream->is_finished()) {
    metrics.count_request(200);
    metrics.count_tokens(exchange.builder->num_prompt_tokens(), exchange.builder->num_completion_tokens());
    if (exchange.request.include_usage && !send(fmt::format("data: {}\n\n", to_wire(exchange.builder->usage_chunk()))))
      return false;
    if (!send("data: [DONE]\n\n")) return false;
    sink.done();
    return true;
  }
  // A comment line now and then: the only way to notice a client that left while nothing was sent.
  if (std::chrono::steady_clock::now() - exchange.last_write > kHeartbeatInterval) return send(": keep-alive\n\n");
  return true;
}

void Server::Impl::tokenize(const httplib::Request& http_request, httplib::Response& response) {
  try {
    const std::vector<int32_t> ids =
        parse_tokenize_request(parse_body(http_request.body), limits, tokenizer, chat_template);
    reply_json(response, 200, {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", options.max_model_len}});
  } catch (...) {
    reply_error(response, api_error_for(std::current_exception()));
  }
}

void Server::Impl::detokenize(const httplib::Request& http_request, httplib::Response& response) {
  try {
    const std::vector<int32_t> ids = parse_detokenize_request(parse_body(http_request.body), limits);
    reply_json(response, 200, {{"prompt", tokenizer.decode(ids)}});
  } catch (...) {
    reply_error(response, api_error_for(std::current_exception()));
  }
}

Server::Server(engine::Engine& engine, const tokenizer::Tokenizer& tokenizer,
               const chat_template::ChatTemplate* chat_template, int64_t max_n, const ServerOptions& options)
    : impl_(std::make_unique<Impl>(engine, tokenizer, chat_template, max_n, options)) {}

Server::~Server() = default;

int Server::bind() {
  httplib::Server& http = impl_->http;
  const ServerOptions& options = impl_->options;
  errno = 0;
  const int port = options.port == 0 ? http.bind_to_any_port(options.host)
                                     : (http.bind_to_port(options.host, options.port) ? options.port : -1);
  JAMBO_REQUIRE(port > 0, "cannot listen on {}:{}: {}", options.host, options.port, bind_failure(errno));
  // httplib (Debian's shared library) listens with a backlog of 5: a burst of clients connecting at once past it
  // would wait for SYN retries, or on some network stacks be reset. Listening again only changes the backlog.
  JAMBO_REQUIRE(::listen(impl_->listening_socket, SOMAXCONN) == 0, "cannot raise the listen backlog on {}:{}: {}",
                options.host, port, std::strerror(errno));
  return port;
}

void Server::run() {
  std::jthread throughput_log;  // stops when run() returns
  if (impl_->options.log_interval_seconds > 0)
    throughput_log = std::jthread([this](std::stop_token stop) { impl_->log_throughput(stop); });
  impl_->http.listen_after_bind();
  impl_->loop.stop();
}

// The loop first: requests still open end at once with an error (the listener waits for their workers).
void Server::stop() {
  impl_->loop.stop();
  impl_->http.stop();
}

}  // namespace jambo::server
