// The GPU logits outputs (cuda/logits_outputs, cuda/logits_ops) against their CPU twin (backend/logits_ops) on
// the same logits: target logprobs with top-K, greedy and seeded choices under temperature, top_k, top_p and
// min_p (the draw walks the same mass, so the tokens are equal), choices the kernels hand back to the host
// (top_k over 1024, a nucleus wider than the candidates), ties, -inf logits, a NaN vector, copies asked for,
// and vocabularies smaller and larger than a block.
#include "backend/cuda/logits_outputs.h"
#include "backend/logits_ops.h"
#include "cuda_test_util.h"

#include <random>

namespace jambo::testing {
namespace {

constexpr double kLogprobTolerance = 1e-9;  // double sums in another order

struct Case {
  std::vector<backend::BatchRow> rows;
  std::vector<std::vector<int32_t>> tokens, targets;
  std::vector<std::vector<backend::TokenChoice>> choices;
};

// Peaked logits (a few tokens hold most of the mass) or flat ones (the nucleus spans thousands of tokens).
std::vector<float> random_logits(int64_t count, double spread, std::mt19937_64& random) {
  std::normal_distribution<float> normal(0.0f, float(spread));
  std::vector<float> values(static_cast<size_t>(count));
  for (float& value : values) value = normal(random);
  return values;
}

std::vector<backend::TokenChoice> choice_mix(std::mt19937_64& random) {
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<backend::TokenChoice> choices;
  const auto add = [&](double temperature, int64_t top_k, double top_p, double min_p, int64_t num_top) {
    backend::TokenChoice choice;
    choice.temperature = temperature;
    choice.top_k = top_k;
    choice.top_p = top_p;
    choice.min_p = min_p;
    choice.num_top_logprobs = num_top;
    if (temperature > 0.0) choice.uniform = unit(random);
    choices.push_back(choice);
  };
  add(0.0, 0, 1.0, 0.0, 0);     // greedy
  add(0.0, 0, 1.0, 0.0, 20);    // greedy with the top 20
  add(1.0, 0, 1.0, 0.0, 0);     // plain sampling in id order
  add(0.7, 0, 1.0, 0.05, 3);    // with min_p
  add(0.8, 0, 0.95, 0.0, 5);    // nucleus
  add(1.3, 40, 1.0, 0.0, 0);    // top_k
  add(1.0, 1024, 0.9, 0.0, 2);  // the widest top_k on the GPU, with top_p
  add(1.0, 2000, 1.0, 0.0, 1);  // top_k past the GPU's candidates: chosen on the host
  add(0.5, 1, 1.0, 0.0, 0);     // top_k 1 is greedy
  return choices;
}

// Rows of 1 to 5 tokens over one logits buffer: some score targets with top-K, some choose, some copy. Six rows
// make fewer than 32 vectors (each vector's statistics split over several blocks), forty make more (one block each).
Case make_case(int64_t vocab_size, std::mt19937_64& random, int64_t num_rows = 6) {
  Case c;
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t num_tokens = 1 + r % 5;
    c.tokens.emplace_back(static_cast<size_t>(num_tokens), 1);
    c.targets.emplace_back();
    if (r % 2 == 0)
      for (int64_t i = 0; i < num_tokens - 1; ++i) c.targets.back().push_back(int32_t(random() % uint64_t(vocab_size)));
    c.choices.push_back(r == 3 ? std::vector<backend::TokenChoice>{} : choice_mix(random));
  }
  for (size_t r = 0; r < c.tokens.size(); ++r) {
    backend::BatchRow row;
    row.sequence_id = int64_t(r);
    row.tokens = c.tokens[r];
    row.targets = c.targets[r];
    row.num_top_logprobs = r == 2 ? 7 : 0;
    row.choices = c.choices[r];
    row.copy_logits = r == 4   ? backend::LogitsCopy::All
                      : r == 5 ? backend::LogitsCopy::Last
                               : backend::LogitsCopy::None;
    c.rows.push_back(row);
  }
  return c;
}

int64_t num_vectors(const std::vector<backend::BatchRow>& rows) {
  int64_t count = 0;
  for (const backend::BatchRow& row : rows) count += computes_all_vectors(row) ? int64_t(row.tokens.size()) : 1;
  return count;
}

// Equal infinities (a -inf logit's logprob) or within the tolerance.
void expect_same_logprob(double gpu, double cpu, const std::string& what) {
  if (std::isinf(gpu) || std::isinf(cpu))
    EXPECT_EQ(gpu, cpu) << what;
  else
    EXPECT_NEAR(gpu, cpu, kLogprobTolerance) << what;
}

void expect_same_top(const std::vector<backend::TokenLogprob>& gpu, const std::vector<backend::TokenLogprob>& cpu,
                     const char* what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  for (size_t i = 0; i < gpu.size(); ++i) {
    EXPECT_EQ(gpu[i].token, cpu[i].token) << what << " entry " << i;
    expect_same_logprob(gpu[i].logprob, cpu[i].logprob, std::string(what) + " entry " + std::to_string(i));
  }
}

void expect_same_output(const backend::StepOutput& gpu, const backend::StepOutput& cpu) {
  ASSERT_EQ(gpu.rows.size(), cpu.rows.size());
  for (size_t r = 0; r < gpu.rows.size(); ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    const backend::RowOutput& g = gpu.rows[r];
    const backend::RowOutput& c = cpu.rows[r];
    EXPECT_EQ(g.finite, c.finite);
    ASSERT_EQ(g.target_logprobs.size(), c.target_logprobs.size());
    for (size_t i = 0; i < g.target_logprobs.size(); ++i)
      expect_same_logprob(g.target_logprobs[i], c.target_logprobs[i], "target " + std::to_string(i));
    ASSERT_EQ(g.target_top_logprobs.size(), c.target_top_logprobs.size());
    for (size_t i = 0; i < g.target_top_logprobs.size(); ++i)
      expect_same_top(g.target_top_logprobs[i], c.target_top_logprobs[i], "target top");
    ASSERT_EQ(g.chosen.size(), c.chosen.size());
    for (size_t i = 0; i < g.chosen.size(); ++i) {
      EXPECT_EQ(g.chosen[i].token, c.chosen[i].token) << "choice " << i;
      expect_same_logprob(g.chosen[i].logprob, c.chosen[i].logprob, "choice " + std::to_string(i));
      expect_same_top(g.chosen[i].top_logprobs, c.chosen[i].top_logprobs, "choice top");
    }
  }
  EXPECT_EQ(gpu.first_vector, cpu.first_vector);
  EXPECT_EQ(gpu.values, cpu.values);  // copies are the logits themselves
}

void expect_gpu_equals_cpu(const Case& c, const std::vector<float>& logits, int64_t vocab_size) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  backend::cuda::DeviceBuffer<float> device(int64_t(logits.size()));
  ASSERT_EQ(cudaMemcpy(device.data(), logits.data(), logits.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  backend::cuda::LogitsOutputs outputs;
  backend::StepOutput gpu, cpu;
  for (int repeat = 0; repeat < 2; ++repeat) {  // the second reuses the buffers of the first
    outputs.compute(c.rows, device.data(), vocab_size, stream, gpu);
    fill_step_output(c.rows, logits, vocab_size, cpu);
    expect_same_output(gpu, cpu);
  }
  cudaStreamDestroy(stream);
}

class LogitsOutputsTest : public GpuParamTest<int64_t> {};

TEST_P(LogitsOutputsTest, EqualTheCpuTwinOnPeakedAndFlatLogits) {
  const int64_t vocab_size = GetParam();
  std::mt19937_64 random{uint64_t(vocab_size)};
  for (const int64_t num_rows : {6, 40})
    for (const double spread : {4.0, 0.3}) {
      SCOPED_TRACE("logit spread " + std::to_string(spread) + ", rows " + std::to_string(num_rows));
      const Case c = make_case(vocab_size, random, num_rows);
      expect_gpu_equals_cpu(c, random_logits(num_vectors(c.rows) * vocab_size, spread, random), vocab_size);
    }
}

TEST_P(LogitsOutputsTest, TiesAndMinusInfinityFollowTheCpu) {
  const int64_t vocab_size = GetParam();
  std::mt19937_64 random(7);
  const Case c = make_case(vocab_size, random);
  std::vector<float> logits(static_cast<size_t>(num_vectors(c.rows) * vocab_size));
  for (size_t i = 0; i < logits.size(); ++i)
    logits[i] = i % 3 == 0 ? -INFINITY : float(int64_t(random() % 4));  // four values, many ties
  expect_gpu_equals_cpu(c, logits, vocab_size);
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, LogitsOutputsTest, ::testing::Values(3, 50, 1000, 3001, 65536));

// Choices made on the host (a top_k past the GPU's candidates, a nucleus wider than them, more top logprobs than
// the candidates hold) report logprobs against the GPU's normalizer of the vector, as its target logprobs and the
// GPU's own choices do: a token has one logprob, bit for bit, whichever side chose it. The host's own normalizer
// sums the vocabulary in another order and differs in its last bits.
TEST_F(GpuTest, HostChoicesTakeTheGpusNormalizer) {
  constexpr int64_t kVocabulary = 65536;
  std::mt19937_64 random(11);
  const std::vector<float> logits = random_logits(kVocabulary, 0.3, random);  // flat: a nucleus of thousands
  const int32_t argmax = backend::argmax(logits);
  const std::vector<int32_t> tokens = {1}, targets = {argmax};
  std::vector<backend::TokenChoice> choices(3);
  choices[0].num_top_logprobs = 2000;  // greedy
  choices[1].temperature = 1.0, choices[1].top_k = 2000, choices[1].uniform = 0.3;
  choices[2].temperature = 0.9, choices[2].top_p = 0.999, choices[2].uniform = 0.6;
  backend::BatchRow row;
  row.tokens = tokens;
  row.targets = targets;
  row.choices = choices;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  const backend::cuda::DeviceBuffer<float> device = upload(logits.data(), kVocabulary);
  const backend::cuda::DeviceBuffer<int32_t> device_targets = upload(targets.data(), 1);
  backend::cuda::DeviceBuffer<backend::cuda::VectorStats> stats(1);
  backend::cuda::logits_stats(device.data(), device_targets.data(), 1, kVocabulary, stats.data(), stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const double normalizer = download(stats.data(), 1)[0].log_normalizer;
  backend::cuda::LogitsOutputs outputs;
  backend::StepOutput gpu;
  outputs.compute({&row, 1}, device.data(), kVocabulary, stream, gpu);
  cudaStreamDestroy(stream);
  const backend::RowOutput& out = gpu.rows[0];
  ASSERT_EQ(out.chosen.size(), choices.size());
  EXPECT_EQ(out.chosen[0].token, argmax);
  EXPECT_EQ(out.chosen[0].logprob, out.target_logprobs[0]) << "the greedy choice against the target";
  for (size_t c = 0; c < choices.size(); ++c) {
    const backend::ChosenToken& chosen = out.chosen[c];
    EXPECT_EQ(chosen.logprob, double(logits[size_t(chosen.token)]) - normalizer) << "choice " << c;
    for (const backend::TokenLogprob& top : chosen.top_logprobs)
      ASSERT_EQ(top.logprob, double(logits[size_t(top.token)]) - normalizer) << "choice " << c << " top " << top.token;
  }
  EXPECT_NE(backend::log_sum_exp(logits), normalizer) << "the host's own normalizer would have passed unnoticed";
}

TEST_F(GpuTest, NanLogitsAreReportedNotFinite) {
  const int64_t vocab_size = 500;
  std::mt19937_64 random(3);
  const Case c = make_case(vocab_size, random);
  std::vector<float> logits = random_logits(num_vectors(c.rows) * vocab_size, 2.0, random);
  logits[logits.size() - 17] = NAN;  // in the last row's vector
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  backend::cuda::DeviceBuffer<float> device(int64_t(logits.size()));
  ASSERT_EQ(cudaMemcpy(device.data(), logits.data(), logits.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  backend::cuda::LogitsOutputs outputs;
  backend::StepOutput gpu;
  outputs.compute(c.rows, device.data(), vocab_size, stream, gpu);
  for (size_t r = 0; r + 1 < gpu.rows.size(); ++r) EXPECT_TRUE(gpu.rows[r].finite) << "row " << r;
  EXPECT_FALSE(gpu.rows.back().finite);
  for (const backend::ChosenToken& chosen : gpu.rows.back().chosen) {  // ids stay in the vocabulary
    EXPECT_GE(chosen.token, 0);
    EXPECT_LT(chosen.token, vocab_size);
  }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace jambo::testing
