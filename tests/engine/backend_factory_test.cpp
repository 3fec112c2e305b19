// make_backend's guard: the CPU backend reads weights from host memory, so a model whose random weights are only
// described (for the GPU to generate) is refused with a message saying so, before any read.
#include "engine/backend_factory.h"
#include "support/sequences.h"
#include "support/test_models.h"

namespace jambo::testing {
namespace {

TEST(BackendFactory, CpuBackendRefusesAModelWithoutHostData) {
  const Model described = describe_random_model(small_config(), DType::BF16, 5);
  try {
    make_backend("cpu", described, test_cache(1));
    FAIL() << "expected jambo::Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("the CPU backend reads the weights from host memory"), std::string::npos)
        << error.what();
  }
  // Counting the bytes a backend holds reads no weights: it works on a described model.
  EXPECT_EQ(backend_weight_bytes("cpu", described),
            make_random_model(small_config(), DType::BF16, 5).weights.bytes_total);
}

}  // namespace
}  // namespace jambo::testing
