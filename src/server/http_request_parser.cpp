#include "server/http_request_parser.h"

#include "core/error.h"

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>

namespace jambo::server {

namespace beast = boost::beast;
namespace http = boost::beast::http;

namespace {

constexpr size_t kHeaderReadSize = 2 << 10;
constexpr size_t kBodyReadSize = 64 << 10;
constexpr size_t kInflateStep = 64 << 10;

std::string size_text(size_t bytes) {
  if (bytes % (1 << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  if (bytes % (1 << 10) == 0) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} bytes", bytes);
}

HttpRefusal over_budget(const BodyBudget& budget) {
  return {503, fmt::format("the server holds too many request bodies at once (over {} in all); retry later",
                           size_text(budget.max_bytes()))};
}

HttpRefusal body_too_large(size_t limit, std::string_view coding) {
  if (coding.empty()) return {413, fmt::format("the request body is too large (over {})", size_text(limit))};
  return {413, fmt::format("the request body is too large once decoded (over {}, Content-Encoding {})",
                           size_text(limit), coding)};
}

std::string_view trimmed(std::string_view text) {
  const size_t begin = text.find_first_not_of(" \t");
  if (begin == std::string_view::npos) return {};
  return text.substr(begin, text.find_last_not_of(" \t") - begin + 1);
}

enum class ContentCoding { Identity, Gzip, Deflate };

// Inflates a gzip or zlib ("deflate") stream, refusing output past a limit; one stream per body, nothing after it.
class Inflater {
 public:
  Inflater() {
    // 15: the largest window; +32: a gzip or a zlib header, whichever the stream has.
    JAMBO_ASSERT(inflateInit2(&stream_, 15 + 32) == Z_OK);
  }
  ~Inflater() { inflateEnd(&stream_); }
  Inflater(const Inflater&) = delete;
  Inflater& operator=(const Inflater&) = delete;

  std::optional<HttpRefusal> put(std::string_view input, std::string& output, size_t limit, std::string_view coding) {
    stream_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(input.data()));
    stream_.avail_in = uInt(input.size());
    while (stream_.avail_in > 0) {
      if (ended_) return HttpRefusal{400, fmt::format("the request body has data after its {} stream", coding)};
      const size_t before = output.size();
      output.resize(before + kInflateStep);
      stream_.next_out = reinterpret_cast<Bytef*>(output.data() + before);
      stream_.avail_out = uInt(kInflateStep);
      const int result = inflate(&stream_, Z_NO_FLUSH);
      output.resize(before + kInflateStep - stream_.avail_out);
      if (output.size() > limit) return body_too_large(limit, coding);
      if (result == Z_STREAM_END)
        ended_ = true;
      else if (result != Z_OK && result != Z_BUF_ERROR)
        return HttpRefusal{400, fmt::format("the request body is not valid {} data ({})", coding,
                                            stream_.msg ? stream_.msg : "zlib error")};
    }
    return std::nullopt;
  }

  std::optional<HttpRefusal> finish(std::string_view coding) const {
    if (ended_) return std::nullopt;
    return HttpRefusal{400, fmt::format("the request body ends inside its {} stream", coding)};
  }

 private:
  z_stream stream_{};
  bool ended_ = false;
};

// A Beast body: the request body decoded as it arrives, refused past the limit whatever its framing or coding.
struct DecodedBody {
  struct value_type {
    std::string text;  // decoded
    // Set by the parser once the header is read, before the first body byte.
    ContentCoding coding = ContentCoding::Identity;
    std::string coding_name;
    size_t limit = 0;
    std::shared_ptr<BodyCharge> charge;  // the text's share of the server's budget, or null
    std::optional<HttpRefusal> refusal;  // why the reader stopped
  };

  class reader {
   public:
    template <bool isRequest, class Fields>
    reader(http::header<isRequest, Fields>&, value_type& body) : body_(body) {}

    void init(const boost::optional<std::uint64_t>&, beast::error_code& ec) {
      if (body_.coding != ContentCoding::Identity) inflater_ = std::make_unique<Inflater>();
      ec = {};
    }

    template <class ConstBufferSequence>
    size_t put(const ConstBufferSequence& buffers, beast::error_code& ec) {
      size_t used = 0;
      for (auto it = boost::asio::buffer_sequence_begin(buffers); it != boost::asio::buffer_sequence_end(buffers);
           ++it) {
        const std::string_view bytes(static_cast<const char*>((*it).data()), (*it).size());
        if (!append(bytes)) {
          ec = http::error::body_limit;  // the parser reads body_.refusal for the reason
          return used;
        }
        used += bytes.size();
      }
      ec = {};
      return used;
    }

    void finish(beast::error_code& ec) {
      ec = {};
      if (!inflater_) return;
      body_.refusal = inflater_->finish(body_.coding_name);
      if (body_.refusal) ec = http::error::body_limit;
    }

