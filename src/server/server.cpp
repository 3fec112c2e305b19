#include "server/server.h"

#include "chat_template/chat_template.h"
#include "server/engine_loop.h"
#include "server/http_transport.h"
#include "server/metrics.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "model/weight_update.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <unordered_map>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <stop_token>
#include <thread>

namespace jambo::server {

using nlohmann::json;

namespace {

constexpr auto kHeartbeatInterval = std::chrono::seconds(1);
constexpr size_t kMaxRequestIdLength = 128;

HttpResponse text_response(int status, std::string content_type, std::string body) {
  HttpResponse response;
  response.status = status;
  response.content_type = std::move(content_type);
  response.body = std::move(body);
  return response;
}

HttpResponse json_response(int status, const json& body) {
  return text_response(status, "application/json", to_wire(body));
}

HttpResponse error_response(const ApiError& error) {
  return json_response(error.status, error_body(error.what(), error.type, error.param));
}

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The caller's X-Request-Id, if it is one we can carry into ids and traces.
std::string caller_request_id(const HttpRequest& request) {
  const std::optional<std::string_view> header = request.header("X-Request-Id");
  if (!header) return "";
  const std::string id(*header);
  const bool printable = std::all_of(id.begin(), id.end(), [](char c) { return c > ' ' && c < 127; });
  if (id.empty() || id.size() > kMaxRequestIdLength || !printable)
    throw ApiError(400,
                   fmt::format("X-Request-Id must be 1 to {} printable characters without spaces", kMaxRequestIdLength),
                   "X-Request-Id");
  return id;
}

// "POST /v1/completions 200 812B 35.2ms id=cmpl-abc-0"
std::string access_line(const HttpExchange& exchange) {
  std::string line = fmt::format("{} {} {} ", exchange.method.empty() ? "-" : exchange.method,
                                 exchange.path.empty() ? "-" : exchange.path, exchange.status);
  line += exchange.streamed ? "stream" : fmt::format("{}B", exchange.body_bytes);
  if (exchange.milliseconds) line += fmt::format(" {:.1f}ms", *exchange.milliseconds);
  if (!exchange.id.empty()) line += fmt::format(" id={}", exchange.id);
  return line;
}

size_t longest(const std::vector<std::string>& strings) {
  size_t length = 0;
  for (const std::string& string : strings) length = std::max(length, string.size());
  return length;
}

std::string sse_event(const json& data) { return fmt::format("data: {}\n\n", to_wire(data)); }

// The value of `key` in the target's query ("/pause?mode=keep"), if given; values are taken as sent, undecoded.
std::optional<std::string> query_value(const std::string& target, std::string_view key) {
  const size_t question = target.find('?');
  if (question == std::string::npos) return std::nullopt;
  std::string_view query = std::string_view(target).substr(question + 1);
  while (!query.empty()) {
    const std::string_view pair = query.substr(0, query.find('&'));
    query.remove_prefix(std::min(query.size(), pair.size() + 1));
    const size_t equals = pair.find('=');
    if (pair.substr(0, equals) == key) return std::string(equals == std::string_view::npos ? "" : pair.substr(equals + 1));
  }
  return std::nullopt;
}

// A query value's comma-separated items ("weights,kv_cache"; the comma also as %2C).
std::vector<std::string> split_list(std::string_view text) {
  std::vector<std::string> items(1);
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == ',') {
      items.emplace_back();
    } else if (text.substr(i, 3) == "%2C" || text.substr(i, 3) == "%2c") {
      items.emplace_back();
      i += 2;
    } else {
      items.back() += text[i];
    }
  }
  return items;
}

// Standard base64 (RFC 4648, padded), or nothing where `text` is not.
std::optional<std::vector<std::byte>> decode_base64(std::string_view text) {
  static constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  if (text.size() % 4 != 0) return std::nullopt;
  std::vector<std::byte> out;
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t group = 0;
    int num_padding = 0;
    for (size_t j = 0; j < 4; ++j) {
      const char c = text[i + j];
      const size_t value = kAlphabet.find(c);
      if (c == '=' && i + 4 == text.size() && j >= 2) {
        ++num_padding;
      } else if (value == std::string_view::npos || num_padding > 0) {
        return std::nullopt;
      }
      group = group << 6 | uint32_t(value == std::string_view::npos ? 0 : value);
    }
    for (int b = 0; b < 3 - num_padding; ++b) out.push_back(std::byte(group >> (16 - 8 * b)));
  }
  return out;
}

