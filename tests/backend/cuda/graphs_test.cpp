// Decode steps as CUDA graphs (step_graphs.h). StepGraphs on its own: warm-up, capture and replay, a replay
// reading the data its buffers hold now, and a fresh start once any buffer is allocated. The CUDA backend with
// graphs against the same backend launching every kernel itself: decode steps whose rows change order, slots,
// positions and block tables between replays of one shape, and a first token run as a decode row from zero
// state (law 1), give bitwise equal logits, on the invariant GEMMs (the default) and on cuBLAS.
#include "support/sequences.h"
#include "support/test_models.h"
#include "backend/cuda/step_graphs.h"
#include "cuda_test_util.h"

#include <cstring>

namespace jambo::testing {
namespace {

using backend::cuda::DeviceBuffer;
using backend::cuda::StepGraphs;

class StepGraphsTest : public GpuTest {};

void fill(backend::cuda::DeviceBuffer<float>& buffer, float value) {
  const std::vector<float> host(size_t(buffer.size()), value);
  ASSERT_EQ(cudaMemcpy(buffer.data(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
}

TEST_F(StepGraphsTest, WarmsUpCapturesReplaysAndStartsAfreshAfterAnAllocation) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  {
    backend::cuda::DeviceBuffer<float> input(64), output(64);
    backend::cuda::StepGraphs graphs(stream);
    const auto copy = [&] {
      JAMBO_CUDA_CHECK(
          cudaMemcpyAsync(output.data(), input.data(), 64 * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    };
    for (int step = 0; step < 4; ++step) {
      fill(input, float(step));
      graphs.run(/*key=*/7, copy);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      EXPECT_EQ(download(output.data(), output.size()), std::vector<float>(64, float(step))) << "step " << step;
    }
    EXPECT_EQ(graphs.counts().num_eager, 1);     // the warm-up
    EXPECT_EQ(graphs.counts().num_captures, 1);  // the second step
    EXPECT_EQ(graphs.counts().num_replays, 3);

    backend::cuda::DeviceBuffer<float> elsewhere(64);  // any allocation may have moved a captured buffer
    fill(input, 9.0f);
    graphs.run(7, copy);
    graphs.run(7, copy);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(download(output.data(), output.size()), std::vector<float>(64, 9.0f));
    EXPECT_EQ(graphs.counts().num_eager, 2);
    EXPECT_EQ(graphs.counts().num_captures, 2);
  }
  cudaStreamDestroy(stream);
}

// A test model, and the invariant GEMMs (true) or cuBLAS.
class GraphedDecodeTest : public GpuParamTest<std::tuple<TestModelSpec, bool>> {};

// Prefills six sequences, then decodes with batches of six and of three in changing orders, and starts a
// seventh sequence with a one-token zero-state row amid decodes. Returns every decode row's logits in order.
std::vector<std::vector<float>> decode_run(backend::Backend& backend, int64_t vocab_size) {
  std::vector<Sequence> sequences;
  for (int64_t i = 0; i < 7; ++i) sequences.emplace_back(i, random_tokens(40, vocab_size, 300 + uint64_t(i)));
  step(backend, {&sequences[0], &sequences[1], &sequences[2]}, {5, 3, 8});
  step(backend, {&sequences[3], &sequences[4], &sequences[5]}, {2, 6, 4});
  std::vector<std::vector<float>> logits;
  const auto decode = [&](std::vector<int64_t> order) {
    std::vector<Sequence*> rows;
    for (int64_t i : order) rows.push_back(&sequences[size_t(i)]);
    std::vector<Logits> outputs(rows.size());
    std::vector<Logits*> pointers;
    for (Logits& output : outputs) pointers.push_back(&output);
    step(backend, rows, std::vector<int64_t>(rows.size(), 1), pointers);
    for (const Logits& output : outputs) logits.push_back(output.front());
  };
  for (int round = 0; round < 6; ++round) {
    decode({0, 1, 2, 3, 4, 5});
    decode({5, 3, 1, 0, 2, 4});
    decode({round % 2 == 0 ? 0 : 1, 2 + round % 3, 5});
  }
  decode({6, 0, 3});  // sequence 6's first token: law 1 inside a replayed graph
  decode({2, 6, 4});
  return logits;
}

TEST_P(GraphedDecodeTest, EqualsLaunchingEveryKernel) {
  const auto& [spec, invariant_gemm] = GetParam();
  const model::Model model = make_random_model(spec.config, spec.dtype, 42);
  for (const char* weights : {"f32", "bf16"}) {
    auto eager = backend::cuda::make_cuda_backend(model, test_cache(7), weights, /*decode_graphs=*/false,
                                                  invariant_gemm);
    auto graphed = backend::cuda::make_cuda_backend(model, test_cache(7), weights, /*decode_graphs=*/true,
                                                    invariant_gemm);
    const auto expected = decode_run(*eager, model.config.vocab_size);
    const auto actual = decode_run(*graphed, model.config.vocab_size);
    ASSERT_EQ(expected.size(), actual.size());
    for (size_t i = 0; i < expected.size(); ++i)
      ASSERT_EQ(expected[i], actual[i]) << weights << " weights: decode row " << i << " differs";
    EXPECT_EQ(backend::cuda::cuda_graph_replays(*eager), 0);
    const int64_t replays = backend::cuda::cuda_graph_replays(*graphed);
    EXPECT_GE(replays, 12) << weights << " weights: most decode steps should have replayed a graph";
    std::printf("[cuda graphs] %s, %s weights, %s GEMMs: %zu decode rows bitwise equal, %lld of 20 decode steps "
                "replayed\n",
                spec.name.c_str(), weights, invariant_gemm ? "invariant" : "cuBLAS", expected.size(),
                static_cast<long long>(replays));
  }
}

INSTANTIATE_TEST_SUITE_P(TestModels, GraphedDecodeTest,
                         ::testing::Combine(::testing::ValuesIn(test_model_specs()), ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + (std::get<1>(info.param) ? "_invariant" : "_cublas");
                         });

}  // namespace
}  // namespace jambo::testing
