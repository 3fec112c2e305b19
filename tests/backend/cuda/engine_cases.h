// The models and weight modes the CUDA engine tests run: the demo model or a fixture by name, in one weight mode.
#pragma once

#include "support/engine_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

namespace jambo::testing {

struct EngineCase {
  std::string model;  // "jambo-demo" or a folder of tests/fixtures/models
  engine::CudaWeights weights;
};

inline model::Model load_case_model(const std::string& name) {
  return name == "jambo-demo" ? model::load_model(std::string(JAMBO_SOURCE_DIR) + "/models/jambo-demo")
                              : load_fixture_model(name);
}

// "jambo_demo_bf16": a test name of the case.
inline std::string engine_case_name(const ::testing::TestParamInfo<EngineCase>& info) {
  std::string name = info.param.model + "_" + std::string(engine::name(info.param.weights));
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

}  // namespace jambo::testing