// One entry of /update_weights_from_ipc's "tensors": {"name", "dtype", "shape", "ipc_handle", "offset"}.
constexpr uint64_t kMaxIpcElements = uint64_t(1) << 40;
backend::IpcTensor parse_ipc_tensor(const json& entry, size_t index) {
  const std::string field = fmt::format("tensors[{}]", index);
  if (!entry.is_object()) throw ApiError(400, "must be an object {name, dtype, shape, ipc_handle, offset}", field);
  const auto string_of = [&](const char* key) {
    const auto found = entry.find(key);
    if (found == entry.end() || !found->is_string())
      throw ApiError(400, fmt::format("{} must be a string", key), fmt::format("{}.{}", field, key));
    return found->get<std::string>();
  };
  backend::IpcTensor tensor;
  tensor.name = string_of("name");
  const std::string dtype = string_of("dtype");
  if (dtype == "BF16" || dtype == "bfloat16")
    tensor.dtype = DType::BF16;
  else if (dtype == "F16" || dtype == "float16")
    tensor.dtype = DType::F16;
  else if (dtype == "F32" || dtype == "float32")
    tensor.dtype = DType::F32;
  else
    throw ApiError(400, fmt::format("dtype '{}' is none of BF16, F16 and F32", dtype), field + ".dtype");
  const auto shape = entry.find("shape");
  if (shape == entry.end() || !shape->is_array() ||
      !std::all_of(shape->begin(), shape->end(), [](const json& n) { return n.is_number_unsigned(); }))
    throw ApiError(400, "shape must be an array of non-negative integers", field + ".shape");
  uint64_t numel = 1;  // bounded, so that no count of elements or bytes overflows
  for (const json& n : *shape) {
    tensor.shape.push_back(int64_t(std::min<uint64_t>(n.get<uint64_t>(), kMaxIpcElements)));
    const uint64_t dim = uint64_t(tensor.shape.back());
    numel = dim == 0 ? 0 : numel > kMaxIpcElements / dim ? kMaxIpcElements + 1 : numel * dim;
  }
  if (numel > kMaxIpcElements || tensor.shape.size() > 8)
    throw ApiError(400, fmt::format("shape holds more than {} elements or 8 dimensions", kMaxIpcElements),
                   field + ".shape");
  const std::optional<std::vector<std::byte>> handle = decode_base64(string_of("ipc_handle"));
  if (!handle || handle->size() != tensor.handle.size())
    throw ApiError(400, "ipc_handle must be the base64 of a 64-byte cudaIpcMemHandle_t", field + ".ipc_handle");
  std::copy(handle->begin(), handle->end(), tensor.handle.begin());
  const auto offset = entry.find("offset");
  if (offset != entry.end() && !offset->is_number_unsigned())
    throw ApiError(400, "offset must be a non-negative integer (bytes)", field + ".offset");
  tensor.offset = offset == entry.end() ? 0 : int64_t(std::min<uint64_t>(offset->get<uint64_t>(), INT64_MAX / 2));
  return tensor;
}

EngineLoop::PauseMode parse_pause_mode(const std::optional<std::string>& text) {
  if (!text || *text == "abort") return EngineLoop::PauseMode::Abort;
  if (*text == "wait") return EngineLoop::PauseMode::Wait;
  if (*text == "keep") return EngineLoop::PauseMode::Keep;
  throw ApiError(400, fmt::format("mode must be abort, wait or keep, got '{}'", *text), "mode");
}

}  // namespace

// One generation request, parsed: what its response needs while the engine works.
struct Exchange {
  GenerationRequest request;
  std::string id;                       // the response's id
  std::string request_id;               // the X-Request-Id answered: the caller's, else the id
  std::vector<std::string> engine_ids;  // one per prompt
  std::shared_ptr<RequestStream> stream;
  std::unique_ptr<ResponseBuilder> builder;
};

class GenerationResponse;

// A generation request under way, as /abort_requests finds it: by its response id or its X-Request-Id.
struct LiveRequest {
  std::string id, request_id;
  std::vector<std::string> engine_ids;
};

struct Server::Impl final : HttpHandler {
  Impl(const model::Model& model, engine::Engine& engine, const tokenizer::Tokenizer& tokenizer,
       const chat_template::ChatTemplate* chat_template, int64_t max_n, const ServerOptions& options);

  struct Route {
    std::string_view method;
    std::string_view path;
    bool takes_long;
    std::function<HttpReply(const HttpRequest&)> answer;
  };
  const Route* route(const HttpRequest& request) const;

  bool takes_long(const HttpRequest& request) const override;
  HttpReply answer(const HttpRequest& request) override;
  HttpResponse refusal(int status, const std::string& message) override;
  void answered(const HttpExchange& exchange) override;

