// Helpers of the CUDA tests: a fixture base that skips without a GPU (and fails instead when
// JAMBO_REQUIRE_GPU=1, as scripts/gpu-test sets), logprob comparisons, and the models every test runs on.
#pragma once

#include "backend/cuda/cuda_backend.h"
#include "model/weights.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace jambo::testing {

inline bool gpu_required() {
  const char* value = std::getenv("JAMBO_REQUIRE_GPU");
  return value != nullptr && std::string(value) == "1";
}

// Skips the test without a usable GPU, or fails it when the environment demands one.
#define JAMBO_SKIP_WITHOUT_GPU()                                                                           \
  do {                                                                                                     \
    if (!::jambo::cuda_device_available()) {                                                               \
      if (::jambo::testing::gpu_required()) FAIL() << "JAMBO_REQUIRE_GPU=1 but no CUDA device is visible"; \
      GTEST_SKIP() << "no CUDA device is visible (set JAMBO_REQUIRE_GPU=1 to make this a failure)";        \
    }                                                                                                      \
  } while (0)

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override { JAMBO_SKIP_WITHOUT_GPU(); }
};

template <typename Param>
class GpuParamTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override { JAMBO_SKIP_WITHOUT_GPU(); }
};

// log softmax in double.
inline std::vector<double> log_softmax(std::span<const float> logits) {
  double max_logit = -INFINITY;
  for (float v : logits) max_logit = std::max(max_logit, double(v));
  double total = 0.0;
  for (float v : logits) total += std::exp(double(v) - max_logit);
  std::vector<double> out;
  for (float v : logits) out.push_back(double(v) - max_logit - std::log(total));
  return out;
}

// max over entries of |log_softmax(a) - log_softmax(b)|; infinity when any is not finite.
inline double max_logprob_difference(std::span<const float> a, std::span<const float> b) {
  EXPECT_EQ(a.size(), b.size());
  const std::vector<double> la = log_softmax(a), lb = log_softmax(b);
  double worst = 0.0;
  for (size_t i = 0; i < la.size(); ++i) {
    const double difference = std::fabs(la[i] - lb[i]);
    if (!std::isfinite(difference)) return INFINITY;
    worst = std::max(worst, difference);
  }
  return worst;
}

// The committed fixture checkpoints (tests/fixtures/models/*/config.json).
inline std::vector<std::string> fixture_model_names() {
  std::vector<std::string> names;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(JAMBO_SOURCE_DIR) + "/tests/fixtures/models"))
    if (std::filesystem::exists(entry.path() / "config.json")) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

inline Model load_fixture(const std::string& name) {
  return load_model(std::string(JAMBO_SOURCE_DIR) + "/tests/fixtures/models/" + name);
}

}  // namespace jambo::testing
