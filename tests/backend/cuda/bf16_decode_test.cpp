// The bf16 mode's decode at the Jamba-Reasoning-3B shape, on the engine's default invariant GEMMs, gives one answer:
// the same request run in another slot, or its decode steps run as CUDA graphs rather than launch by launch, gives
// bitwise the same logits. Its kernels
// start early, while the kernel before them still runs (device_math.cuh); a kernel that read its input through the
// read-only path (__ldg) read it stale now and then, and these comparisons caught it where the small test models
// did not (their kernels are too short to overlap).
#include "support/sequences.h"
#include "support/test_models.h"
#include "cuda_test_util.h"

#include <cmath>
#include <cstdio>

namespace jambo::testing {
namespace {

class Bf16DecodeTest : public GpuTest {
 protected:
  // Bitwise equal logits; prints the first differing position (-1: none) and the largest difference.
  static void expect_equal(const Logits& expected, const Logits& actual, const std::string& what) {
    ASSERT_EQ(expected.size(), actual.size()) << what;
    int64_t first = -1;
    double worst = 0.0;
    for (size_t p = 0; p < expected.size(); ++p) {
      double difference = 0.0;
      for (size_t i = 0; i < expected[p].size(); ++i)
        difference = std::max(difference, double(std::fabs(expected[p][i] - actual[p][i])));
      if (difference > 0.0 && first < 0) first = int64_t(p);
      worst = std::max(worst, difference);
    }
    std::printf("[cuda bf16 decode] %s: %zu positions, first differing %lld, worst |dlogit| %g\n", what.c_str(),
                expected.size(), static_cast<long long>(first), worst);
    EXPECT_EQ(first, -1) << what << ": logits differ from position " << first << " on (worst " << worst << ")";
  }

  // One request in slot 0 and again in slot 1, their steps interleaved: a prefill, decodes, a continuing chunk.
  static void expect_slots_agree(bool decode_graphs, const std::string& what) {
    const model::Model model = reasoning_3b_model();
    auto backend = backend::cuda::make_cuda_backend(model, test_cache(2), "bf16", decode_graphs, /*invariant_gemm=*/true);
    const std::vector<int32_t> tokens = random_tokens(12, model.config.vocab_size, 10);
    Sequence first(0, tokens), second(1, tokens);
    Logits first_logits, second_logits;
    for (const int64_t chunk : {5, 1, 1, 1, 1, 3}) {
      step(*backend, {&first}, {chunk}, {&first_logits});
      step(*backend, {&second}, {chunk}, {&second_logits});
    }
    expect_equal(first_logits, second_logits, what);
  }
};

TEST_F(Bf16DecodeTest, SlotOneEqualsSlotZeroLaunchByLaunch) {
  expect_slots_agree(/*decode_graphs=*/false, "slot 1 against slot 0, launch by launch");
}

TEST_F(Bf16DecodeTest, SlotOneEqualsSlotZeroAsGraphs) {
  expect_slots_agree(/*decode_graphs=*/true, "slot 1 against slot 0, decode steps as CUDA graphs");
}

TEST_F(Bf16DecodeTest, GraphsEqualLaunchByLaunch) {
  const model::Model model = reasoning_3b_model();
  auto eager = backend::cuda::make_cuda_backend(model, test_cache(1), "bf16", /*decode_graphs=*/false,
                                                /*invariant_gemm=*/true);
  auto graphed = backend::cuda::make_cuda_backend(model, test_cache(1), "bf16", /*decode_graphs=*/true,
                                                  /*invariant_gemm=*/true);
  const std::vector<int32_t> tokens = random_tokens(12, model.config.vocab_size, 10);
  const std::vector<int64_t> chunks = {5, 1, 1, 1, 1, 3};
  expect_equal(run_in_chunks(*eager, Sequence(0, tokens), chunks), run_in_chunks(*graphed, Sequence(0, tokens), chunks),
               "decode steps as CUDA graphs against launch by launch");
}

}  // namespace
}  // namespace jambo::testing
