#include "server/http_transport.h"

#include "core/error.h"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/fields.hpp>
#include <boost/beast/http/message.hpp>
#include <fmt/format.h>

#include <sys/resource.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <mutex>
#include <thread>
#include <tuple>
#include <unordered_map>

namespace jambo::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kNumIoThreads = 2;
constexpr int kNumWorkers = 4;
constexpr auto kPulse = std::chrono::seconds(1);          // a late response is polled at least this often
constexpr auto kLingerTime = std::chrono::seconds(2);     // reading what a client sends after its last response
constexpr auto kShutdownGrace = std::chrono::seconds(2);  // responses under way may end before connections close
constexpr auto kShutdownLimit = std::chrono::seconds(3);  // then the I/O threads stop, whatever is left
constexpr auto kShutdownCheck = std::chrono::milliseconds(50);
constexpr auto kAcceptRetry = std::chrono::milliseconds(50);  // after an accept failed (out of descriptors)
constexpr size_t kLingerReadSize = 4 << 10;
constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";

enum class Framing { Length, Chunked, UntilClose };

// The status line and header fields of a response, ready for the wire.
std::string head_text(const HttpResponse& response, unsigned version, bool keep_alive, Framing framing,
                      std::chrono::milliseconds keep_alive_timeout) {
  http::response_header<> head;
  head.version(version);
  head.result(unsigned(response.status));
  head.set(http::field::content_type, response.content_type);
  for (const auto& [name, value] : response.headers) head.set(name, value);
  if (framing == Framing::Length) head.set(http::field::content_length, std::to_string(response.body.size()));
  if (framing == Framing::Chunked) head.set(http::field::transfer_encoding, "chunked");
  // Clients that reuse connections (fetch, the openai client) then close one before the server would.
  if (keep_alive)
    head.set("Keep-Alive",
             fmt::format("timeout={}", std::chrono::duration_cast<std::chrono::seconds>(keep_alive_timeout).count()));
  if (version >= 11 && !keep_alive) head.set(http::field::connection, "close");
  if (version < 11 && keep_alive) head.set(http::field::connection, "keep-alive");
  http::fields::writer writer(head, head.version(), head.result_int());
  return beast::buffers_to_string(writer.get());
}

std::string chunk_text(std::string_view bytes) { return fmt::format("{:x}\r\n{}\r\n", bytes.size(), bytes); }

// A server under a flood of connections must not fail for lack of descriptors while the system allows more.
void raise_descriptor_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
}

std::string bind_failure(const beast::error_code& error) {
  if (error == net::error::address_in_use) return "address already in use (is another server listening there?)";
  return error.message();
}

}  // namespace

class Session;

struct HttpTransport::Impl {
  Impl(HttpHandler& handler, const HttpLimits& limits)
      : handler(handler), limits(limits), body_budget(std::make_shared<BodyBudget>(limits.max_body_bytes_in_flight)) {}

  void accept();
  void begin_shutdown();
  void check_shutdown(Clock::time_point began);
  std::vector<std::shared_ptr<Session>> live_sessions();
  void forget(uint64_t id);

  HttpHandler& handler;
  const HttpLimits limits;
  const std::shared_ptr<BodyBudget> body_budget;  // what every connection's request bodies share
  std::atomic<bool> stopping{false};

  std::mutex mutex;  // guards sessions and next_id
  std::unordered_map<uint64_t, std::weak_ptr<Session>> sessions;
  uint64_t next_id = 0;

  // After the session registry: destroying the io_context destroys the sessions its handlers hold.
  net::io_context io{kNumIoThreads};
  net::strand<net::io_context::executor_type> control = net::make_strand(io);  // accepting and stopping
  tcp::acceptor acceptor{control};
  net::steady_timer accept_retry{control};
  net::steady_timer shutdown_timer{control};
  bool forced_close = false;
  net::thread_pool workers{kNumWorkers};  // last, so first to go: it posts into the io_context
};

