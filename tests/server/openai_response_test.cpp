// How the server answers an exception thrown while it answers a request: bad input is the caller's (400, or the
// ApiError's own status and field), anything else is a bug in jambo (500).
#include "server/openai_response.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace jambo::server {
namespace {

template <typename Exception>
ApiError answer_to(const Exception& exception) {
  return api_error_for(std::make_exception_ptr(exception));
}

TEST(ApiErrorFor, AnApiErrorKeepsItsStatusTypeAndField) {
  const ApiError error = answer_to(ApiError(429, "full", "", "rate_limit_exceeded"));
  EXPECT_EQ(error.status, 429);
  EXPECT_EQ(error.type, "rate_limit_exceeded");
  EXPECT_STREQ(error.what(), "full");
  EXPECT_EQ(answer_to(ApiError(400, "'n': too large", "n")).param, "n");
}

TEST(ApiErrorFor, BadInputIsA400) {
  const ApiError error = answer_to(Error("request 'x': the prompt is empty"));
  EXPECT_EQ(error.status, 400);
  EXPECT_EQ(error.type, "invalid_request_error");
  EXPECT_STREQ(error.what(), "request 'x': the prompt is empty");
}

TEST(ApiErrorFor, AnInternalErrorIsA500) {
  try {
    JAMBO_ASSERT(1 + 1 == 3);
    FAIL() << "JAMBO_ASSERT did not throw";
  } catch (...) {
    const ApiError error = api_error_for(std::current_exception());
    EXPECT_EQ(error.status, 500);
    EXPECT_EQ(error.type, "server_error");
    EXPECT_EQ(error.param, "");
    EXPECT_NE(std::string(error.what()).find("internal error at "), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("'1 + 1 == 3' does not hold"), std::string::npos) << error.what();
  }
}

TEST(ApiErrorFor, AnyOtherExceptionIsA500) {
  const ApiError error = answer_to(std::out_of_range("map::at"));
  EXPECT_EQ(error.status, 500);
  EXPECT_EQ(error.type, "server_error");
  EXPECT_STREQ(error.what(), "internal error: map::at");
  EXPECT_EQ(api_error_for(std::make_exception_ptr(42)).status, 500);
}

}  // namespace
}  // namespace jambo::server
