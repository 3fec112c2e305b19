// The transport over real sockets with a handler of its own and short limits: pipelining, the request deadline, the
// keep-alive timeout, refusals at once, clients that leave or stop reading, and a shutdown bounded whatever the
// clients do. Every request answered or given up on reaches answered().
#include "server/http_transport.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace jambo::server {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

HttpResponse text(int status, std::string body) {
  HttpResponse response;
  response.status = status;
  response.content_type = "text/plain";
  response.body = std::move(body);
  return response;
}

// Whatever the test asks of it through the path: /hello, /echo (the body back), /late (a whole response 50 ms
// later), /brief (a stream that ends 50 ms later), /firehose (a stream that never ends), /forever (a whole response
// that never comes).
class TestHandler : public HttpHandler {
 public:
  bool takes_long(const HttpRequest& request) const override { return request.path == "/echo"; }

  HttpReply answer(const HttpRequest& request) override {
    if (request.path == "/echo") return text(200, request.body);
    if (request.path == "/late") return std::make_shared<Late>(*this, true, false);
    if (request.path == "/brief") return std::make_shared<Late>(*this, true, true);
    if (request.path == "/forever") return std::make_shared<Late>(*this, false, false);
    if (request.path == "/firehose") return std::make_shared<Firehose>(*this);
    return text(200, "hello " + request.target);
  }

  HttpResponse refusal(int status, const std::string& message) override { return text(status, message); }

  void answered(const HttpExchange& exchange) override {
    std::lock_guard lock(mutex_);
    exchanges_.push_back(exchange);
    changed_.notify_all();
  }

  // The statuses answered so far, once there are `count` of them (or what there is after 5 s).
  std::vector<int> statuses(size_t count) {
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, 5s, [&] { return exchanges_.size() >= count; });
    std::vector<int> statuses;
    for (const HttpExchange& exchange : exchanges_) statuses.push_back(exchange.status);
    return statuses;
  }

  // Waits up to 5 s for `count` abandoned responses; returns how long it took.
  std::optional<Clock::duration> wait_abandoned(int count) {
    const auto started = Clock::now();
    std::unique_lock lock(mutex_);
    if (!changed_.wait_for(lock, 5s, [&] { return abandoned_ >= count; })) return std::nullopt;
    return Clock::now() - started;
  }

  ~TestHandler() override {
    for (std::thread& helper : helpers_) helper.join();
  }

 private:
  void abandon() {
    std::lock_guard lock(mutex_);
    ++abandoned_;
    changed_.notify_all();
  }

  class Late : public LateResponse, public std::enable_shared_from_this<Late> {
   public:
    Late(TestHandler& handler, bool comes, bool streamed)
        : LateResponse("late-id"), handler_(handler), comes_(comes), streamed_(streamed) {}
    void start(std::function<void()> wake) override {
      if (!comes_) return;
      std::lock_guard lock(handler_.mutex_);
      handler_.helpers_.emplace_back([this_ = shared_from_this(), wake] {
        std::this_thread::sleep_for(50ms);
        this_->ready_ = true;
        wake();
      });
    }
    LateProgress poll() override {
      LateProgress progress;
      if (streamed_ && !head_sent_) {
        head_sent_ = true;
        progress.head = text(200, "");
        progress.head->streamed = true;
      }
      if (!ready_) return progress;
      if (streamed_)
        progress.body = "late";
      else
        progress.head = text(200, "late");
      progress.complete = true;
      return progress;
    }
    void abandon() override { handler_.abandon(); }

   private:
    TestHandler& handler_;
    const bool comes_;
    const bool streamed_;
    bool head_sent_ = false;
    std::atomic<bool> ready_{false};
  };

  class Firehose : public LateResponse {
   public:
    explicit Firehose(TestHandler& handler) : LateResponse("firehose-id"), handler_(handler) {}
    void start(std::function<void()> wake) override { wake(); }
    LateProgress poll() override {
      LateProgress progress;
      if (!head_sent_) {
        head_sent_ = true;
        progress.head = text(200, "");
        progress.head->streamed = true;
      }
      progress.body.assign(256 << 10, 'x');
      return progress;
    }
    void abandon() override { handler_.abandon(); }

   private:
    TestHandler& handler_;
    bool head_sent_ = false;
  };

  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<HttpExchange> exchanges_;
  int abandoned_ = 0;
  std::vector<std::thread> helpers_;
};

// A blocking client socket on loopback.
class Client {
 public:
  explicit Client(int port, int receive_buffer = 0) : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    if (receive_buffer > 0) setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof(receive_buffer));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(uint16_t(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  }
  ~Client() { close(fd_); }

  bool connected() const { return connected_; }

  void send(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t sent = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (sent <= 0) return;
      bytes.remove_prefix(size_t(sent));
    }
  }

  // What arrives until the server closes (closed() then says so), `marker` arrived, or `timeout` passed.
  std::string read(std::chrono::milliseconds timeout, std::string_view marker = "") {
    std::string received;
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline && (marker.empty() || received.find(marker) == std::string::npos)) {
      pollfd ready{fd_, POLLIN, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (poll(&ready, 1, int(std::max<int64_t>(left.count(), 1))) <= 0) continue;
      char buffer[4096];
      const ssize_t got = recv(fd_, buffer, sizeof(buffer), 0);
      if (got <= 0) {
        closed_ = true;
        break;
      }
      received.append(buffer, size_t(got));
    }
    return received;
  }
  bool closed() const { return closed_; }

 private:
  int fd_;
  bool connected_ = false;
  bool closed_ = false;
};