// One client connection: reads a request, has it answered, writes the answer, then the next. Everything runs on the
// connection's strand; `phase_` says which step it is in, and a completion that finds another phase is stale.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(HttpTransport::Impl& transport, tcp::socket socket, uint64_t id)
      : transport_(transport),
        limits_(transport.limits),
        id_(id),
        strand_(socket.get_executor()),
        stream_(std::move(socket)),
        deadline_(stream_.get_executor()),
        pulse_(stream_.get_executor()),
        parser_(transport.limits, transport.body_budget) {}

  ~Session() { transport_.forget(id_); }

  const net::any_io_executor& executor() const { return strand_; }

  void start() {
    beast::error_code ignored;
    stream_.socket().set_option(tcp::no_delay(true), ignored);  // a streamed chunk leaves at once
    read_next();
  }

  // The server stops: an idle or half-read connection closes now, one being answered once its response is written.
  void shut_down() {
    if (phase_ == Phase::Idle || phase_ == Phase::Reading || phase_ == Phase::Lingering) close_now();
  }
  void close_now();

 private:
  enum class Phase { Idle, Reading, Handling, Writing, Late, Lingering, Closed };

  void read_next();
  void parse();
  void read_some();
  void on_read(const beast::error_code& error, size_t num_bytes);
  void arm_deadline();
  void write_continue();
  void dispatch(HttpRequest request);
  HttpReply answer(const HttpRequest& request);
  void respond(HttpReply reply);
  void refuse(const HttpRefusal& refusal);
  void write_whole(HttpResponse response);
  void on_whole_written(const beast::error_code& error);
  void start_late(std::shared_ptr<LateResponse> late);
  void wake();
  void pump();
  void on_late_written(const beast::error_code& error);
  void end_late();
  void watch_client();
  void arm_pulse();
  void linger();
  void drain();
  void record(int status);
  bool keeps_alive(const HttpResponse& response) const;

  HttpTransport::Impl& transport_;
  const HttpLimits& limits_;
  const uint64_t id_;
  const net::any_io_executor strand_;  // the connection's own; wake() posts to it from other threads
  beast::tcp_stream stream_;           // its timeouts bound the wait for a request's first byte, and every write
  net::steady_timer deadline_;         // the whole request must arrive before it
  net::steady_timer pulse_;            // polls a late response
  RequestParser parser_;
  Phase phase_ = Phase::Idle;
  uint64_t request_number_ = 0;  // tells a stale timer or watch from the current request's
  bool deadline_passed_ = false;

  // The request being answered.
  HttpExchange exchange_;
  bool exchange_open_ = false;  // answered() is still due
  std::optional<Clock::time_point> received_;
  unsigned version_ = 11;
  bool request_keep_alive_ = true;
  bool head_only_ = false;  // a HEAD request
  bool keep_alive_ = true;  // of the response being written
  std::string out_;         // what is being written

  // A late response.
  std::shared_ptr<LateResponse> late_;
  Framing late_framing_ = Framing::Chunked;
  bool late_writing_ = false;
  bool late_complete_ = false;
  int late_status_ = 0;
  std::atomic<bool> wake_posted_{false};
  std::vector<char> discard_;  // what a lingering connection reads and drops
};

void Session::read_next() {
  phase_ = Phase::Idle;
  if (transport_.stopping) return close_now();
  ++request_number_;
  deadline_passed_ = false;
  if (parser_.started()) {  // the next request came with the last one (pipelining)
    phase_ = Phase::Reading;
    arm_deadline();
  }
  parse();
}

void Session::parse() {
  switch (parser_.parse()) {
    case RequestParser::Status::NeedMore:
      return read_some();
    case RequestParser::Status::SendContinue:
      return write_continue();
    case RequestParser::Status::Complete:
      return dispatch(parser_.take());
    case RequestParser::Status::Refused:
      return refuse(parser_.refusal());
  }
}

void Session::read_some() {
  if (deadline_passed_)
    return refuse({408, fmt::format("the request did not arrive within {} s",
                                    std::chrono::duration<double>(limits_.request_timeout).count())});
  // Waiting for a request's first byte is the keep-alive timeout (tcp_stream closes the connection); the rest of the
  // request has the deadline, which answers 408.
  if (phase_ == Phase::Idle)
    stream_.expires_after(limits_.keep_alive_timeout);
  else
    stream_.expires_never();
  const std::span<char> space = parser_.read_space();
  stream_.async_read_some(net::buffer(space.data(), space.size()),
                          [self = shared_from_this()](const beast::error_code& error, size_t num_bytes) {
                            self->on_read(error, num_bytes);
                          });
}

void Session::on_read(const beast::error_code& error, size_t num_bytes) {
  if (phase_ != Phase::Idle && phase_ != Phase::Reading) return;
  if (error && !deadline_passed_) return close_now();  // the client left, the keep-alive timeout, or the server stops
  parser_.commit(num_bytes);
  if (phase_ == Phase::Idle && num_bytes > 0) {
    phase_ = Phase::Reading;
    arm_deadline();
  }
  parse();
}

