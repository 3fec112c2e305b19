// The batched reference path (compare, stress) on the CUDA backend: its logprobs within 1e-4 of the CPU
// backend's (f32 mode) for packed steps that reuse slots, one-token rows and a sequence alone over the step
// budget; and `jambo stress` with engine and reference both on the GPU flags nothing on a correct engine and
// flags the injected decode-before-prefill bug.
#include "support/forensics_test_util.h"
#include "cuda_test_util.h"
#include "forensics/reference_scorer.h"

namespace jambo::testing {
namespace {

class CudaReferenceTest : public GpuTest {};

TEST_F(CudaReferenceTest, BatchedReferenceMatchesTheCpuBackend) {
  const model::Model model = load_fixture_model();
  const std::vector<std::vector<int32_t>> sequences = mixed_reference_sequences(model.config.vocab_size);
  forensics::ReferenceOptions options;
  options.max_step_tokens = 48;
  options.max_step_rows = 3;
  const std::vector<std::vector<double>> cpu = score_sequences(model, sequences, options);
  options.backend = engine::BackendKind::Cuda;
  const std::vector<std::vector<double>> gpu = score_sequences(model, sequences, options);
  ASSERT_EQ(cpu.size(), gpu.size());
  double worst = 0.0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_EQ(cpu[i].size(), gpu[i].size()) << "sequence " << i;
    for (size_t t = 0; t < cpu[i].size(); ++t) worst = std::max(worst, std::fabs(cpu[i][t] - gpu[i][t]));
  }
  std::printf("[cuda reference vs cpu reference] max |dlogprob| = %.3g\n", worst);
  EXPECT_LT(worst, 1e-4);
}

TEST_F(CudaReferenceTest, StressOnTheGpuFlagsOnlyTheInjectedBug) {
  const model::Model model = load_fixture_model();
  const forensics::StressResult clean = run_small_stress(model, {}, engine::BackendKind::Cuda);
  EXPECT_EQ(clean.comparison.num_flagged(), 0);
  EXPECT_GT(clean.counters.slot_reuses, 10);
  std::printf("[cuda stress] %zu samples, worst max |dlogprob| = %.3g\n", clean.comparison.samples.size(),
              clean.comparison.worst()->max_abs_diff);
  engine::EngineFaults faults;
  faults.decode_before_prefill = true;
  EXPECT_GT(run_small_stress(model, faults, engine::BackendKind::Cuda).comparison.num_flagged(), 0);
}

}  // namespace
}  // namespace jambo::testing