  void log_throughput(std::stop_token stop);
  HttpReply generate(const HttpRequest& http_request, bool chat);
  HttpResponse tokenize(const HttpRequest& http_request);
  HttpResponse detokenize(const HttpRequest& http_request);
  HttpResponse health();
  json models() const;
  bool authorized(const HttpRequest& request) const;
  HttpReply pause(const HttpRequest& request);
  HttpResponse resume(const HttpRequest& request);
  HttpResponse is_paused(const HttpRequest& request);
  HttpResponse abort_requests(const HttpRequest& request);
  HttpReply update_weights_from_disk(const HttpRequest& request);
  HttpReply update_weights_from_ipc(const HttpRequest& request);
  std::string requested_weight_version(const json& body) const;
  HttpReply sleep(const HttpRequest& request);
  HttpReply reset_prefix_cache(const HttpRequest& request);
  HttpReply wake_up(const HttpRequest& request);
  HttpResponse is_sleeping(const HttpRequest& request);
  std::string current_weight_version() const;
  void set_weight_version(std::string version);
  void track(const void* key, const Exchange& exchange);
  void forget(const void* key);
  std::string next_id(const std::string& prefix, const std::string& caller_id);

  const model::Model& model;
  const tokenizer::Tokenizer& tokenizer;
  const chat_template::ChatTemplate* chat_template;
  ServerOptions options;
  ServerLimits limits;
  // The engine's weight_version, as GET /weight_version answers it: a copy, set on the loop's thread by the update
  // that changes the engine's.
  mutable std::mutex weight_version_mutex;
  std::string weight_version;
  std::atomic<bool> asleep{false};  // the engine's weights or caches, as the last sleep or wake left them
  ServerMetrics metrics;
  EngineLoop loop;
  std::vector<Route> routes;
  std::atomic<int64_t> num_ids{0};
  std::mutex live_mutex;  // guards live
  std::unordered_map<const void*, LiveRequest> live;  // generation requests from start to their end
  const int64_t started = unix_time();
  HttpTransport transport;  // last: its connections use everything above
};

// A generation request from its submission to its last byte, polled by the transport on its connection's strand:
// a whole response once every choice finished, or server-sent events as they come.
class GenerationResponse final : public LateResponse, public std::enable_shared_from_this<GenerationResponse> {
 public:
  GenerationResponse(Server::Impl& server, std::unique_ptr<Exchange> exchange, std::vector<engine::RequestSpec> specs)
      : LateResponse(exchange->id), server_(server), exchange_(std::move(exchange)), specs_(std::move(specs)) {}
  ~GenerationResponse() override { server_.forget(this); }

  void start(std::function<void()> wake) override {
    wake_ = std::move(wake);
    exchange_->stream->set_listener(wake_);
    server_.track(this, *exchange_);
    server_.loop.submit(
        std::move(specs_), exchange_->stream,
        [self = shared_from_this()](EngineLoop::Admission admission) { self->on_verdict(std::move(admission)); });
  }

  LateProgress poll() override {
    LateProgress progress = poll_progress();
    if (progress.complete) server_.forget(this);
    return progress;
  }

  // Frees the slots and KV blocks at once: no one reads the answer.
  void abandon() override {
    server_.forget(this);
    bool accepted = false;
    {
      std::lock_guard lock(mutex_);
      abandoned_ = true;
      accepted = verdict_ && verdict_->verdict == EngineLoop::Verdict::Accepted;
    }
    if (accepted) server_.loop.abort(exchange_->engine_ids);
  }

 private:
  // On the loop's thread, or at once from submit().
  void on_verdict(EngineLoop::Admission admission) {
    bool abort_now = false;
    {
      std::lock_guard lock(mutex_);
      abort_now = abandoned_ && admission.verdict == EngineLoop::Verdict::Accepted;
      verdict_ = std::move(admission);
    }
    if (abort_now) server_.loop.abort(exchange_->engine_ids);
    wake_();
  }

  LateProgress poll_progress() {
    if (!admitted_) {
      std::lock_guard lock(mutex_);
      if (!verdict_) return {};
      if (verdict_->verdict != EngineLoop::Verdict::Accepted) return refused(*verdict_);
      admitted_ = true;
    }
    return exchange_->request.stream ? poll_stream() : poll_whole();
  }

  HttpResponse with_ids(HttpResponse response) const {
    response.headers.emplace_back("X-Request-Id", exchange_->request_id);
    response.log_id = exchange_->id;
    return response;
  }

  LateProgress refused(const EngineLoop::Admission& admission) const {
    return {with_ids(refusal_response(admission)), "", true};
  }

  static HttpResponse refusal_response(const EngineLoop::Admission& admission) {
    JAMBO_ASSERT(admission.verdict != EngineLoop::Verdict::Accepted);
    if (admission.verdict == EngineLoop::Verdict::Rejected) return error_response(ApiError(400, admission.message));
    if (admission.verdict == EngineLoop::Verdict::Failed) return error_response(api_error_for(admission.error));
    if (admission.verdict == EngineLoop::Verdict::Dead)
      return error_response(ApiError(503, admission.message, "", "server_error"));
    HttpResponse full = error_response(ApiError(429, admission.message, "", "rate_limit_exceeded"));
    full.headers.emplace_back("Retry-After", "1");
    full.close = true;
    return full;
  }