void Session::arm_deadline() {
  deadline_.expires_after(limits_.request_timeout);
  deadline_.async_wait([self = shared_from_this(), number = request_number_](const beast::error_code& error) {
    if (error || number != self->request_number_ || self->phase_ != Phase::Reading) return;
    self->deadline_passed_ = true;
    self->stream_.cancel();  // the pending read ends, and answers 408
  });
}

void Session::write_continue() {
  stream_.expires_after(limits_.write_timeout);
  net::async_write(stream_, net::buffer(kContinue),
                   [self = shared_from_this()](const beast::error_code& error, size_t) {
                     if (self->phase_ != Phase::Reading) return;
                     if (error && !self->deadline_passed_) return self->close_now();
                     self->parse();
                   });
}

void Session::dispatch(HttpRequest request) {
  deadline_.cancel();
  received_ = Clock::now();
  exchange_ = {};
  exchange_.method = request.method;
  exchange_.path = request.path;
  exchange_open_ = true;
  version_ = request.version;
  request_keep_alive_ = request.keep_alive;
  head_only_ = request.method == "HEAD";
  phase_ = Phase::Handling;
  if (!transport_.handler.takes_long(request)) return respond(answer(request));
  net::post(transport_.workers, [self = shared_from_this(), request = std::move(request)] {
    HttpReply reply = self->answer(request);
    net::post(self->executor(), [self, reply = std::move(reply)]() mutable { self->respond(std::move(reply)); });
  });
}

HttpReply Session::answer(const HttpRequest& request) {
  try {
    return transport_.handler.answer(request);
  } catch (const std::exception& error) {
    return transport_.handler.refusal(500, error.what());
  }
}

void Session::respond(HttpReply reply) {
  if (phase_ != Phase::Handling) return;  // closed meanwhile (the server stops)
  if (auto* late = std::get_if<std::shared_ptr<LateResponse>>(&reply)) return start_late(std::move(*late));
  write_whole(std::move(std::get<HttpResponse>(reply)));
}

void Session::refuse(const HttpRefusal& refusal) {
  deadline_.cancel();
  exchange_ = {};
  std::tie(exchange_.method, exchange_.path) = parser_.method_and_path();
  exchange_open_ = true;
  received_.reset();
  request_keep_alive_ = false;  // the rest of the connection's bytes cannot be framed
  head_only_ = false;
  HttpResponse response;
  try {
    response = transport_.handler.refusal(refusal.status, refusal.message);
  } catch (const std::exception&) {
    response.status = refusal.status;
    response.content_type = "text/plain";
    response.body = refusal.message;
  }
  write_whole(std::move(response));
}

bool Session::keeps_alive(const HttpResponse& response) const {
  return request_keep_alive_ && !response.close && !transport_.stopping;
}

void Session::write_whole(HttpResponse response) {
  phase_ = Phase::Writing;
  keep_alive_ = keeps_alive(response);
  exchange_.status = response.status;
  exchange_.body_bytes = response.body.size();
  if (!response.log_id.empty()) exchange_.id = response.log_id;
  out_ = head_text(response, version_, keep_alive_, Framing::Length, limits_.keep_alive_timeout);
  if (!head_only_) out_ += response.body;  // a response to HEAD has the header of the one to GET, no body
  stream_.expires_after(limits_.write_timeout);
  net::async_write(stream_, net::buffer(out_), [self = shared_from_this()](const beast::error_code& error, size_t) {
    self->on_whole_written(error);
  });
}

void Session::on_whole_written(const beast::error_code& error) {
  if (phase_ != Phase::Writing) return;
  out_.clear();
  record(error ? 499 : exchange_.status);
  if (error) return close_now();
  if (!keep_alive_) return linger();
  read_next();
}

void Session::start_late(std::shared_ptr<LateResponse> late) {
  phase_ = Phase::Late;
  late_ = std::move(late);
  exchange_.id = late_->log_id;
  late_writing_ = false;
  late_complete_ = false;
  late_status_ = 0;
  late_->start([weak = weak_from_this()] {
    if (const auto self = weak.lock()) self->wake();
  });
  watch_client();
  arm_pulse();
  pump();
}

// From any thread: polls the late response on the strand, once however many wakes come before it runs.
void Session::wake() {
  if (wake_posted_.exchange(true)) return;
  net::post(executor(), [self = shared_from_this()] {
    self->wake_posted_ = false;
    self->pump();
  });
}

