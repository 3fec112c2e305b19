// The request contract: validate() names the first field out of range by its wire name, for every field, and
// accepts every value at the edges of its range.
#include "engine/request_spec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>

namespace jambo::engine {
namespace {

RequestLimits limits() { return {/*vocab_size=*/100, /*max_model_len=*/64, /*max_n=*/8, /*has_tokenizer=*/true}; }

RequestSpec good() {
  RequestSpec spec;
  spec.id = "r";
  spec.prompt_ids = {1, 2, 3};
  spec.stop.max_tokens = 10;
  return spec;
}

// The field validate names for a spec changed by `edit` ("" when it passes).
std::string rejected_field(const std::function<void(RequestSpec&)>& edit, RequestLimits under = limits()) {
  RequestSpec spec = good();
  edit(spec);
  const std::optional<FieldError> error = validate(spec, under);
  if (error) {
    EXPECT_FALSE(error->message.empty()) << error->field;
  }
  return error ? error->field : "";
}

TEST(RequestSpec, AGoodRequestPasses) {
  EXPECT_EQ(rejected_field([](RequestSpec&) {}), "");
}

TEST(RequestSpec, EachFieldOutOfRangeIsNamed) {
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.prompt_ids.clear(); }), "prompt");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.prompt_ids = {1, 100}; }), "prompt");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.prompt_ids = {-1}; }), "prompt");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.prompt_ids.assign(65, 1); }), "prompt");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.n = 0; }), "n");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.n = 9; }), "n");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.sampling.temperature = -0.1; }), "temperature");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.sampling.temperature = NAN; }), "temperature");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.sampling.temperature = INFINITY; }), "temperature");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.sampling.top_k = -1; }), "top_k");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.sampling.top_p = 0.0; }), "top_p");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.sampling.top_p = 1.01; }), "top_p");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.sampling.top_p = NAN; }), "top_p");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.sampling.min_p = -0.01; }), "min_p");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.sampling.min_p = 1.01; }), "min_p");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.stop.max_tokens = -1; }), "max_tokens");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.stop.max_tokens = 62; }), "max_tokens");  // 3 + 62 > 64
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.stop.token_ids = {100}; }), "stop_token_ids");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.stop.strings = {""}; }), "stop");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.stop.strings.assign(kMaxStopStrings + 1, "x"); }), "stop");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.stop.strings = {std::string(kMaxStopLength + 1, 'x')}; }), "stop");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.num_top_logprobs = -1; }), "logprobs");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.num_top_logprobs = kMaxLogprobs + 1; }), "logprobs");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.num_prompt_logprobs = -1; }), "prompt_logprobs");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.num_prompt_logprobs = kMaxLogprobs + 1; }), "prompt_logprobs");
  RequestLimits no_tokenizer = limits();
  no_tokenizer.has_tokenizer = false;
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.stop.strings = {"x"}; }, no_tokenizer), "stop");
}

TEST(RequestSpec, TheEdgesOfEachRangePass) {
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.prompt_ids = {0, 99}; }), "");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.n = 8; }), "");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.sampling.temperature = 0.0; }), "");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.sampling.top_p = 1.0; }), "");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.sampling.min_p = 1.0; }), "");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.stop.max_tokens = 61; }), "");  // 3 + 61 == 64
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.stop.max_tokens = 0; }), "");
  EXPECT_EQ(
      rejected_field([](RequestSpec& s) { s.stop.strings.assign(kMaxStopStrings, std::string(kMaxStopLength, 'x')); }),
      "");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.num_top_logprobs = kMaxLogprobs; }), "");
  EXPECT_EQ(rejected_field([](RequestSpec& s) { s.num_prompt_logprobs = 0; }), "");
}

}  // namespace
}  // namespace jambo::engine
