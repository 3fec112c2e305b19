// The models and weight modes the CUDA engine tests run: the demo model or a fixture by name, in one weight mode.
#pragma once

#include "support/engine_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

namespace jambo::testing {

struct EngineCase {
  std::string model;  // "jambo-demo", "reasoning-3b" or a folder of tests/fixtures/models
  engine::CudaWeights weights;
};

// "reasoning-3b": the Jamba-Reasoning-3B shape with random bf16 weights made on the GPU (seed 3).
inline model::Model load_case_model(const std::string& name) {
  if (name == "jambo-demo") return model::load_model(std::string(JAMBO_SOURCE_DIR) + "/models/jambo-demo");
  if (name == "reasoning-3b")
    return model::describe_random_model(
        model::load_config(std::string(JAMBO_SOURCE_DIR) + "/bench/shapes/jamba-reasoning-3b/config.json"),
        DType::BF16, /*seed=*/3);
  return load_fixture_model(name);
}

// "jambo_demo_bf16": a test name of the case.
inline std::string engine_case_name(const ::testing::TestParamInfo<EngineCase>& info) {
  std::string name = info.param.model + "_" + std::string(engine::name(info.param.weights));
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

}  // namespace jambo::testing
