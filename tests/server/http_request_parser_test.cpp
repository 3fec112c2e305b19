// The request parser without sockets: framing (Content-Length, chunked, pipelining), the limits on the header and on
// the decoded body whatever its framing or Content-Encoding, and a refusal with the right status for everything else.
#include "server/http_request_parser.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>

namespace jambo::server {
namespace {

const HttpLimits kLimits;  // the server's

std::string post(const std::string& body, const std::string& headers = "") {
  return "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" +
         headers + "\r\n" + body;
}

std::string chunked(const std::vector<std::string>& chunks, const std::string& trailers = "",
                    const std::string& headers = "") {
  std::string text = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n" + headers + "\r\n";
  for (const std::string& chunk : chunks) {
    char size[32];
    std::snprintf(size, sizeof(size), "%zx\r\n", chunk.size());
    text += size + chunk + "\r\n";
  }
  return text + "0\r\n" + trailers + "\r\n";
}

// zlib's compress with a gzip (windowBits 31) or zlib (15) header.
std::string compressed(const std::string& data, int window_bits) {
  z_stream stream{};
  EXPECT_EQ(deflateInit2(&stream, 9, Z_DEFLATED, window_bits, 9, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&stream, uLong(data.size())), '\0');
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  stream.avail_in = uInt(data.size());
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = uInt(out.size());
  EXPECT_EQ(deflate(&stream, Z_FINISH), Z_STREAM_END);
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

// The one refusal of `bytes`, which must come before any request is complete.
HttpRefusal refusal_of(const std::string& bytes, const HttpLimits& limits = kLimits) {
  const ParsedRequests parsed = parse_http_requests(bytes, limits);
  EXPECT_TRUE(parsed.requests.empty());
  EXPECT_TRUE(parsed.refusal.has_value()) << bytes.substr(0, 200);
  return parsed.refusal.value_or(HttpRefusal{0, "none"});
}

TEST(HttpRequestParser, ReadsARequestLineHeadersAndBody) {
  const ParsedRequests parsed =
      parse_http_requests("GET /health?verbose=1 HTTP/1.1\r\nHost: x\r\nX-Request-Id: abc\r\n\r\n", kLimits);
  ASSERT_EQ(parsed.requests.size(), 1u);
  const HttpRequest& request = parsed.requests[0];
  EXPECT_EQ(request.method, "GET");
  EXPECT_EQ(request.target, "/health?verbose=1");
  EXPECT_EQ(request.path, "/health");
  EXPECT_EQ(request.version, 11u);
  EXPECT_TRUE(request.keep_alive);
  EXPECT_EQ(request.header("x-request-id").value_or(""), "abc");
  EXPECT_FALSE(request.header("Content-Type").has_value());
  EXPECT_FALSE(parsed.refusal);
  EXPECT_FALSE(parsed.incomplete);

  const ParsedRequests closing = parse_http_requests("GET / HTTP/1.0\r\n\r\n", kLimits);
  ASSERT_EQ(closing.requests.size(), 1u);
  EXPECT_FALSE(closing.requests[0].keep_alive);
}

// Pipelining: several requests in one write come out complete and in order, however the bytes are split.
TEST(HttpRequestParser, PipelinedRequestsComeOutInOrderWhateverTheReads) {
  const std::string bytes = post(R"({"a": 1})") + "GET /health HTTP/1.1\r\nHost: x\r\n\r\n" +
                            chunked({"{\"b\":", " 2}"}, "X-Trailer: t\r\n") + post("");
  for (const size_t read_size : {size_t(1), size_t(7), size_t(4096)}) {
    const ParsedRequests parsed = parse_http_requests(bytes, kLimits, read_size);
    ASSERT_EQ(parsed.requests.size(), 4u) << "reads of " << read_size;
    EXPECT_EQ(parsed.requests[0].body, R"({"a": 1})");
    EXPECT_EQ(parsed.requests[1].method, "GET");
    EXPECT_EQ(parsed.requests[2].body, R"({"b": 2})");
    EXPECT_EQ(parsed.requests[2].header("X-Trailer").value_or(""), "t");
    EXPECT_EQ(parsed.requests[3].body, "");
    EXPECT_FALSE(parsed.refusal);
    EXPECT_FALSE(parsed.incomplete);
  }
}

TEST(HttpRequestParser, AnUnfinishedRequestIsIncomplete) {
  EXPECT_TRUE(parse_http_requests("GET /health HTTP/1.1\r\nHo", kLimits).incomplete);
  const std::string request = post("0123456789");
  EXPECT_TRUE(parse_http_requests(request.substr(0, request.size() - 3), kLimits).incomplete);
  EXPECT_FALSE(parse_http_requests("", kLimits).incomplete);
}

TEST(HttpRequestParser, ABodyOverTheLimitIs413WhateverItsFraming) {
  HttpLimits limits;
  limits.max_body_bytes = 1000;
  EXPECT_EQ(refusal_of(post(std::string(1001, 'x')), limits).status, 413);
  EXPECT_EQ(parse_http_requests(post(std::string(1000, 'x')), limits).requests.size(), 1u);
  EXPECT_EQ(refusal_of(chunked({std::string(600, 'x'), std::string(401, 'x')}), limits).status, 413);
  EXPECT_EQ(parse_http_requests(chunked({std::string(600, 'x'), std::string(400, 'x')}), limits).requests.size(), 1u);
  // The server's own limit, 16 MiB, with a chunked body of 17 chunks of 1 MiB.
  const HttpRefusal refusal = refusal_of(chunked(std::vector<std::string>(17, std::string(1 << 20, 'x'))));
  EXPECT_EQ(refusal.status, 413);
  EXPECT_EQ(refusal.message, "the request body is too large (over 16 MiB)");
}

// Feeds bytes to a connection's parser until it completes a request, refuses one, or wants more than there is.
RequestParser::Status feed(RequestParser& parser, std::string_view bytes) {
  for (;;) {
    const RequestParser::Status status = parser.parse();
    if (status == RequestParser::Status::Complete || status == RequestParser::Status::Refused) return status;
    if (status == RequestParser::Status::SendContinue) continue;
    if (bytes.empty()) return status;
    const std::span<char> space = parser.read_space();
    const size_t count = std::min(space.size(), bytes.size());
    std::memcpy(space.data(), bytes.data(), count);
    parser.commit(count);
    bytes.remove_prefix(count);
  }
}

// The bodies of every connection share one budget, each body counted as it arrives (decoded) and until its request
// is dropped: past it a body is refused with 503, the others untouched; a budget given back takes bodies again.
TEST(HttpRequestParser, TheBodiesOfAllConnectionsShareOneBudget) {
  const auto budget = std::make_shared<BodyBudget>(100 << 10);
  const std::string body(60'000, 'x');
  std::optional<HttpRequest> held;
  {
    RequestParser first(kLimits, budget), second(kLimits, budget);
    ASSERT_EQ(feed(first, post(body)), RequestParser::Status::Complete);
    held = first.take();
    EXPECT_EQ(held->body, body);
    EXPECT_EQ(budget->bytes_held(), body.size());
    ASSERT_EQ(feed(second, post(body)), RequestParser::Status::Refused);
    EXPECT_EQ(second.refusal().status, 503);
    EXPECT_EQ(second.refusal().message,
              "the server holds too many request bodies at once (over 100 KiB in all); retry later");
    // Small bodies still fit beside the one held.
    RequestParser third(kLimits, budget);
    ASSERT_EQ(feed(third, post("{}")), RequestParser::Status::Complete);
    EXPECT_EQ(third.take().body, "{}");
  }
  EXPECT_EQ(budget->bytes_held(), body.size());  // the refused and the finished connections gave theirs back
  held.reset();
  EXPECT_EQ(budget->bytes_held(), 0u);
  RequestParser fourth(kLimits, budget);
  ASSERT_EQ(feed(fourth, post(body)), RequestParser::Status::Complete);
  // A gzip body counts by its decoded size: 200 KiB of zeros in a few hundred bytes.
  RequestParser fifth(kLimits, budget);
  const std::string bomb = compressed(std::string(200 << 10, '\0'), 31);
  ASSERT_EQ(feed(fifth, post(bomb, "Content-Encoding: gzip\r\n")), RequestParser::Status::Refused);
  EXPECT_EQ(fifth.refusal().status, 503);
}

// The limit holds for the body once decoded: a small gzip or deflate body that inflates past it is refused.
TEST(HttpRequestParser, AGzipOrDeflateBodyIsDecodedAndItsDecodedSizeLimited) {
  const std::string text = R"({"model": "m", "prompt": "hello"})";
  for (const auto& [name, bits] : {std::pair{"gzip", 31}, std::pair{"x-gzip", 31}, std::pair{"deflate", 15}}) {
    const ParsedRequests parsed =
        parse_http_requests(post(compressed(text, bits), fmt::format("Content-Encoding: {}\r\n", name)), kLimits, 5);
    ASSERT_EQ(parsed.requests.size(), 1u) << name;
    EXPECT_EQ(parsed.requests[0].body, text) << name;
  }
  const std::string zeros(128 << 20, '\0');  // the bomb: 128 MiB of zeros
  for (const auto& [name, bits] : {std::pair{"gzip", 31}, std::pair{"deflate", 15}}) {
    const std::string bomb = compressed(zeros, bits);
    ASSERT_LT(bomb.size(), 200u << 10);
    const HttpRefusal refusal = refusal_of(post(bomb, fmt::format("Content-Encoding: {}\r\n", name)));
    EXPECT_EQ(refusal.status, 413) << name;
    EXPECT_EQ(refusal.message,
              fmt::format("the request body is too large once decoded (over 16 MiB, Content-Encoding {})", name));
    // Chunked framing changes nothing.
    const std::string coding = fmt::format("Content-Encoding: {}\r\n", name);
    EXPECT_EQ(refusal_of(chunked({bomb.substr(0, 1000), bomb.substr(1000)}, "", coding)).status, 413);
  }
}

TEST(HttpRequestParser, ABadlyEncodedBodyIs400AndAnUnknownEncoding415) {
  const std::string gzip = compressed("hello", 31);
  EXPECT_EQ(refusal_of(post("not gzip at all", "Content-Encoding: gzip\r\n")).status, 400);
  const HttpRefusal truncated = refusal_of(post(gzip.substr(0, gzip.size() - 4), "Content-Encoding: gzip\r\n"));
  EXPECT_EQ(truncated.status, 400);
  EXPECT_EQ(truncated.message, "the request body ends inside its gzip stream");
  EXPECT_EQ(refusal_of(post(gzip + "more", "Content-Encoding: gzip\r\n")).status, 400);
  const HttpRefusal brotli = refusal_of(post("x", "Content-Encoding: br\r\n"));
  EXPECT_EQ(brotli.status, 415);
  EXPECT_EQ(brotli.message, "Content-Encoding 'br' is not supported: send identity, gzip or deflate");
  EXPECT_EQ(refusal_of(post("x", "Content-Encoding: gzip, gzip\r\n")).status, 415);
  EXPECT_EQ(parse_http_requests(post("x", "Content-Encoding: identity\r\n"), kLimits).requests.at(0).body, "x");
}

// Refused at once, from the header alone: no body byte needs to arrive.
TEST(HttpRequestParser, ANegativeOrHugeContentLengthIsRefusedFromTheHeader) {
  const auto header = [](const std::string& length) {
    return "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + "\r\n\r\n";
  };
  EXPECT_EQ(refusal_of(header("-1")).status, 400);
  EXPECT_EQ(refusal_of(header("1000000000000000000")).status, 413);
  EXPECT_EQ(refusal_of(header("99999999999999999999999999")).status, 400);
  EXPECT_EQ(refusal_of(header("12abc")).status, 400);
  EXPECT_EQ(refusal_of(header("5, 6")).status, 400);
  EXPECT_EQ(refusal_of(header(std::to_string((16 << 20) + 1))).status, 413);
}

TEST(HttpRequestParser, TooManyOrTooLargeHeadersAre431) {
  std::string fields;
  for (int i = 0; i < 101; ++i) fields += fmt::format("X-Field-{}: {}\r\n", i, i);
  const HttpRefusal many = refusal_of("GET /health HTTP/1.1\r\n" + fields + "\r\n");
  EXPECT_EQ(many.status, 431);
  EXPECT_EQ(many.message, "the request has too many header fields (over 100)");
  const HttpRefusal large = refusal_of("GET /health HTTP/1.1\r\nX-Big: " + std::string(70 << 10, 'a') + "\r\n\r\n");
  EXPECT_EQ(large.status, 431);
  EXPECT_EQ(large.message, "the request header is too large (over 64 KiB)");
  // Trailer fields count with the header's.
  std::string trailers;
  for (int i = 0; i < 100; ++i) trailers += fmt::format("X-T-{}: {}\r\n", i, i);
  EXPECT_EQ(refusal_of(chunked({"x"}, trailers)).status, 431);
}

// Two million header fields (89 MiB): refused once the first 64 KiB are read, the rest never looked at.
TEST(HttpRequestParser, TwoMillionHeadersAreRefusedAfterTheLimit) {
  std::string request = "GET /health HTTP/1.1\r\n";
  for (int i = 0; i < 2'000'000; ++i) request += "X-Flood-Header-Number: 1234567890123456\r\n";
  RequestParser parser(kLimits);
  size_t fed = 0;
  RequestParser::Status status = parser.parse();
  while (status == RequestParser::Status::NeedMore && fed < request.size()) {
    const std::span<char> space = parser.read_space();
    const size_t count = std::min(space.size(), request.size() - fed);
    std::memcpy(space.data(), request.data() + fed, count);
    parser.commit(count);
    fed += count;
    status = parser.parse();
  }
  EXPECT_EQ(status, RequestParser::Status::Refused);
  EXPECT_EQ(parser.refusal().status, 431);
  EXPECT_LE(fed, kLimits.max_header_bytes + (8 << 10));
}

TEST(HttpRequestParser, AChunkSizeLineThatNeverEndsIsRefusedWithinTheBuffer) {
  const std::string start = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=";
  const ParsedRequests parsed = parse_http_requests(start + std::string(1 << 20, 'a'), kLimits);
  ASSERT_TRUE(parsed.refusal);
  EXPECT_EQ(parsed.refusal->status, 431);
}

TEST(HttpRequestParser, FramingItCannotTrustIsRefused) {
  const std::string start = "POST / HTTP/1.1\r\nHost: x\r\n";
  EXPECT_EQ(refusal_of(start + "Transfer-Encoding: gzip\r\n\r\n").status, 400);
  EXPECT_EQ(refusal_of(start + "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n").status, 501);
  EXPECT_EQ(refusal_of(start + "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n").status, 400);
  EXPECT_EQ(refusal_of(start + "Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd").status, 400);
  EXPECT_EQ(refusal_of("GARBAGE\r\n\r\n").status, 400);
  EXPECT_EQ(refusal_of("GET / HTTP/1.1\r\nBad Header\r\n\r\n").status, 400);
  EXPECT_EQ(refusal_of(start + "Expect: something\r\nContent-Length: 1\r\n\r\nx").status, 417);
}

TEST(HttpRequestParser, Expect100ContinueIsAskedForBeforeTheBody) {
  RequestParser parser(kLimits);
  const std::string header = "POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n";
  std::memcpy(parser.read_space().data(), header.data(), header.size());
  parser.commit(header.size());
  EXPECT_EQ(parser.parse(), RequestParser::Status::SendContinue);
  EXPECT_EQ(parser.parse(), RequestParser::Status::NeedMore);
  std::memcpy(parser.read_space().data(), "ok", 2);
  parser.commit(2);
  ASSERT_EQ(parser.parse(), RequestParser::Status::Complete);
  EXPECT_EQ(parser.take().body, "ok");
}

}  // namespace
}  // namespace jambo::server
