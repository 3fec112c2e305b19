// The CUDA backend's cache operations against their meaning and against the CPU backend: copy_state and
// copy_kv_block (n samples of one prompt), poison_state (law 2), the size of a slot, the row checks, and the
// two injected historical faults, which must behave exactly as on the CPU.
#include "support/sequences.h"
#include "support/test_models.h"
#include "backend/cpu/cpu_backend.h"
#include "cuda_test_util.h"

namespace jambo::testing {
namespace {

model::Model small_model() { return make_random_model(test_model_specs()[0].config, DType::F32, 7); }

std::vector<float> last_logits(backend::Backend& backend, Sequence& sequence, int64_t num_tokens) {
  Logits logits;
  step(backend, {&sequence}, {num_tokens}, {&logits});
  return logits.back();
}

bool all_nan(const std::vector<float>& values) {
  return std::all_of(values.begin(), values.end(), [](float v) { return std::isnan(v); });
}

class CudaStateTest : public GpuTest {
 protected:
  model::Model model_ = small_model();
};

backend::CacheConfig cache_of(int64_t num_sequences, DType state_dtype) {
  backend::CacheConfig cache = test_cache(num_sequences);
  cache.state_dtype = state_dtype;
  return cache;
}

TEST_F(CudaStateTest, SlotSizeEqualsCpuBackend) {
  for (const TestModelSpec& spec : test_model_specs()) {
    const model::Model model = make_random_model(spec.config, spec.dtype, 1);
    EXPECT_EQ(backend::cuda::make_cuda_backend(model, test_cache(2))->state_elements_per_slot(),
              backend::cpu::make_cpu_backend(model, test_cache(2))->state_elements_per_slot())
        << spec.name;
  }
}

// A prompt prefilled once, its state and KV blocks copied to a second sequence: both continue identically.
TEST_F(CudaStateTest, CopiedStateAndBlocksContinueIdentically) {
  for (const DType state_dtype : {DType::F32, DType::BF16}) {
    auto backend = backend::cuda::make_cuda_backend(model_, cache_of(2, state_dtype));
    std::vector<int32_t> tokens = random_tokens(11, model_.config.vocab_size, 3);
    Sequence leader(0, tokens), follower(1, tokens);
    step(*backend, {&leader}, {10});
    backend->copy_state(leader.slot, follower.slot);
    for (int64_t block = 0; block < 3; ++block)  // positions 0..9 lie in blocks 0, 1, 2 (block size 4)
      backend->copy_kv_block(leader.block_table[block], follower.block_table[block]);
    follower.num_computed = 10;
    EXPECT_EQ(last_logits(*backend, leader, 1), last_logits(*backend, follower, 1)) << dtype_name(state_dtype);
  }
}

TEST_F(CudaStateTest, PoisonedSlotShowsAsNanAndIsNeverReadWithoutState) {
  for (const DType state_dtype : {DType::F32, DType::BF16}) {
    auto backend = backend::cuda::make_cuda_backend(model_, cache_of(2, state_dtype));
    std::vector<int32_t> tokens = random_tokens(6, model_.config.vocab_size, 4);
    Sequence first(0, tokens);
    step(*backend, {&first}, {5});
    backend->poison_state(first.slot);
    EXPECT_TRUE(all_nan(last_logits(*backend, first, 1))) << "a read of a poisoned slot must show";

    // Law 1: a new sequence in the poisoned slot starts from zero and never reads it.
    auto clean = backend::cuda::make_cuda_backend(model_, cache_of(2, state_dtype));
    Sequence fresh(0, tokens), reference(0, tokens);
    backend->poison_state(fresh.slot);
    const std::vector<float> from_poisoned = last_logits(*backend, fresh, 1);
    EXPECT_FALSE(all_nan(from_poisoned));
    EXPECT_EQ(from_poisoned, last_logits(*clean, reference, 1)) << dtype_name(state_dtype);
  }
}

TEST_F(CudaStateTest, RejectsRowsAsTheCpuBackendDoes) {
  auto gpu = backend::cuda::make_cuda_backend(model_, test_cache(2));
  auto cpu = backend::cpu::make_cpu_backend(model_, test_cache(2));
  std::vector<int32_t> tokens = random_tokens(4, model_.config.vocab_size, 5);
  Sequence sequence(0, tokens);
  backend::BatchRow row = sequence.row(2, backend::LogitsCopy::Last);
  row.has_initial_state = true;  // law 1: no state at position 0
  auto message = [&](backend::Backend& backend) {
    backend::StepOutput logits;
    try {
      backend.forward({&row, 1}, logits);
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message(*gpu), message(*cpu));
  EXPECT_NE(message(*gpu), "accepted");
  EXPECT_THROW(gpu->copy_kv_block(0, 1 << 20), Error);
  EXPECT_THROW(gpu->copy_state(0, 2), Error);
  EXPECT_THROW(gpu->poison_state(-1), Error);
}

// Both faults give the CUDA backend the CPU backend's (wrong) results, so stress flags them on either.
TEST_F(CudaStateTest, InjectedFaultsBehaveAsOnTheCpu) {
  for (const bool wrap : {false, true}) {
    std::vector<float> results[2];
    for (int b = 0; b < 2; ++b) {
      auto backend = b == 0 ? backend::cpu::make_cpu_backend(model_, test_cache(4))
                            : backend::cuda::make_cuda_backend(model_, test_cache(4));
      backend::FaultInjection faults;
      faults.decode_before_prefill = !wrap;
      faults.state_offset_modulus = wrap ? 2 * backend->state_elements_per_slot() : 0;
      backend->inject_faults(faults);
      Sequence first(0, random_tokens(8, model_.config.vocab_size, 6));
      step(*backend, {&first}, {7});
      // Decode before prefill: a new one-token sequence in slot 0 reads first's state. Offset wrap: slot 2
      // lands on slot 0, so the sequence in slot 2 continues from first's state.
      Sequence second(wrap ? 2 : 0, random_tokens(8, model_.config.vocab_size, 7));
      if (wrap) step(*backend, {&second}, {3});
      results[b] = last_logits(*backend, wrap ? first : second, 1);
    }
    EXPECT_LT(max_logprob_difference(results[0], results[1]), 1e-4) << (wrap ? "offset wrap" : "decode before prefill");
  }
}

}  // namespace
}  // namespace jambo::testing
