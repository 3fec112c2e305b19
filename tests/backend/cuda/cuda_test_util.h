// Helpers of the CUDA tests: a fixture base that skips without a GPU (and fails instead when
// JAMBO_REQUIRE_GPU=1, as scripts/gpu-test sets), copies to and from the GPU, and the models every test runs on.
#pragma once

#include "support/sequences.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_memory.h"
#include "model/config.h"
#include "model/weights.h"

#include <cuda_runtime_api.h>
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
    if (!::jambo::backend::cuda::cuda_device_available()) {                                                               \
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

// A GPU test with a stream of its own, destroyed after the test body's buffers.
class StreamTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

// count values from the host in a new device buffer.
template <typename T>
backend::cuda::DeviceBuffer<T> upload(const T* values, int64_t count) {
  backend::cuda::DeviceBuffer<T> buffer(count);
  EXPECT_EQ(cudaMemcpy(buffer.data(), values, size_t(count) * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return buffer;
}

// count values from the device.
template <typename T>
std::vector<T> download(const T* values, int64_t count) {
  std::vector<T> out(static_cast<size_t>(count));
  EXPECT_EQ(cudaMemcpy(out.data(), values, size_t(count) * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

// The Jamba-Reasoning-3B shape (bench/shapes/jamba-reasoning-3b: hidden 2560, 28 layers, attention at 7 and 21,
// MQA, dense MLP), for tests at production size.
inline model::JambaConfig reasoning_3b_config() {
  return model::load_config(std::string(JAMBO_SOURCE_DIR) + "/bench/shapes/jamba-reasoning-3b/config.json");
}

// That shape with random bf16 weights (seed 3), as the law-3 and bf16 decode tests run it.
inline model::Model reasoning_3b_model() { return make_random_model(reasoning_3b_config(), DType::BF16, 3); }

// The committed fixture checkpoints (tests/fixtures/models/*/config.json).
inline std::vector<std::string> fixture_model_names() {
  std::vector<std::string> names;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(JAMBO_SOURCE_DIR) + "/tests/fixtures/models"))
    if (std::filesystem::exists(entry.path() / "config.json")) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

inline model::Model load_fixture(const std::string& name) {
  return model::load_model(std::string(JAMBO_SOURCE_DIR) + "/tests/fixtures/models/" + name);
}

}  // namespace jambo::testing