  LateProgress poll_whole() {
    Exchange& exchange = *exchange_;
    for (const StreamEvent& event : exchange.stream->take(std::chrono::milliseconds(0))) exchange.builder->add(event);
    if (const auto error = exchange.stream->error())
      return {with_ids(error_response(ApiError(error->status, error->message, "", "server_error"))), "", true};
    if (!exchange.stream->is_finished()) return {};
    server_.metrics.count_tokens(exchange.builder->num_prompt_tokens(), exchange.builder->num_completion_tokens());
    return {with_ids(json_response(200, exchange.builder->response())), "", true};
  }

  LateProgress poll_stream() {
    Exchange& exchange = *exchange_;
    LateProgress progress;
    const auto now = std::chrono::steady_clock::now();
    if (!head_sent_) {
      head_sent_ = true;
      last_write_ = now;
      HttpResponse head = text_response(200, "text/event-stream", "");
      head.headers.emplace_back("Cache-Control", "no-cache");
      head.streamed = true;
      progress.head = with_ids(std::move(head));
    }
    for (const StreamEvent& event : exchange.stream->take(std::chrono::milliseconds(0)))
      progress.body += sse_event(exchange.builder->add(event));
    if (const auto error = exchange.stream->error()) {
      progress.body += sse_event(error_body(error->message, "server_error", ""));
      progress.complete = true;
      progress.logged_status = error->status;
    } else if (exchange.stream->is_finished()) {
      server_.metrics.count_tokens(exchange.builder->num_prompt_tokens(), exchange.builder->num_completion_tokens());
      if (exchange.request.include_usage) progress.body += sse_event(exchange.builder->usage_chunk());
      progress.body += "data: [DONE]\n\n";
      progress.complete = true;
    } else if (progress.body.empty() && now - last_write_ > kHeartbeatInterval) {
      progress.body = ": keep-alive\n\n";  // keeps proxies and idle-timeouts of clients from cutting a quiet stream
    }
    if (!progress.body.empty()) last_write_ = now;
    return progress;
  }

  Server::Impl& server_;
  std::unique_ptr<Exchange> exchange_;
  std::vector<engine::RequestSpec> specs_;  // until start()
  std::function<void()> wake_;
  bool admitted_ = false;  // transport side
  bool head_sent_ = false;
  std::chrono::steady_clock::time_point last_write_;

  std::mutex mutex_;  // guards verdict_ and abandoned_, which the loop's thread and the transport share
  std::optional<EngineLoop::Admission> verdict_;
  bool abandoned_ = false;
};

// POST /pause: answered once the pause holds (EngineLoop::pause), or once a resume or the server's stop came first.
class PauseResponse final : public LateResponse, public std::enable_shared_from_this<PauseResponse> {
 public:
  PauseResponse(EngineLoop& loop, EngineLoop::PauseMode mode, std::string mode_name)
      : LateResponse(""), loop_(loop), mode_(mode), mode_name_(std::move(mode_name)) {}

  void start(std::function<void()> wake) override {
    loop_.pause(mode_, [self = shared_from_this(), wake = std::move(wake)] {
      self->told_ = true;
      wake();
    });
  }

  LateProgress poll() override {
    if (!told_) return {};
    return {json_response(200, {{"paused", loop_.is_paused()}, {"mode", mode_name_}}), "", true};
  }

  void abandon() override {}  // the pause holds all the same

 private:
  EngineLoop& loop_;
  const EngineLoop::PauseMode mode_;
  const std::string mode_name_;
  std::atomic<bool> told_{false};
};

// A control request answered once the loop has run an engine change between its steps (EngineLoop::change_engine):
// with the answer made once it is in (on the loop's thread), or the error it threw. A change that needs the engine
// idle (a sleep) waits for the running requests to finish, new ones held meanwhile (change_engine_when_idle).
class ChangeResponse final : public LateResponse, public std::enable_shared_from_this<ChangeResponse> {
 public:
  using Answer = std::function<json(double change_seconds)>;
  ChangeResponse(EngineLoop& loop, bool needs_idle, EngineLoop::EngineChange change, Answer answer)
      : LateResponse(""),
        loop_(loop),
        needs_idle_(needs_idle),
        change_(std::move(change)),
        answer_(std::move(answer)) {}

