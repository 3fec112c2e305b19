// Law 3 on the GPU: a state pool of more than 2^32 elements (about 17 GB of fp32, 8.6 GB of bf16), a request in
// its top slot, whose state lies past element 2^32, gives exactly the logprobs of the same request in slot 0; for
// a small test model and for the Jamba-Reasoning-3B shape, whose state is also tried in bf16 (past byte 2^33), and
// whose weights are also run in the bf16 mode, the kernels that production runs (the skinny GEMMs, whose conv
// epilogue writes the slot's tail at decode, and the tensor-core attention).
#include "support/sequences.h"
#include "support/test_models.h"
#include "cuda_test_util.h"
#include "model/config.h"

#include <cuda_runtime_api.h>

#include <cstdio>

namespace jambo::testing {
namespace {

class CudaLaw3Test : public GpuTest {};

// A request in the top slot of a pool past 2^32 elements against the same request in slot 0: prefill, a
// decode that reads the slot, a continuing chunk.
void expect_top_slot_equals_slot_zero(const model::Model& model, const char* name, DType state_dtype = DType::F32,
                                      const std::string& weights = "f32") {
  const int64_t slot_size = backend::cuda::make_cuda_backend(model, test_cache(1), weights)->state_elements_per_slot();
  const int64_t num_slots = (int64_t(1) << 32) / slot_size + 2;
  const int64_t pool_bytes = num_slots * slot_size * dtype_size(state_dtype);
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  if (int64_t(free_bytes) < pool_bytes + (int64_t(1) << 30)) {
    if (gpu_required() && total_bytes > size_t(40) << 30)
      FAIL() << "the GPU has " << free_bytes << " bytes free; the test needs " << pool_bytes;
    GTEST_SKIP() << "a state pool past 2^32 elements needs " << pool_bytes << " bytes of GPU memory";
  }
  backend::CacheConfig cache{num_slots, 2 * kMaxBlocksPerSequence, kBlockSize, state_dtype};
  auto backend = backend::cuda::make_cuda_backend(model, cache, weights);
  const int64_t top_slot = num_slots - 1;
  ASSERT_GT(top_slot * slot_size, int64_t(1) << 32) << "the top slot must start past element 2^32";
  std::printf("[cuda law3] %s, %s weights, %s state: pool of %lld elements, top slot %lld at element %lld\n", name,
              weights.c_str(), std::string(dtype_name(state_dtype)).c_str(), (long long)(num_slots * slot_size),
              (long long)top_slot, (long long)(top_slot * slot_size));

  const std::vector<int32_t> tokens = random_tokens(12, model.config.vocab_size, 10);
  Sequence low(0, tokens), high(1, tokens);
  high.slot = top_slot;
  Logits low_logits, high_logits;
  for (const int64_t chunk : {5, 1, 6}) {
    step(*backend, {&low}, {chunk}, {&low_logits});
    step(*backend, {&high}, {chunk}, {&high_logits});
  }
  ASSERT_EQ(low_logits.size(), high_logits.size());
  for (size_t p = 0; p < low_logits.size(); ++p) EXPECT_EQ(low_logits[p], high_logits[p]) << "position " << p;
}

TEST_F(CudaLaw3Test, TopSlotPastTwoToThe32EqualsSlotZero) {
  expect_top_slot_equals_slot_zero(make_random_model(test_model_specs()[0].config, DType::F32, 9), "test model");
}

// The Jamba-Reasoning-3B shape (hidden 2560, 28 layers, attention at 7 and 21, MQA, dense MLP),
// random bf16 weights.
TEST_F(CudaLaw3Test, ReasoningThreeBShapeTopSlotEqualsSlotZero) {
  expect_top_slot_equals_slot_zero(reasoning_3b_model(), "Reasoning-3B shape");
}

TEST_F(CudaLaw3Test, ReasoningThreeBShapeBf16StateTopSlotEqualsSlotZero) {
  expect_top_slot_equals_slot_zero(reasoning_3b_model(), "Reasoning-3B shape", DType::BF16);
}

TEST_F(CudaLaw3Test, ReasoningThreeBShapeBf16WeightsTopSlotEqualsSlotZero) {
  expect_top_slot_equals_slot_zero(reasoning_3b_model(), "Reasoning-3B shape", DType::F32, "bf16");
}

}  // namespace
}  // namespace jambo::testing