size_t count_of(const std::string& text, std::string_view part) {
  size_t count = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++count;
  return count;
}

class HttpTransportTest : public ::testing::Test {
 protected:
  void start(const HttpLimits& limits) {
    transport_ = std::make_unique<HttpTransport>(handler_, limits);
    port_ = transport_->bind("127.0.0.1", 0);
    thread_ = std::thread([this] { transport_->run(); });
  }
  // How long stop() took to end run().
  Clock::duration stop() {
    const auto started = Clock::now();
    transport_->stop();
    thread_.join();
    return Clock::now() - started;
  }
  void TearDown() override {
    if (thread_.joinable()) stop();
  }

  static HttpLimits short_limits() {
    HttpLimits limits;
    limits.request_timeout = 400ms;
    limits.keep_alive_timeout = 300ms;
    limits.write_timeout = 300ms;
    return limits;
  }

  TestHandler handler_;
  std::unique_ptr<HttpTransport> transport_;
  int port_ = 0;
  std::thread thread_;
};

TEST_F(HttpTransportTest, PipelinedRequestsAreAllAnsweredInOrder) {
  start(HttpLimits{});
  Client client(port_);
  ASSERT_TRUE(client.connected());
  client.send(
      "GET /hello/1 HTTP/1.1\r\nHost: x\r\n\r\n"
      "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\ntwo"
      "GET /late HTTP/1.1\r\nHost: x\r\n\r\n"
      "GET /hello/4 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string answers = client.read(5s);
  EXPECT_TRUE(client.closed());
  EXPECT_EQ(count_of(answers, "HTTP/1.1 200 OK"), 4u) << answers;
  const size_t first = answers.find("hello /hello/1");
  const size_t second = answers.find("\r\n\r\ntwo");
  const size_t third = answers.find("\r\n\r\nlate");
  const size_t fourth = answers.find("hello /hello/4");
  EXPECT_TRUE(first < second && second < third && third < fourth && fourth != std::string::npos) << answers;
  EXPECT_EQ(handler_.statuses(4), (std::vector<int>{200, 200, 200, 200}));
}

TEST_F(HttpTransportTest, AResponseToHeadHasNoBody) {
  start(HttpLimits{});
  Client client(port_);
  client.send("HEAD /hello HTTP/1.1\r\nHost: x\r\n\r\nGET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string answers = client.read(3s);
  EXPECT_EQ(count_of(answers, "Content-Length: 12\r\n"), 2u) << answers;
  EXPECT_EQ(count_of(answers, "hello /hello"), 1u) << answers;
}

TEST_F(HttpTransportTest, ARequestThatDoesNotArriveInTimeIs408AndClosed) {
  start(short_limits());
  Client client(port_);
  const auto started = Clock::now();
  client.send("GET /hel");
  std::string answer;
  for (int i = 0; i < 20 && !client.closed() && answer.empty(); ++i) {
    client.send("l");  // a byte every 100 ms: the connection is never idle, the request never whole
    answer = client.read(100ms);
  }
  answer += client.read(2s);
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 408 Request Timeout")) << answer;
  EXPECT_TRUE(client.closed());
  EXPECT_LT(Clock::now() - started, 1500ms);
  EXPECT_EQ(handler_.statuses(1), std::vector<int>{408});
}

TEST_F(HttpTransportTest, AnIdleConnectionIsClosedAfterTheKeepAliveTimeout) {
  start(short_limits());
  Client client(port_);
  client.send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string answer = client.read(1s, "hello /hello");
  EXPECT_NE(answer.find("Keep-Alive: timeout="), std::string::npos) << answer;
  EXPECT_EQ(client.read(2s), "");
  EXPECT_TRUE(client.closed());
  EXPECT_EQ(handler_.statuses(1), std::vector<int>{200});  // the close itself is not an answer
}

TEST_F(HttpTransportTest, ANegativeOrHugeContentLengthIsAnsweredAtOnce) {
  start(HttpLimits{});
  for (const auto& [length, status] : {std::pair{"1000000000000000000", "413"}, std::pair{"-1", "400"}}) {
    Client client(port_);
    const auto started = Clock::now();
    client.send(fmt::format("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n", length));
    const std::string answer = client.read(3s);
    EXPECT_TRUE(answer.starts_with(fmt::format("HTTP/1.1 {}", status))) << answer;
    EXPECT_TRUE(client.closed());
    EXPECT_LT(Clock::now() - started, 500ms) << length;
  }
  EXPECT_EQ(handler_.statuses(2), (std::vector<int>{413, 400}));
}

TEST_F(HttpTransportTest, Expect100ContinueGetsItsInterimResponse) {
  start(HttpLimits{});
  Client client(port_);
  client.send("POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n");
  EXPECT_EQ(client.read(2s, "\r\n\r\n"), "HTTP/1.1 100 Continue\r\n\r\n");
  client.send("body");
  EXPECT_NE(client.read(2s, "body").find("HTTP/1.1 200 OK"), std::string::npos);
}

// The client's receive buffer and the server's send buffer fill; a write then waits past the write timeout.
TEST_F(HttpTransportTest, AClientThatStopsReadingIsDroppedAndItsWorkAbandoned) {
  start(short_limits());
  Client client(port_, /*receive_buffer=*/4096);
  client.send("GET /firehose HTTP/1.1\r\nHost: x\r\n\r\n");
  const auto took = handler_.wait_abandoned(1);
  ASSERT_TRUE(took.has_value()) << "the stream was not abandoned within 5 s";
  EXPECT_LT(*took, 3s);
  EXPECT_EQ(handler_.statuses(1), std::vector<int>{499});
}

TEST_F(HttpTransportTest, AClientThatLeavesIsSeenWhileItsResponseWaits) {
  start(HttpLimits{});
  {
    Client client(port_);
    client.send("GET /forever HTTP/1.1\r\nHost: x\r\n\r\n");
    std::this_thread::sleep_for(100ms);
  }
  const auto took = handler_.wait_abandoned(1);
  ASSERT_TRUE(took.has_value()) << "the response was not abandoned within 5 s";
  EXPECT_LT(*took, 1s);
  EXPECT_EQ(handler_.statuses(1), std::vector<int>{499});
}

// Default limits (seconds of timeouts) and clients that would hold them all: stop() still ends run() in seconds.
TEST_F(HttpTransportTest, StopEndsEveryConnectionWithinSecondsWhateverTheClientsDo) {
  start(HttpLimits{});
  Client idle(port_);
  idle.send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
  idle.read(1s, "hello /hello");
  Client slow(port_);
  slow.send("GET /hello HTTP/1.1\r\nX-Slow: ");
  Client waiting(port_);
  waiting.send("GET /forever HTTP/1.1\r\nHost: x\r\n\r\n");
  Client not_reading(port_, /*receive_buffer=*/4096);
  not_reading.send("GET /firehose HTTP/1.1\r\nHost: x\r\n\r\n");
  std::this_thread::sleep_for(300ms);
  const Clock::duration took = stop();
  EXPECT_LT(took, 5s);
  EXPECT_EQ(handler_.wait_abandoned(2).has_value(), true);
}

// The stream ends while the server stops: its connection closes rather than reading the next request.
TEST_F(HttpTransportTest, AStreamThatEndsWhileTheServerStopsClosesItsConnection) {
  start(HttpLimits{});
  Client client(port_);
  client.send("GET /brief HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_NE(client.read(1s, "\r\n\r\n").find("Transfer-Encoding: chunked"), std::string::npos);
  const Clock::duration took = stop();
  EXPECT_LT(took, 5s);
  const std::string rest = client.read(1s);
  EXPECT_NE(rest.find("4\r\nlate\r\n0\r\n\r\n"), std::string::npos) << rest;
  EXPECT_TRUE(client.closed());
  EXPECT_EQ(handler_.statuses(1), std::vector<int>{200});
}

// A client that closes the moment its stream's last chunk arrives got all of it: the close can reach the transport
// before the last write's completion does, and must not turn the answer into a 499.
TEST_F(HttpTransportTest, AClientThatClosesAfterTheLastChunkIsCountedAnswered) {
  start(HttpLimits{});
  constexpr int kNumClients = 64;
  std::vector<std::thread> clients;
  for (int i = 0; i < kNumClients; ++i)
    clients.emplace_back([port = port_] {
      Client client(port);
      client.send("GET /brief HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
      client.read(5s, "0\r\n\r\n");
    });
  for (std::thread& client : clients) client.join();
  EXPECT_EQ(handler_.statuses(kNumClients), std::vector<int>(kNumClients, 200));
}

TEST_F(HttpTransportTest, ARefusedRequestIsAnsweredCountedAndClosed) {
  start(HttpLimits{});
  std::string fields;
  for (int i = 0; i < 200; ++i) fields += fmt::format("X-{}: {}\r\n", i, i);
  Client client(port_);
  client.send("GET /hello HTTP/1.1\r\n" + fields + "\r\nGET /hello HTTP/1.1\r\n\r\n");
  const std::string answer = client.read(3s);
  EXPECT_TRUE(answer.starts_with("HTTP/1.1 431")) << answer;
  EXPECT_NE(answer.find("too many header fields"), std::string::npos);
  EXPECT_EQ(count_of(answer, "HTTP/1.1"), 1u);  // what follows a refusal is not read as a request
  EXPECT_TRUE(client.closed());
  EXPECT_EQ(handler_.statuses(1), std::vector<int>{431});
}

}  // namespace
}  // namespace jambo::server