  // The seconds given to the answer are the change's own, not its wait for the engine to be idle.
  void start(std::function<void()> wake) override {
    EngineLoop::EngineChange timed = [self = shared_from_this()](engine::Engine& engine) {
      self->started_ = std::chrono::steady_clock::now();
      self->change_(engine);
    };
    EngineLoop::ChangeDone done = [self = shared_from_this(), wake = std::move(wake)](std::exception_ptr thrown) {
      if (!thrown) {
        try {
          const auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - self->started_);
          self->body_ = self->answer_(seconds.count());
        } catch (...) {
          thrown = std::current_exception();
        }
      }
      self->thrown_ = thrown;
      self->told_ = true;
      wake();
    };
    if (needs_idle_)
      loop_.change_engine_when_idle(std::move(timed), std::move(done));
    else
      loop_.change_engine(std::move(timed), std::move(done));
  }

  LateProgress poll() override {
    if (!told_) return {};
    if (thrown_) return {error_response(api_error_for(thrown_)), "", true};
    return {json_response(200, body_), "", true};
  }

  void abandon() override {}  // the change goes in all the same

 private:
  EngineLoop& loop_;
  const bool needs_idle_;
  const EngineLoop::EngineChange change_;
  const Answer answer_;
  std::chrono::steady_clock::time_point started_;  // on the loop's thread, as the change begins
  json body_;
  std::exception_ptr thrown_;
  std::atomic<bool> told_{false};  // after body_ and thrown_
};

Server::Impl::Impl(const model::Model& model, engine::Engine& engine, const tokenizer::Tokenizer& tokenizer,
                   const chat_template::ChatTemplate* chat_template, int64_t max_n, const ServerOptions& options)
    : model(model),
      tokenizer(tokenizer),
      chat_template(chat_template),
      options(options),
      limits{options.model_name, options.max_model_len, max_n, options.max_num_prompts, tokenizer.vocab_size()},
      weight_version(engine.weight_version()),
      loop(engine, options.max_num_requests),
      transport(*this, options.http) {
  // Those that read a body run on the transport's workers, the others where they were read.
  routes = {
      {"POST", "/v1/completions", true, [this](const HttpRequest& request) { return generate(request, false); }},
      {"POST", "/v1/chat/completions", true, [this](const HttpRequest& request) { return generate(request, true); }},
      {"POST", "/tokenize", true, [this](const HttpRequest& request) { return HttpReply(tokenize(request)); }},
      {"POST", "/detokenize", true, [this](const HttpRequest& request) { return HttpReply(detokenize(request)); }},
      {"GET", "/v1/models", false, [this](const HttpRequest&) { return HttpReply(json_response(200, models())); }},
      {"GET", "/health", false, [this](const HttpRequest&) { return HttpReply(health()); }},
      {"GET", "/weight_version", false,
       [this](const HttpRequest&) {
         return HttpReply(json_response(200, {{"weight_version", current_weight_version()}}));
       }},
      {"GET", "/metrics", false,
       [this](const HttpRequest&) {
         return HttpReply(
             text_response(200, "text/plain; version=0.0.4", metrics.render(loop.counters(), loop.is_alive())));
       }},
  };
  if (!options.enable_control_endpoints) return;
  routes.push_back({"POST", "/pause", false, [this](const HttpRequest& request) { return pause(request); }});
  routes.push_back({"POST", "/resume", false, [this](const HttpRequest& request) { return HttpReply(resume(request)); }});
  routes.push_back(
      {"GET", "/is_paused", false, [this](const HttpRequest& request) { return HttpReply(is_paused(request)); }});
  routes.push_back({"POST", "/abort_requests", true,
                    [this](const HttpRequest& request) { return HttpReply(abort_requests(request)); }});
  routes.push_back({"POST", "/update_weights_from_disk", true,
                    [this](const HttpRequest& request) { return update_weights_from_disk(request); }});
  routes.push_back({"POST", "/update_weights_from_ipc", true,
                    [this](const HttpRequest& request) { return update_weights_from_ipc(request); }});
  routes.push_back({"POST", "/reset_prefix_cache", false,
                    [this](const HttpRequest& request) { return reset_prefix_cache(request); }});
  routes.push_back({"POST", "/sleep", false, [this](const HttpRequest& request) { return sleep(request); }});
  routes.push_back({"POST", "/wake_up", false, [this](const HttpRequest& request) { return wake_up(request); }});
  routes.push_back(
      {"GET", "/is_sleeping", false, [this](const HttpRequest& request) { return HttpReply(is_sleeping(request)); }});
}

const Server::Impl::Route* Server::Impl::route(const HttpRequest& request) const {
  for (const Route& candidate : routes)
    if (candidate.method == request.method && candidate.path == request.path) return &candidate;
  return nullptr;
}

bool Server::Impl::takes_long(const HttpRequest& request) const {
  const Route* found = route(request);
  return found && found->takes_long;
}

HttpReply Server::Impl::answer(const HttpRequest& request) {
  if (!authorized(request))
    return error_response(ApiError(401, "this server needs 'Authorization: Bearer' and its --api-key", "",
                                   "authentication_error"));
  const Route* found = route(request);
  if (!found) return refusal(404, fmt::format("no route {} {}", request.method, request.path));
  try {
    return found->answer(request);
  } catch (...) {
    return error_response(api_error_for(std::current_exception()));
  }
}

HttpResponse Server::Impl::refusal(int status, const std::string& message) {
  return error_response(ApiError(status, message, "", status >= 500 ? "server_error" : "invalid_request_error"));
}