// Writes what the late response has ready, one write at a time.
void Session::pump() {
  if (phase_ != Phase::Late || late_writing_) return;
  LateProgress progress;
  try {
    progress = late_->poll();
  } catch (const std::exception& error) {
    if (late_status_ != 0) return close_now();  // a streamed head went out: nothing else can be said
    progress = {transport_.handler.refusal(500, error.what()), "", true};
  }
  if (progress.head && !progress.head->streamed) {  // a whole response, at last
    JAMBO_ASSERT(late_status_ == 0);
    pulse_.cancel();
    beast::error_code ignored;
    stream_.socket().cancel(ignored);  // ends the watch
    late_.reset();
    return write_whole(std::move(*progress.head));
  }
  if (progress.head) {
    JAMBO_ASSERT(late_status_ == 0);
    late_status_ = progress.head->status;
    exchange_.status = late_status_;
    exchange_.streamed = true;
    keep_alive_ = keeps_alive(*progress.head) && version_ >= 11;
    late_framing_ = version_ >= 11 ? Framing::Chunked : Framing::UntilClose;
    out_ = head_text(*progress.head, version_, keep_alive_, late_framing_, limits_.keep_alive_timeout);
  }
  if (!progress.body.empty()) out_ += late_framing_ == Framing::Chunked ? chunk_text(progress.body) : progress.body;
  if (progress.complete) {
    JAMBO_ASSERT(late_status_ != 0);  // a stream ends after its head
    late_complete_ = true;
    if (progress.logged_status != 0) exchange_.status = progress.logged_status;
    if (late_framing_ == Framing::Chunked) out_ += "0\r\n\r\n";
  }
  if (out_.empty()) return;
  late_writing_ = true;
  stream_.expires_after(limits_.write_timeout);
  net::async_write(stream_, net::buffer(out_), [self = shared_from_this()](const beast::error_code& error, size_t) {
    self->on_late_written(error);
  });
}

void Session::on_late_written(const beast::error_code& error) {
  if (phase_ != Phase::Late) return;
  late_writing_ = false;
  out_.clear();
  if (error) return close_now();  // the client left, or stopped reading for the write timeout
  if (late_complete_) return end_late();
  pump();
}

void Session::end_late() {
  pulse_.cancel();
  beast::error_code ignored;
  stream_.socket().cancel(ignored);  // ends the watch
  late_.reset();
  record(exchange_.status);
  if (!keep_alive_) return linger();
  read_next();
}

