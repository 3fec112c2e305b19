// The server's engine loop on the CUDA backend: requests submitted from several threads at once, as
// HTTP connections submit them, give the CPU engine's greedy ids and logprobs (within 1e-4).
#include "support/engine_test_util.h"
#include "cuda_test_util.h"
#include "server/engine_loop.h"

#include <future>
#include <thread>

namespace jambo::testing {
namespace {

class CudaServerLoopTest : public GpuTest {};

engine::EngineOptions loop_options(const model::Model& model, engine::BackendKind backend) {
  engine::EngineOptions options = exact_engine_options(model, /*max_num_seqs=*/16, /*num_kv_blocks=*/128,
                                                       /*kv_block_size=*/16, /*max_model_len=*/128, backend);
  options.max_num_batched_tokens = 32;
  return options;
}

// Each request's greedy ids and logprobs, through an EngineLoop fed by four threads.
std::map<std::string, engine::SampleOutput> serve(const model::Model& model,
                                                  const std::vector<engine::RequestSpec>& specs,
                                                  engine::BackendKind backend) {
  engine::Engine engine(model, nullptr, loop_options(model, backend));
  server::EngineLoop loop(engine, 64);
  std::vector<std::map<std::string, engine::SampleOutput>> per_thread(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < per_thread.size(); ++t)
    threads.emplace_back([&, t] {
      for (size_t r = t; r < specs.size(); r += per_thread.size()) {
        auto stream = std::make_shared<server::RequestStream>(1, 0, nullptr);
        std::promise<server::EngineLoop::Admission> admission;
        loop.submit({specs[r]}, stream,
                    [&admission](server::EngineLoop::Admission given) { admission.set_value(std::move(given)); });
        ASSERT_EQ(admission.get_future().get().verdict, server::EngineLoop::Verdict::Accepted);
        engine::SampleOutput& output = per_thread[t][specs[r].id];
        while (!stream->is_finished()) {
          ASSERT_FALSE(stream->error()) << stream->error()->message;
          for (const server::StreamEvent& event : stream->take(std::chrono::milliseconds(50))) {
            output.ids.insert(output.ids.end(), event.ids.begin(), event.ids.end());
            output.logprobs.insert(output.logprobs.end(), event.logprobs.begin(), event.logprobs.end());
          }
        }
      }
    });
  for (std::thread& thread : threads) thread.join();
  std::map<std::string, engine::SampleOutput> outputs;
  for (auto& part : per_thread) outputs.merge(part);
  return outputs;
}

TEST_F(CudaServerLoopTest, ConcurrentRequestsMatchTheCpuBackend) {
  const model::Model model = load_fixture_model();
  std::vector<engine::RequestSpec> specs = random_workload(model, 32, /*seed=*/11, 40, /*allow_n=*/false);
  for (engine::RequestSpec& spec : specs) spec.sampling.temperature = 0.0;
  const auto expected = serve(model, specs, engine::BackendKind::Cpu);
  const auto actual = serve(model, specs, engine::BackendKind::Cuda);
  ASSERT_EQ(expected.size(), actual.size());
  double worst = 0.0;
  for (const auto& [id, want] : expected) {
    const engine::SampleOutput& got = actual.at(id);
    EXPECT_EQ(want.ids, got.ids) << id;
    ASSERT_EQ(want.logprobs.size(), got.logprobs.size()) << id;
    for (size_t i = 0; i < want.logprobs.size(); ++i)
      worst = std::max(worst, std::fabs(want.logprobs[i] - got.logprobs[i]));
  }
  std::printf("[cuda server loop vs cpu] max |dlogprob| = %.3g over %zu requests\n", worst, expected.size());
  EXPECT_LT(worst, 1e-4);
}

}  // namespace
}  // namespace jambo::testing