   private:
    bool append(std::string_view bytes) {
      if (inflater_) {
        body_.refusal = inflater_->put(bytes, body_.text, body_.limit, body_.coding_name);
      } else if (body_.text.size() + bytes.size() > body_.limit) {
        body_.refusal = body_too_large(body_.limit, "");
      } else {
        body_.text.append(bytes);
      }
      if (!body_.refusal && body_.charge && !body_.charge->grow_to(body_.text.size()))
        body_.refusal = over_budget(body_.charge->budget());
      return !body_.refusal;
    }

    value_type& body_;
    std::unique_ptr<Inflater> inflater_;
  };
};

using BeastParser = http::request_parser<DecodedBody>;

HttpRefusal refusal_for(const beast::error_code& error, const HttpLimits& limits) {
  if (error == http::error::header_limit)
    return {431, fmt::format("the request header is too large (over {})", size_text(limits.max_header_bytes))};
  if (error == http::error::body_limit) return body_too_large(limits.max_body_bytes, "");
  if (error == http::error::bad_content_length) return {400, "the request's Content-Length is not a valid length"};
  if (error == http::error::bad_transfer_encoding)
    return {400, "the request's Transfer-Encoding repeats chunked or comes with a Content-Length"};
  return {400, fmt::format("the HTTP request is malformed ({})", error.message())};
}

// The body's Content-Encoding, or why it is refused.
std::optional<HttpRefusal> read_coding(const http::request_header<>& header, DecodedBody::value_type& body) {
  const auto [first, last] = header.equal_range(http::field::content_encoding);
  if (first == last) return std::nullopt;
  const std::string_view value = trimmed(first->value());
  if (std::next(first) == last) {
    if (beast::iequals(value, "identity")) return std::nullopt;
    if (beast::iequals(value, "gzip") || beast::iequals(value, "x-gzip")) body.coding = ContentCoding::Gzip;
    if (beast::iequals(value, "deflate")) body.coding = ContentCoding::Deflate;
  }
  if (body.coding == ContentCoding::Identity)
    return HttpRefusal{415, fmt::format("Content-Encoding '{}' is not supported: send identity, gzip or deflate",
                                        std::string_view(value))};
  body.coding_name = body.coding == ContentCoding::Gzip ? "gzip" : "deflate";
  return std::nullopt;
}

}  // namespace

std::optional<std::string_view> HttpRequest::header(std::string_view name) const {
  for (const auto& [field, value] : headers)
    if (beast::iequals(field, name)) return std::string_view(value);
  return std::nullopt;
}

struct RequestParser::State {
  beast::flat_buffer buffer;
  std::optional<BeastParser> parser;
  bool header_checked = false;
  std::optional<HttpRefusal> refusal;
};

bool BodyBudget::try_take(size_t num_bytes) {
  size_t held = held_.load();
  do {
    if (num_bytes > max_bytes_ - std::min(held, max_bytes_)) return false;
  } while (!held_.compare_exchange_weak(held, held + num_bytes));
  return true;
}

void BodyBudget::give_back(size_t num_bytes) { held_.fetch_sub(num_bytes); }

bool BodyCharge::grow_to(size_t num_bytes) {
  if (num_bytes <= bytes_) return true;
  if (!budget_->try_take(num_bytes - bytes_)) return false;
  bytes_ = num_bytes;
  return true;
}

RequestParser::RequestParser(const HttpLimits& limits, std::shared_ptr<BodyBudget> budget)
    : limits_(limits), budget_(std::move(budget)), state_(std::make_unique<State>()) {
  start_next();
}

RequestParser::~RequestParser() = default;

void RequestParser::start_next() {
  BeastParser& parser = state_->parser.emplace();
  parser.header_limit(std::uint32_t(std::min<size_t>(limits_.max_header_bytes, UINT32_MAX)));
  parser.body_limit(limits_.max_body_bytes);
  parser.get().body().limit = limits_.max_body_bytes;
  if (budget_) parser.get().body().charge = std::make_shared<BodyCharge>(budget_);
  state_->header_checked = false;
}

// Never more than the header limit and a read past it: a line the parser cannot finish (a header, a chunk's size
// line, trailer fields) is refused once it fills that.
std::span<char> RequestParser::read_space() {
  const size_t capacity = limits_.max_header_bytes + kHeaderReadSize;
  const size_t room = capacity - std::min(capacity, state_->buffer.size());
  const size_t wanted = state_->parser->is_header_done() ? kBodyReadSize : kHeaderReadSize;
  JAMBO_ASSERT(room > 0);  // parse() refuses a request that fills it
  const auto space = state_->buffer.prepare(std::min(room, wanted));
  return {static_cast<char*>(space.data()), space.size()};
}

void RequestParser::commit(size_t num_bytes) { state_->buffer.commit(num_bytes); }

bool RequestParser::started() const { return state_->buffer.size() > 0 || state_->parser->got_some(); }

RequestParser::Status RequestParser::refuse(HttpRefusal refusal) {
  state_->refusal = std::move(refusal);
  return Status::Refused;
}

RequestParser::Status RequestParser::parse() {
  if (state_->refusal) return Status::Refused;
  BeastParser& parser = *state_->parser;
  beast::flat_buffer& buffer = state_->buffer;
  for (;;) {
    if (parser.is_header_done() && !state_->header_checked) {
      state_->header_checked = true;
      if (const Status status = after_header(); status != Status::NeedMore) return status;
    }
    if (parser.is_done()) {
      if (size_t(std::distance(parser.get().begin(), parser.get().end())) > limits_.max_header_fields)
        return refuse({431, fmt::format("the request has too many header and trailer fields (over {})",
                                        limits_.max_header_fields)});
      return Status::Complete;
    }
    if (buffer.size() == 0) return Status::NeedMore;
    beast::error_code error;
    const size_t used = parser.put(buffer.data(), error);
    buffer.consume(used);
    if (const auto& body_refusal = parser.get().body().refusal) return refuse(*body_refusal);
    if (error && error != http::error::need_more) return refuse(refusal_for(error, limits_));
    if (used > 0) continue;
    if (buffer.size() >= limits_.max_header_bytes + kHeaderReadSize)
      return refuse({431, fmt::format("a chunk-size line or the trailer fields of the request are too large (over {})",
                                      size_text(limits_.max_header_bytes))});
    return Status::NeedMore;
  }
}

// The header is complete and the body not started: the checks Beast leaves to its user.
RequestParser::Status RequestParser::after_header() {
  BeastParser& parser = *state_->parser;
  const http::request_header<>& header = parser.get().base();
  if (size_t(std::distance(header.begin(), header.end())) > limits_.max_header_fields)
    return refuse({431, fmt::format("the request has too many header fields (over {})", limits_.max_header_fields)});
  for (const auto& field : header) {
    if (field.name() != http::field::transfer_encoding) continue;
    if (!parser.chunked())
      return refuse({400, fmt::format("Transfer-Encoding '{}' does not end with chunked", field.value())});
    if (!beast::iequals(trimmed(field.value()), "chunked"))
      return refuse({501, fmt::format("Transfer-Encoding '{}' is not supported: only chunked", field.value())});
  }
  if (auto refusal = read_coding(header, parser.get().body())) return refuse(std::move(*refusal));
  const auto expect = header.find(http::field::expect);
  if (expect == header.end()) return Status::NeedMore;
  if (!beast::iequals(trimmed(expect->value()), "100-continue"))
    return refuse({417, fmt::format("Expect '{}' is not supported: only 100-continue", expect->value())});
  if (header.version() >= 11 && !parser.is_done()) return Status::SendContinue;
  return Status::NeedMore;
}

HttpRequest RequestParser::take() {
  auto& message = state_->parser->get();
  HttpRequest request;
  request.method = message.method_string();
  request.target = message.target();
  request.path = request.target.substr(0, request.target.find('?'));
  request.version = message.version();
  request.keep_alive = message.keep_alive();
  for (const auto& field : message) request.headers.emplace_back(field.name_string(), field.value());
  request.body = std::move(message.body().text);
  request.body_charge = std::move(message.body().charge);
  start_next();
  return request;
}

const HttpRefusal& RequestParser::refusal() const {
  JAMBO_ASSERT(state_->refusal.has_value());
  return *state_->refusal;
}

std::pair<std::string, std::string> RequestParser::method_and_path() const {
  const auto& message = state_->parser->get();
  const std::string_view target = message.target();
  return {std::string(message.method_string()), std::string(target.substr(0, target.find('?')))};
}

ParsedRequests parse_http_requests(std::string_view bytes, const HttpLimits& limits, size_t read_size) {
  RequestParser parser(limits);
  ParsedRequests parsed;
  read_size = std::max<size_t>(read_size, 1);
  for (;;) {
    switch (parser.parse()) {
      case RequestParser::Status::Complete:
        parsed.requests.push_back(parser.take());
        continue;
      case RequestParser::Status::Refused:
        parsed.refusal = parser.refusal();
        return parsed;
      case RequestParser::Status::SendContinue:
        continue;
      case RequestParser::Status::NeedMore:
        break;
    }
    if (bytes.empty()) {
      parsed.incomplete = parser.started();
      return parsed;
    }
    const std::span<char> space = parser.read_space();
    const size_t count = std::min({space.size(), read_size, bytes.size()});
    std::memcpy(space.data(), bytes.data(), count);
    parser.commit(count);
    bytes.remove_prefix(count);
  }
}

}  // namespace jambo::server