// While a late response is under way, a client that closes its side is seen at once, and its work abandoned. Bytes
// of its next request end the watch: those wait in the socket, and a client that leaves is then seen on a write.
void Session::watch_client() {
  stream_.socket().async_wait(
      tcp::socket::wait_read, [self = shared_from_this(), number = request_number_](const beast::error_code& error) {
        if (error || number != self->request_number_ || self->phase_ != Phase::Late) return;
        // The last bytes are on their way: the client may close as soon as it has them, and its close can reach this
        // strand before the write's completion does. The write's own result says whether it got them.
        if (self->late_complete_) return;
        char byte = 0;
        const ssize_t peeked = ::recv(self->stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        if (peeked > 0) return;
        if (peeked < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return self->watch_client();
        self->close_now();
      });
}

void Session::arm_pulse() {
  pulse_.expires_after(kPulse);
  pulse_.async_wait([self = shared_from_this(), number = request_number_](const beast::error_code& error) {
    if (error || number != self->request_number_ || self->phase_ != Phase::Late) return;
    self->pump();
    self->arm_pulse();
  });
}

// After a last response, the client may still be sending (a refused body): closing at once would reset the
// connection and could lose that response. Its side is read and dropped until it closes, for a bounded time.
void Session::linger() {
  phase_ = Phase::Lingering;
  beast::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
  discard_.resize(kLingerReadSize);
  stream_.expires_after(kLingerTime);  // for the whole drain, not for each read
  drain();
}

void Session::drain() {
  stream_.async_read_some(net::buffer(discard_), [self = shared_from_this()](const beast::error_code& error, size_t) {
    if (self->phase_ != Phase::Lingering) return;
    if (error) return self->close_now();
    self->drain();
  });
}

void Session::close_now() {
  if (phase_ == Phase::Closed) return;
  phase_ = Phase::Closed;
  deadline_.cancel();
  pulse_.cancel();
  beast::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
  stream_.close();
  const std::shared_ptr<LateResponse> late = std::exchange(late_, nullptr);  // set: still under way
  if (exchange_open_) record(499);  // counted before the work stops, so that freed slots mean a counted answer
  if (late) late->abandon();
}

void Session::record(int status) {
  if (!exchange_open_) return;
  exchange_open_ = false;
  exchange_.status = status;
  if (received_) exchange_.milliseconds = std::chrono::duration<double, std::milli>(Clock::now() - *received_).count();
  try {
    transport_.handler.answered(exchange_);
  } catch (const std::exception&) {
    // the log line and the counter are lost; the connection is not
  }
  exchange_ = {};
  received_.reset();
}

void HttpTransport::Impl::accept() {
  acceptor.async_accept(net::make_strand(io), [this](const beast::error_code& error, tcp::socket socket) {
    if (!acceptor.is_open()) return;
    if (error) {  // out of descriptors, most likely: a moment later some may be free
      accept_retry.expires_after(kAcceptRetry);
      accept_retry.async_wait([this](const beast::error_code& waited) {
        if (!waited) accept();
      });
      return;
    }
    std::shared_ptr<Session> session;
    {
      std::lock_guard lock(mutex);
      const uint64_t id = next_id++;
      session = std::make_shared<Session>(*this, std::move(socket), id);
      sessions.emplace(id, session);
    }
    net::dispatch(session->executor(), [session] { session->start(); });
    accept();
  });
}

std::vector<std::shared_ptr<Session>> HttpTransport::Impl::live_sessions() {
  std::vector<std::shared_ptr<Session>> live;
  std::lock_guard lock(mutex);
  for (const auto& [id, weak] : sessions)
    if (auto session = weak.lock()) live.push_back(std::move(session));
  return live;
}

void HttpTransport::Impl::forget(uint64_t id) {
  std::lock_guard lock(mutex);
  sessions.erase(id);
}

void HttpTransport::Impl::begin_shutdown() {
  beast::error_code ignored;
  acceptor.close(ignored);
  accept_retry.cancel();
  for (const auto& session : live_sessions()) net::post(session->executor(), [session] { session->shut_down(); });
  check_shutdown(Clock::now());
}

// Until every connection is gone: past the grace time, the ones left are closed; past the limit, the I/O stops.
void HttpTransport::Impl::check_shutdown(Clock::time_point began) {
  shutdown_timer.expires_after(kShutdownCheck);
  shutdown_timer.async_wait([this, began](const beast::error_code& error) {
    if (error) return;
    const std::vector<std::shared_ptr<Session>> live = live_sessions();
    if (live.empty()) return;  // nothing left to run: run() returns
    const auto elapsed = Clock::now() - began;
    if (elapsed >= kShutdownLimit) return io.stop();
    if (elapsed >= kShutdownGrace && !forced_close) {
      forced_close = true;
      for (const auto& session : live) net::post(session->executor(), [session] { session->close_now(); });
    }
    check_shutdown(began);
  });
}

HttpTransport::HttpTransport(HttpHandler& handler, const HttpLimits& limits)
    : impl_(std::make_unique<Impl>(handler, limits)) {}

HttpTransport::~HttpTransport() = default;

int HttpTransport::bind(const std::string& host, int port) {
  tcp::acceptor& acceptor = impl_->acceptor;
  beast::error_code error;
  tcp::resolver resolver(impl_->io);
  const auto endpoints = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, error);
  JAMBO_REQUIRE(!error && !endpoints.empty(), "cannot listen on {}:{}: {}", host, port,
                error ? error.message() : "not an address of this machine");
  const tcp::endpoint endpoint = endpoints.begin()->endpoint();
  // SO_REUSEADDR lets a restarted server listen past its predecessor's TIME_WAIT connections; without SO_REUSEPORT, a
  // second server on the port fails instead of sharing it.
  if (!acceptor.open(endpoint.protocol(), error)) acceptor.set_option(tcp::acceptor::reuse_address(true), error);
  if (!error) acceptor.bind(endpoint, error);
  if (!error) acceptor.listen(net::socket_base::max_listen_connections, error);
  JAMBO_REQUIRE(!error, "cannot listen on {}:{}: {}", host, port, bind_failure(error));
  raise_descriptor_limit();
  return acceptor.local_endpoint().port();
}

void HttpTransport::run() {
  net::dispatch(impl_->control, [impl = impl_.get()] { impl->accept(); });
  std::vector<std::thread> threads;
  for (int t = 1; t < kNumIoThreads; ++t) threads.emplace_back([impl = impl_.get()] { impl->io.run(); });
  impl_->io.run();
  for (std::thread& thread : threads) thread.join();
  impl_->workers.join();
}

void HttpTransport::stop() {
  if (impl_->stopping.exchange(true)) return;
  net::post(impl_->control, [impl = impl_.get()] { impl->begin_shutdown(); });
}

}  // namespace jambo::server