void Server::Impl::answered(const HttpExchange& exchange) {
  metrics.count_request(exchange.status);
  if (options.log_requests) fmt::print(stderr, "jambo serve: {}\n", access_line(exchange));
}

// Unique even when callers repeat an X-Request-Id (retries, one id for a whole conversation).
std::string Server::Impl::next_id(const std::string& prefix, const std::string& caller_id) {
  return fmt::format("{}{}-{}", prefix, caller_id.empty() ? std::to_string(started) : caller_id, num_ids++);
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

HttpResponse Server::Impl::health() {
  if (loop.is_alive()) return json_response(200, {{"status", "ok"}});
  return error_response(ApiError(503, loop.death_reason(), "", "server_error"));
}

// /health and /metrics stay open (probes and scrapers); with an API key, every other route needs it. The key is
// compared in full whatever the bytes sent, so that the time taken does not tell how much of a guess was right.
bool Server::Impl::authorized(const HttpRequest& request) const {
  if (options.api_key.empty() || request.path == "/health" || request.path == "/metrics") return true;
  const std::string expected = "Bearer " + options.api_key;
  const std::string_view sent = request.header("Authorization").value_or("");
  unsigned difference = sent.size() == expected.size() ? 0u : 1u;
  for (size_t i = 0; i < expected.size(); ++i)
    difference |= unsigned(uint8_t(expected[i]) ^ uint8_t(i < sent.size() ? sent[i] : '\0'));
  return difference == 0;
}

HttpReply Server::Impl::pause(const HttpRequest& request) {
  const std::optional<std::string> mode = query_value(request.target, "mode");
  const EngineLoop::PauseMode parsed = parse_pause_mode(mode);
  return std::make_shared<PauseResponse>(loop, parsed, mode.value_or("abort"));
}

HttpResponse Server::Impl::resume(const HttpRequest&) {
  loop.resume();
  return json_response(200, {{"paused", false}});
}

std::string Server::Impl::current_weight_version() const {
  std::lock_guard lock(weight_version_mutex);
  return weight_version;
}

void Server::Impl::set_weight_version(std::string version) {
  std::lock_guard lock(weight_version_mutex);
  weight_version = std::move(version);
}

namespace {

// The folder, resolved, where it lies under one of the allowed folders (resolved likewise); else 403.
std::filesystem::path allowed_weight_folder(const std::string& requested, const std::vector<std::string>& allowed) {
  if (allowed.empty())
    throw ApiError(403, "this server reads no weights from disk: start it with --allowed-weight-paths", "model_path",
                   "permission_error");
  const std::filesystem::path folder = std::filesystem::weakly_canonical(requested);
  for (const std::string& root : allowed) {
    const std::filesystem::path resolved_root = std::filesystem::weakly_canonical(root);
    const auto [root_end, folder_end] = std::mismatch(resolved_root.begin(), resolved_root.end(), folder.begin(),
                                                      folder.end());
    if (root_end == resolved_root.end() || (std::next(root_end) == resolved_root.end() && root_end->empty()))
      return folder;
  }
  throw ApiError(403, fmt::format("'{}' is not under a folder of --allowed-weight-paths", requested), "model_path",
                 "permission_error");
}

}  // namespace

// An update's "weight_version": the new weights' name, else the current one.
std::string Server::Impl::requested_weight_version(const json& body) const {
  const auto named = body.find("weight_version");
  if (named == body.end()) return current_weight_version();
  if (!named->is_string() || named->get_ref<const std::string&>().empty())
    throw ApiError(400, "weight_version must be a non-empty string", "weight_version");
  return named->get<std::string>();
}

// {"model_path": FOLDER, "weight_version": NAME}: the folder's tensors (all of the model's or some) replace the
// model's between two steps, all or none (model/weight_update.h), and the weights are named NAME (else keep theirs).
HttpReply Server::Impl::update_weights_from_disk(const HttpRequest& request) {
  const json body = parse_body(request.body);
  const auto path = body.find("model_path");
  if (path == body.end() || !path->is_string())
    throw ApiError(400, "model_path must be a string: the checkpoint folder to read", "model_path");
  const std::string version = requested_weight_version(body);
  const std::filesystem::path folder = allowed_weight_folder(path->get<std::string>(), options.allowed_weight_paths);
  const auto started = std::chrono::steady_clock::now();
  auto update = std::make_shared<const model::WeightUpdate>(model::read_weight_update(folder, model));
  const double read_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return std::make_shared<ChangeResponse>(
      loop, /*needs_idle=*/false,
      [update, version](engine::Engine& engine) { engine.update_weights(*update, version); },
      [this, update, version, read_seconds](double update_seconds) {
        set_weight_version(version);
        return json{{"success", true},
                    {"message", fmt::format("{} weights from {} tensors ({} bytes) are in, as '{}'",
                                            update->pieces.size(), update->tensors.size(), update->num_bytes, version)},
                    {"weight_version", version},
                    {"num_tensors", update->tensors.size()},
                    {"num_weights", update->pieces.size()},
                    {"num_bytes", update->num_bytes},
                    {"read_seconds", read_seconds},
                    {"update_seconds", update_seconds}};
      });
}

// {"tensors": [{"name", "dtype", "shape", "ipc_handle", "offset"}], "weight_version": NAME}: tensors in a trainer's
// GPU memory (tools/jambo_ipc.py sends a state_dict so) replace the model's between two steps, device to device, all
// or none, as /update_weights_from_disk's do.
HttpReply Server::Impl::update_weights_from_ipc(const HttpRequest& request) {
  const json body = parse_body(request.body);
  const auto listed = body.find("tensors");
  if (listed == body.end() || !listed->is_array() || listed->empty())
    throw ApiError(400, "tensors must be a non-empty array of {name, dtype, shape, ipc_handle, offset}", "tensors");
  auto tensors = std::make_shared<std::vector<backend::IpcTensor>>();
  for (size_t i = 0; i < listed->size(); ++i) tensors->push_back(parse_ipc_tensor((*listed)[i], i));
  const std::string version = requested_weight_version(body);
  return std::make_shared<ChangeResponse>(
      loop, /*needs_idle=*/false,
      [tensors, version](engine::Engine& engine) { engine.update_weights_from_ipc(*tensors, version); },
      [this, tensors, version](double update_seconds) {
        set_weight_version(version);
        return json{{"success", true},
                    {"message", fmt::format("{} tensors are in, as '{}'", tensors->size(), version)},
                    {"weight_version", version},
                    {"num_tensors", tensors->size()},
                    {"update_seconds", update_seconds}};
      });
}

// ?level=1 (the default) or 2: once the running requests have finished (a pause in wait mode, unless paused
// already), the engine lets go of its caches and its weights (backend.h). Requests that come meanwhile wait.
HttpReply Server::Impl::sleep(const HttpRequest& request) {
  const std::optional<std::string> level = query_value(request.target, "level");
  if (level && *level != "1" && *level != "2")
    throw ApiError(400, fmt::format("level must be 1 or 2, got '{}'", *level), "level");
  const backend::SleepLevel parsed = level == "2" ? backend::SleepLevel::DropWeights : backend::SleepLevel::KeepWeights;
  return std::make_shared<ChangeResponse>(
      loop, /*needs_idle=*/true, [parsed](engine::Engine& engine) { engine.sleep(parsed); },
      [this, parsed](double seconds) {
        asleep = true;
        return json{{"sleeping", true}, {"level", int(parsed)}, {"sleep_seconds", seconds}};
      });
}

// Between two steps, every cached prefix goes (vLLM's and TRL's name); the requests running keep what they hold.
HttpReply Server::Impl::reset_prefix_cache(const HttpRequest&) {
  return std::make_shared<ChangeResponse>(
      loop, /*needs_idle=*/false, [](engine::Engine& engine) { engine.reset_prefix_cache(); },
      [](double) { return json{{"success", true}}; });
}

// ?tags=weights,kv_cache (both, the default, or either): the engine takes back what it let go of; it runs again once
// both are back.
HttpReply Server::Impl::wake_up(const HttpRequest& request) {
  backend::WakeTags tags{.weights = true, .caches = true};
  if (const std::optional<std::string> named = query_value(request.target, "tags")) {
    tags = {};
    for (const std::string& tag : split_list(*named)) {
      if (tag == "weights")
        tags.weights = true;
      else if (tag == "kv_cache")
        tags.caches = true;
      else
        throw ApiError(400, fmt::format("unknown tag '{}' (tags are weights and kv_cache)", tag), "tags");
    }
  }
  struct Woken {
    engine::Engine::Sleep still_asleep;
    std::string weight_version;  // the checkpoint's again after a level 2 sleep
  };
  auto woken = std::make_shared<Woken>();
  return std::make_shared<ChangeResponse>(
      loop, /*needs_idle=*/false,
      [tags, woken](engine::Engine& engine) {
        engine.wake_up(tags);
        *woken = {engine.sleeping(), engine.weight_version()};
      },
      [this, woken](double seconds) {
        asleep = woken->still_asleep.weights || woken->still_asleep.caches;
        set_weight_version(woken->weight_version);
        return json{{"sleeping", bool(asleep)},
                    {"weights_asleep", woken->still_asleep.weights},
                    {"kv_cache_asleep", woken->still_asleep.caches},
                    {"weight_version", woken->weight_version},
                    {"wake_seconds", seconds}};
      });
}

HttpResponse Server::Impl::is_sleeping(const HttpRequest&) {
  return json_response(200, {{"is_sleeping", bool(asleep)}});
}

HttpResponse Server::Impl::is_paused(const HttpRequest&) {
  return json_response(200, {{"is_paused", loop.is_paused()}});
}

// {"request_ids": [...]}: each a response id ("cmpl-...") or an X-Request-Id; every generation request under way
// that has it ends with finish_reason "abort" and its output so far.
HttpResponse Server::Impl::abort_requests(const HttpRequest& request) {
  const json body = parse_body(request.body);
  const auto ids = body.find("request_ids");
  if (ids == body.end() || !ids->is_array() ||
      !std::all_of(ids->begin(), ids->end(), [](const json& id) { return id.is_string(); }))
    throw ApiError(400, "request_ids must be an array of strings", "request_ids");
  json aborted = json::array(), not_found = json::array();
  std::vector<std::string> engine_ids;
  {
    std::lock_guard lock(live_mutex);
    for (const json& id : *ids) {
      const std::string& wanted = id.get_ref<const std::string&>();
      bool found = false;
      for (const auto& [key, live_request] : live)
        if (live_request.id == wanted || live_request.request_id == wanted) {
          engine_ids.insert(engine_ids.end(), live_request.engine_ids.begin(), live_request.engine_ids.end());
          found = true;
        }
      (found ? aborted : not_found).push_back(wanted);
    }
  }
  loop.abort(engine_ids);
  return json_response(200, {{"aborted", aborted}, {"not_found", not_found}});
}

void Server::Impl::track(const void* key, const Exchange& exchange) {
  std::lock_guard lock(live_mutex);
  live[key] = LiveRequest{exchange.id, exchange.request_id, exchange.engine_ids};
}

void Server::Impl::forget(const void* key) {
  std::lock_guard lock(live_mutex);
  live.erase(key);
}

HttpReply Server::Impl::generate(const HttpRequest& http_request, bool chat) {
  const std::string caller_id = caller_request_id(http_request);
  const json body = parse_body(http_request.body);
  if (chat && !chat_template)
    throw ApiError(400, fmt::format("the model '{}' has no chat template (tokenizer_config.json)", options.model_name),
                   "messages");
  auto exchange = std::make_unique<Exchange>();
  exchange->request = chat ? parse_chat_request(body, limits, tokenizer, *chat_template)
                           : parse_completion_request(body, limits, tokenizer);
  const GenerationRequest& request = exchange->request;
  exchange->id = next_id(chat ? "chatcmpl-" : "cmpl-", caller_id);
  exchange->request_id = caller_id.empty() ? exchange->id : caller_id;

  std::vector<engine::RequestSpec> specs;
  for (size_t p = 0; p < request.prompts.size(); ++p) {
    engine::RequestSpec spec = request.options;
    spec.id = request.prompts.size() == 1 ? exchange->id : fmt::format("{}-{}", exchange->id, p);
    spec.prompt_ids = request.prompts[p];
    exchange->engine_ids.push_back(spec.id);
    specs.push_back(std::move(spec));
  }
  const int64_t num_choices = int64_t(request.prompts.size()) * request.options.n;
  exchange->stream = std::make_shared<RequestStream>(num_choices, longest(request.options.stop.strings), &metrics);
  exchange->builder =
      std::make_unique<ResponseBuilder>(request, exchange->id, options.model_name, unix_time(), tokenizer);
  return std::make_shared<GenerationResponse>(*this, std::move(exchange), std::move(specs));
}

HttpResponse Server::Impl::tokenize(const HttpRequest& http_request) {
  const std::vector<int32_t> ids =
      parse_tokenize_request(parse_body(http_request.body), limits, tokenizer, chat_template);
  return json_response(200, {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", options.max_model_len}});
}

HttpResponse Server::Impl::detokenize(const HttpRequest& http_request) {
  const std::vector<int32_t> ids = parse_detokenize_request(parse_body(http_request.body), limits);
  return json_response(200, {{"prompt", tokenizer.decode(ids)}});
}

Server::Server(const model::Model& model, engine::Engine& engine, const tokenizer::Tokenizer& tokenizer,
               const chat_template::ChatTemplate* chat_template, int64_t max_n, const ServerOptions& options)
    : impl_(std::make_unique<Impl>(model, engine, tokenizer, chat_template, max_n, options)) {}

Server::~Server() = default;

int Server::bind() { return impl_->transport.bind(impl_->options.host, impl_->options.port); }

void Server::run() {
  std::jthread throughput_log;  // stops when run() returns
  if (impl_->options.log_interval_seconds > 0)
    throughput_log = std::jthread([this](std::stop_token stop) { impl_->log_throughput(stop); });
  impl_->transport.run();
  impl_->loop.stop();
}

// The loop first: requests still open end at once with an error, which their connections write before closing.
void Server::stop() {
  impl_->loop.stop();
  impl_->transport.stop();
}

}  // namespace jambo::server
