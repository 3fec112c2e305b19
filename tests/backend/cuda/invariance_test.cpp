// Bitwise batch invariance of the CUDA kernels whose result for a row must be its own (invariance_util.h): a probe
// row alone and among 1 to 257 rows, first, in the middle and last. The norms (alone, after the residual add, over
// column segments, and over the tokens with logits), MoE routing, grouping and combination, the logits statistics
// (a vector's log-normalizer used to depend on how many vectors the step had), top candidates and sampling. Also
// across phases: a one-chunk prefill leaves a row's conv tail and SSM state where as many one-token decode steps
// leave them, the scan's update being one pinned arithmetic in both kernels; and a row's conv and scan among other
// rows of one step (ScanRowTest).
#include "invariance_util.h"
#include "support/random_tensors.h"
#include "backend/cuda/embedding_norm.h"
#include "backend/cuda/ffn.h"
#include "backend/cuda/logits_ops.h"
#include "backend/cuda/mamba.h"
#include "backend/cuda/step_rows.h"
#include "cuda_test_util.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace jambo::testing {
namespace {

using backend::cuda::DeviceBuffer;

constexpr float kEps = 1e-6f;

// The outputs' bits after the stream's work.
template <typename T>
std::vector<T> download_after(cudaStream_t stream, const T* values, int64_t count) {
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  return download(values, count);
}

// Values of a random row kept to multiples of 1/4: many equal entries, whose ties the kernels break by index.
RowMaker tied_rows(int64_t width, float spread) {
  return [width, spread](std::mt19937_64& random) {
    std::vector<float> row = uniform_rows(width, spread)(random);
    for (float& value : row) value = std::round(value * 4.0f) / 4.0f;
    return row;
  };
}

// A tied row with every 997th token raised far above the rest: a nucleus of a few dozen tokens.
std::vector<float> peaked_row(int64_t width, std::mt19937_64& random) {
  std::vector<float> row = tied_rows(width, 4.0f)(random);
  for (size_t i = 0; i < row.size(); i += 997) row[i] = 12.0f;
  return row;
}

class InvarianceTest : public StreamTest {
 protected:
  DeviceBuffer<float> random_weight(int64_t width) {
    const TensorView weight = store_.make({width}, DType::F32, 1.0f);
    return upload(static_cast<const float*>(weight.data), width);
  }

  TensorStore store_{61};
  std::mt19937_64 random_{67};
};

TEST_F(InvarianceTest, RmsNormOfARowIsItsOwn) {
  for (const int64_t width : {int64_t(33), int64_t(2560), int64_t(8192)}) {
    SCOPED_TRACE("width " + std::to_string(width));
    const DeviceBuffer<float> weight = random_weight(width);
    const BatchOp<float> norm = [&](const std::vector<float>& inputs, int64_t num_rows) {
      const DeviceBuffer<float> x = upload(inputs.data(), int64_t(inputs.size()));
      DeviceBuffer<float> out(num_rows * width);
      backend::cuda::rms_norm(x.data(), width, num_rows, width, weight.data(), kEps, out.data(), width, stream_);
      return download_after(stream_, out.data(), num_rows * width);
    };
    expect_row_invariant(norm, uniform_rows(width, 2.0f)(random_), width, uniform_rows(width, 2.0f));
  }
}

// A row's input: its hidden state, then its update; its output: the sum left in hidden, then the normed sum.
TEST_F(InvarianceTest, AddRmsNormOfARowIsItsOwn) {
  for (const int64_t width : {int64_t(33), int64_t(2560), int64_t(8192)}) {
    SCOPED_TRACE("width " + std::to_string(width));
    const DeviceBuffer<float> weight = random_weight(width);
    const BatchOp<float> add_norm = [&](const std::vector<float>& inputs, int64_t num_rows) {
      std::vector<float> hidden, update;
      for (int64_t r = 0; r < num_rows; ++r) {
        const auto row = inputs.begin() + r * 2 * width;
        hidden.insert(hidden.end(), row, row + width);
        update.insert(update.end(), row + width, row + 2 * width);
      }
      DeviceBuffer<float> device_hidden = upload(hidden.data(), num_rows * width);
      const DeviceBuffer<float> device_update = upload(update.data(), num_rows * width);
      DeviceBuffer<float> normed(num_rows * width);
      backend::cuda::add_rms_norm(device_hidden.data(), device_update.data(), num_rows, width, weight.data(), kEps,
                                  normed.data(), stream_);
      const std::vector<float> sums = download_after(stream_, device_hidden.data(), num_rows * width);
      const std::vector<float> norms = download(normed.data(), num_rows * width);
      std::vector<float> out;
      for (int64_t r = 0; r < num_rows; ++r) {
        out.insert(out.end(), sums.begin() + r * width, sums.begin() + (r + 1) * width);
        out.insert(out.end(), norms.begin() + r * width, norms.begin() + (r + 1) * width);
      }
      return out;
    };
    expect_row_invariant(add_norm, uniform_rows(2 * width, 2.0f)(random_), 2 * width, uniform_rows(2 * width, 2.0f));
  }
}

// Mamba's dt, B and C norms over x_proj's output (the 3B shape: dt_rank 160, N 16), in place, with 16-bit copies.
TEST_F(InvarianceTest, NormSegmentsOfARowAreItsOwn) {
  constexpr int64_t kDtRank = 160, kStateSize = 16, kWidth = kDtRank + 2 * kStateSize;
  const DeviceBuffer<float> dt_weight = random_weight(kDtRank), b_weight = random_weight(kStateSize),
                            c_weight = random_weight(kStateSize);
  const BatchOp<float> norms = [&](const std::vector<float>& inputs, int64_t num_rows) {
    DeviceBuffer<float> x = upload(inputs.data(), int64_t(inputs.size()));
    DeviceBuffer<uint16_t> dt16(num_rows * kDtRank);
    const std::vector<backend::cuda::NormSegment> segments = {
        {0, kDtRank, dt_weight.data(), {dt16.data(), DType::BF16}},
        {kDtRank, kStateSize, b_weight.data(), {}},
        {kDtRank + kStateSize, kStateSize, c_weight.data(), {}}};
    backend::cuda::rms_norm_segments(x.data(), kWidth, num_rows, segments, kEps, stream_);
    return download_after(stream_, x.data(), num_rows * kWidth);
  };
  expect_row_invariant(norms, uniform_rows(kWidth, 3.0f)(random_), kWidth, uniform_rows(kWidth, 3.0f));
}

// The final norm gathers each row's last token (rows of two tokens here) into the step's logits vectors.
TEST_F(InvarianceTest, FinalNormOfARowsLastTokenIsItsOwn) {
  constexpr int64_t kWidth = 2560, kTokensPerRow = 2;
  const DeviceBuffer<float> weight = random_weight(kWidth);
  backend::cuda::StepRowsUploader uploader;
  const std::vector<int32_t> tokens(kTokensPerRow * 257, 0);
  const BatchOp<float> final_norm = [&](const std::vector<float>& inputs, int64_t num_rows) {
    std::vector<backend::BatchRow> rows(static_cast<size_t>(num_rows));
    for (int64_t r = 0; r < num_rows; ++r)
      rows[size_t(r)].tokens = std::span<const int32_t>(tokens).subspan(size_t(r * kTokensPerRow), kTokensPerRow);
    const backend::cuda::DeviceRows device_rows =
        uploader.upload(rows, std::vector<int64_t>(rows.size(), 0), std::vector<int32_t>(rows.size(), 0), {}, stream_);
    const DeviceBuffer<float> hidden = upload(inputs.data(), int64_t(inputs.size()));
    DeviceBuffer<float> out(num_rows * kWidth);
    backend::cuda::gather_rms_norm(device_rows, hidden.data(), kWidth, weight.data(), kEps, out.data(), stream_);
    return download_after(stream_, out.data(), num_rows * kWidth);
  };
  const RowMaker two_tokens = uniform_rows(kTokensPerRow * kWidth, 2.0f);
  expect_row_invariant(final_norm, two_tokens(random_), kWidth, two_tokens);
}

// A token's input: its router logits, then its hidden state x. Its output: its chosen experts and their weights,
// then the combination of their outputs. The experts are stand-ins that depend on their own input row alone
// (y = x * (1 + e / 8) + e, computed on the host from the grouped rows), so that the test sees the routing, the
// grouping, the gather of the expert inputs and the combination, and nothing of the experts' GEMMs.
TEST_F(InvarianceTest, MoeRoutingAndCombinationOfATokenAreItsOwn) {
  constexpr int64_t kExperts = 16, kHidden = 64;
  for (const int64_t k : {int64_t(1), int64_t(2)}) {
    SCOPED_TRACE("top-" + std::to_string(k));
    const BatchOp<float> moe = [&](const std::vector<float>& inputs, int64_t num_tokens) {
      std::vector<float> logits, x;
      for (int64_t t = 0; t < num_tokens; ++t) {
        const auto row = inputs.begin() + t * (kExperts + kHidden);
        logits.insert(logits.end(), row, row + kExperts);
        x.insert(x.end(), row + kExperts, row + kExperts + kHidden);
      }
      const int64_t num_routed = num_tokens * k;
      const DeviceBuffer<float> device_logits = upload(logits.data(), num_tokens * kExperts),
                                device_x = upload(x.data(), num_tokens * kHidden);
      DeviceBuffer<int32_t> expert_of(num_routed), position_of(num_routed), routed_token(num_routed),
          active_experts(std::min(kExperts, num_routed));
      DeviceBuffer<float> weight_of(num_routed), expert_input(num_routed * kHidden), out(num_tokens * kHidden);
      DeviceBuffer<int64_t> expert_rows(kExperts + 1);
      const backend::cuda::ExpertRouting routing{expert_of.data(),    weight_of.data(),   position_of.data(),
                                                 routed_token.data(), expert_rows.data(), active_experts.data()};
      backend::cuda::route_tokens(device_logits.data(), num_tokens, kExperts, k, routing, stream_);
      backend::cuda::gather_rows(device_x.data(), routed_token.data(), num_routed, kHidden, expert_input.data(),
                                 stream_);
      std::vector<float> expert_output = download_after(stream_, expert_input.data(), num_routed * kHidden);
      const std::vector<int64_t> rows = download(expert_rows.data(), kExperts + 1);
      for (int64_t e = 0; e < kExperts; ++e)
        for (int64_t i = rows[size_t(e)] * kHidden; i < rows[size_t(e + 1)] * kHidden; ++i)
          expert_output[size_t(i)] = expert_output[size_t(i)] * (1.0f + float(e) / 8.0f) + float(e);
      const DeviceBuffer<float> device_output = upload(expert_output.data(), num_routed * kHidden);
      backend::cuda::combine_experts(device_output.data(), routing, num_tokens, k, kHidden, out.data(), stream_);
      const std::vector<float> combined = download_after(stream_, out.data(), num_tokens * kHidden);
      const std::vector<int32_t> experts = download(expert_of.data(), num_routed);
      const std::vector<float> weights = download(weight_of.data(), num_routed);
      std::vector<float> result;
      for (int64_t t = 0; t < num_tokens; ++t) {
        for (int64_t c = 0; c < k; ++c) result.push_back(float(experts[size_t(t * k + c)]));
        result.insert(result.end(), weights.begin() + t * k, weights.begin() + (t + 1) * k);
        result.insert(result.end(), combined.begin() + t * kHidden, combined.begin() + (t + 1) * kHidden);
      }
      return result;
    };
    const RowMaker tokens = tied_rows(kExperts + kHidden, 2.0f);  // tied router logits too
    expect_row_invariant(moe, tokens(random_), 2 * k + kHidden, tokens);
  }
}

// A vector's statistics as the kernel returns them: log-normalizer, max, target logit, argmax, non-finite count.
std::vector<double> stats_values(const std::vector<backend::cuda::VectorStats>& stats) {
  std::vector<double> values;
  for (const backend::cuda::VectorStats& s : stats)
    values.insert(values.end(), {s.log_normalizer, double(s.max_logit), double(s.target_logit), double(s.argmax),
                                 double(s.num_nonfinite)});
  return values;
}

constexpr int64_t kStatsValues = 5;

// Peaked logits, as a confident prediction has them: one logit at 0, the others in [-log V - 2, -log V], so that the
// exp-sum stays near 1, where another summation order shows in the normalizer's last bits (over a flat vector the
// rounding of log(sum) mostly hides it).
RowMaker peaked_logits(int64_t vocab_size) {
  return [vocab_size](std::mt19937_64& random) {
    const float low = -std::log(float(vocab_size)) - 2.0f;
    std::uniform_real_distribution<float> uniform(low, low + 2.0f);
    std::vector<float> row(static_cast<size_t>(vocab_size));
    for (float& value : row) value = uniform(random);
    row[random() % uint64_t(vocab_size)] = 0.0f;
    return row;
  };
}

// The step's vectors at most and at least kMaxVectorsToSplit (logits_ops.cu): up to 32 vectors took their exp-sums
// over 8 slices, more over one, so that a vector's normalizer changed bits between a step of 32 vectors and one of
// 33. The 3B vocabulary at the vector counts of that switch, and an odd vocabulary at every batch size; a flat probe
// and three peaked ones each.
TEST_F(InvarianceTest, LogitsStatisticsOfAVectorAreItsOwn) {
  for (const auto& [vocab_size, batch_sizes] :
       {std::pair<int64_t, std::vector<int64_t>>{65536, {1, 31, 32, 33, 256}}, {3001, kInvarianceBatchSizes}}) {
    SCOPED_TRACE("vocabulary " + std::to_string(vocab_size));
    const BatchOp<double> stats = [&](const std::vector<float>& inputs, int64_t num_vectors) {
      const DeviceBuffer<float> logits = upload(inputs.data(), int64_t(inputs.size()));
      const std::vector<int32_t> targets(static_cast<size_t>(num_vectors), 17);
      const DeviceBuffer<int32_t> device_targets = upload(targets.data(), num_vectors);
      DeviceBuffer<backend::cuda::VectorStats> out(num_vectors);
      backend::cuda::logits_stats(logits.data(), device_targets.data(), num_vectors, vocab_size, out.data(), stream_);
      return stats_values(download_after(stream_, out.data(), num_vectors));
    };
    const RowMaker flat = uniform_rows(vocab_size, 4.0f), peaked = peaked_logits(vocab_size);
    for (const RowMaker* probe : {&flat, &peaked, &peaked, &peaked})
      expect_row_invariant(stats, (*probe)(random_), kStatsValues, peaked, batch_sizes);
  }
}

constexpr int64_t kVocabulary = 65536;
constexpr int64_t kNarrowTop = 40;
constexpr int64_t kWideTop = backend::cuda::kMaxCandidates;

// Each vector's two top requests, the 40 and the 1024 most likely tokens, at offsets of their own.
std::vector<backend::cuda::TopRequest> top_requests(int64_t num_vectors) {
  std::vector<backend::cuda::TopRequest> requests;
  for (int64_t v = 0; v < num_vectors; ++v) {
    requests.push_back({v * (kNarrowTop + kWideTop), int32_t(v), int32_t(kNarrowTop)});
    requests.push_back({v * (kNarrowTop + kWideTop) + kNarrowTop, int32_t(v), int32_t(kWideTop)});
  }
  return requests;
}

// The candidates of every vector's top requests, as [ids, logits] per vector, on the GPU.
struct Candidates {
  DeviceBuffer<backend::cuda::TopRequest> requests;
  DeviceBuffer<int32_t> ids;
  DeviceBuffer<float> logits;
};

Candidates top_candidates(const float* logits, int64_t num_vectors, cudaStream_t stream) {
  const std::vector<backend::cuda::TopRequest> requests = top_requests(num_vectors);
  Candidates c{upload(requests.data(), int64_t(requests.size())), DeviceBuffer<int32_t>(num_vectors * (kNarrowTop + kWideTop)),
               DeviceBuffer<float>(num_vectors * (kNarrowTop + kWideTop))};
  backend::cuda::top_candidates(logits, c.requests.data(), int64_t(requests.size()), kVocabulary, c.ids.data(),
                                c.logits.data(), stream);
  return c;
}

TEST_F(InvarianceTest, TopCandidatesOfAVectorAreItsOwn) {
  constexpr int64_t kPerVector = kNarrowTop + kWideTop;
  const BatchOp<double> top = [&](const std::vector<float>& inputs, int64_t num_vectors) {
    const DeviceBuffer<float> logits = upload(inputs.data(), int64_t(inputs.size()));
    const Candidates c = top_candidates(logits.data(), num_vectors, stream_);
    const std::vector<int32_t> ids = download_after(stream_, c.ids.data(), num_vectors * kPerVector);
    const std::vector<float> values = download(c.logits.data(), num_vectors * kPerVector);
    std::vector<double> out;
    for (int64_t v = 0; v < num_vectors; ++v) {
      out.insert(out.end(), ids.begin() + v * kPerVector, ids.begin() + (v + 1) * kPerVector);
      out.insert(out.end(), values.begin() + v * kPerVector, values.begin() + (v + 1) * kPerVector);
    }
    return out;
  };
  expect_row_invariant(top, peaked_row(kVocabulary, random_), 2 * kPerVector, uniform_rows(kVocabulary, 4.0f));
}

// Sampling in id order (plain and with min_p), from the 40 most likely (top_k) and from the nucleus of the 1024
// most likely (top_p), each with its own draw; a vector's tokens, logits and host hand-backs. The probe's nucleus
// lies within its candidates; the fillers' spans past them (a host hand-back).
TEST_F(InvarianceTest, SampledTokensOfAVectorAreItsOwn) {
  struct Kind {
    double temperature, top_p, min_p, uniform;
    int64_t top_k;
    int top_request;  // -1: none; 0: the 40 most likely; 1: the 1024 most likely
  };
  const std::vector<Kind> kinds = {
      {1.0, 1.0, 0.0, 0.37, 0, -1}, {0.7, 1.0, 0.05, 0.81, 0, -1}, {1.3, 1.0, 0.0, 0.55, kNarrowTop, 0},
      {0.8, 0.9, 0.0, 0.12, 0, 1}};
  const int64_t num_kinds = int64_t(kinds.size());
  const BatchOp<double> sample = [&](const std::vector<float>& inputs, int64_t num_vectors) {
    const DeviceBuffer<float> logits = upload(inputs.data(), int64_t(inputs.size()));
    const std::vector<int32_t> targets(static_cast<size_t>(num_vectors), -1);
    const DeviceBuffer<int32_t> device_targets = upload(targets.data(), num_vectors);
    DeviceBuffer<backend::cuda::VectorStats> stats(num_vectors);
    backend::cuda::logits_stats(logits.data(), device_targets.data(), num_vectors, kVocabulary, stats.data(), stream_);
    const Candidates c = top_candidates(logits.data(), num_vectors, stream_);
    std::vector<backend::cuda::SampleRequest> requests;
    for (int64_t v = 0; v < num_vectors; ++v)
      for (const Kind& kind : kinds) {
        backend::cuda::SampleRequest request;
        request.temperature = kind.temperature, request.top_p = kind.top_p, request.min_p = kind.min_p;
        request.uniform = kind.uniform, request.top_k = kind.top_k, request.vector = int32_t(v);
        request.top_request = kind.top_request < 0 ? -1 : int32_t(2 * v + kind.top_request);
        requests.push_back(request);
      }
    const DeviceBuffer<backend::cuda::SampleRequest> device_requests = upload(requests.data(), int64_t(requests.size()));
    DeviceBuffer<backend::cuda::SampleResult> results(int64_t(requests.size()));
    backend::cuda::sample_tokens(logits.data(), device_requests.data(), int64_t(requests.size()), kVocabulary,
                                 stats.data(), c.requests.data(), c.ids.data(), c.logits.data(), results.data(),
                                 stream_);
    std::vector<double> out;
    for (const backend::cuda::SampleResult& result : download_after(stream_, results.data(), int64_t(requests.size())))
      out.insert(out.end(), {double(result.token), double(result.logit), double(result.needs_host)});
    return out;
  };
  expect_row_invariant(sample, peaked_row(kVocabulary, random_), 3 * num_kinds, uniform_rows(kVocabulary, 4.0f));
}

// One Mamba layer's conv and scan over one row in slot 0 of a pool holding an earlier state: the row's tokens as one
// prefill step, or one decode step per token. Di 256, K 4, N 16 (Jamba's, the scan's compiled paths).
class PhaseTest : public StreamTest {
 protected:
  static constexpr int64_t kChannels = 256, kKernel = 4, kState = 16;
  static constexpr int64_t kSlotSize = kChannels * (kKernel - 1) + kChannels * kState;

  struct Slot {
    std::vector<float> state;      // the pool after the steps: conv tail, then SSM state
    std::vector<float> activated;  // the conv's outputs of every token
    std::vector<float> gated;      // the scan's outputs of every token
  };

  // The row's tokens in steps of step_tokens tokens (the first step reads the earlier state, as all later ones).
  Slot run(int64_t num_tokens, int64_t step_tokens) {
    DeviceBuffer<float> pool = upload(earlier_state_.data(), kSlotSize);
    const backend::StateValues state{pool.data(), DType::F32};
    const backend::cuda::MambaStateLayout layout{kChannels, kKernel, kState, 0};
    DeviceBuffer<float> activated(num_tokens * kChannels);
    DeviceBuffer<float> gated(num_tokens * kChannels);
    for (int64_t first = 0; first < num_tokens; first += step_tokens) {
      const int64_t count = std::min(step_tokens, num_tokens - first);
      backend::BatchRow row;
      row.tokens = std::span<const int32_t>(tokens_).subspan(0, size_t(count));
      row.start_position = 1 + first;
      const backend::cuda::DeviceRows rows = uploader_.upload({&row, 1}, std::vector<int64_t>{0}, std::vector<int32_t>{1},
                                                              {}, stream_);
      const float* projected = projected_.data() + first * 2 * kChannels;
      backend::cuda::causal_conv1d(rows, layout, projected, conv_weight_.data(), conv_bias_.data(), state,
                                   activated.data() + first * kChannels, {}, stream_);
      backend::cuda::selective_scan(rows, layout, activated.data() + first * kChannels,
                                    delta_raw_.data() + first * kChannels, dt_bias_.data(),
                                    selective_.data() + first * 2 * kState, 2 * kState, 0, projected, a_.data(),
                                    d_.data(), state, gated.data() + first * kChannels, {}, stream_);
    }
    return {download_after(stream_, pool.data(), kSlotSize), download(activated.data(), num_tokens * kChannels),
            download(gated.data(), num_tokens * kChannels)};
  }

  void SetUp() override {
    StreamTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    earlier_state_ = values(1, kSlotSize, 0.5f);
    projected_ = device_values(kMaxTokens, 2 * kChannels, 1.0f);
    delta_raw_ = device_values(kMaxTokens, kChannels, 1.0f);
    selective_ = device_values(kMaxTokens, 2 * kState, 1.0f);
    conv_weight_ = device_values(kChannels, kKernel, 0.5f);
    conv_bias_ = device_values(1, kChannels, 0.1f);
    dt_bias_ = device_values(1, kChannels, 0.5f);
    d_ = device_values(1, kChannels, 1.0f);
    std::vector<float> a = values(kChannels, kState, 1.0f);  // A = -exp(A_log), A_log in [0, 2)
    for (float& x : a) x = -std::exp(x + 1.0f);
    a_ = upload(a.data(), int64_t(a.size()));
  }

  static constexpr int64_t kMaxTokens = 150;
  TensorStore store_{71};
  std::vector<float> earlier_state_;
  const std::vector<int32_t> tokens_ = std::vector<int32_t>(kMaxTokens, 0);
  DeviceBuffer<float> projected_, delta_raw_, selective_, conv_weight_, conv_bias_, dt_bias_, d_, a_;
  backend::cuda::StepRowsUploader uploader_;

 private:
  std::vector<float> values(int64_t rows, int64_t cols, float spread) {
    const backend::cpu::Matrix m = store_.matrix(rows, cols, spread);
    return std::vector<float>(m.data(), m.data() + rows * cols);
  }
  DeviceBuffer<float> device_values(int64_t rows, int64_t cols, float spread) {
    const std::vector<float> v = values(rows, cols, spread);
    return upload(v.data(), int64_t(v.size()));
  }
};

// A prompt's conv and scan are the same bits whether it comes as one prefill step, as one decode step per token, or
// cut into steps of 37 tokens (chunked prefill): the outputs of every token, the conv tail and the SSM state. The
// lengths end inside, at and past the prefill's chunks (kScanChunkTokens) and its stages of 32 tokens.
TEST_F(PhaseTest, APromptsScanDoesNotDependOnHowItIsCutIntoSteps) {
  static_assert(backend::cuda::kScanChunkTokens == 64, "the lengths below end inside, at and past the first chunk");
  for (const int64_t num_tokens : {int64_t(2), int64_t(17), int64_t(64), kMaxTokens}) {
    SCOPED_TRACE(std::to_string(num_tokens) + " tokens");
    const Slot prefill = run(num_tokens, num_tokens);
    for (const int64_t step_tokens : {int64_t(1), int64_t(37)}) {
      SCOPED_TRACE("steps of " + std::to_string(step_tokens) + " tokens");
      const Slot steps = run(num_tokens, step_tokens);
      const int64_t tail_size = kChannels * (kKernel - 1);
      EXPECT_EQ(first_difference(steps.activated.data(), prefill.activated.data(), num_tokens * kChannels), "")
          << "conv outputs";
      EXPECT_EQ(first_difference(steps.state.data(), prefill.state.data(), tail_size), "") << "conv tail";
      EXPECT_EQ(first_difference(steps.state.data() + tail_size, prefill.state.data() + tail_size,
                                 kSlotSize - tail_size),
                "")
          << "SSM state";
      EXPECT_EQ(first_difference(steps.gated.data(), prefill.gated.data(), num_tokens * kChannels), "")
          << "scan outputs";
    }
  }
}

// One step of a Mamba layer's conv and scan over several rows, each in a slot of its own: a probe row's outputs and
// its slot's state after the step are the same bits alone and among other rows (decode rows of one token and prefill
// rows of several, in any mix), first, in the middle or last, and whatever slot it takes. The compositions cross
// the scan's switches: the one-token update's passes (more than kMaxRowsOfOnePass rows) and the prefill's lanes per
// channel (more than kMaxRowsOfFewScans rows of several tokens). Di 256, K 4, N 16.
class ScanRowTest : public StreamTest {
 protected:
  static constexpr int64_t kChannels = 256, kKernel = 4, kState = 16;
  static constexpr int64_t kSlotSize = kChannels * (kKernel - 1) + kChannels * kState;

  // A row's inputs: per token, its in_proj output (x then z), dt_proj output and B, C; and the state it starts from.
  struct RowInputs {
    int64_t num_tokens = 0;
    std::vector<float> projected, delta_raw, selective, state;
  };
  RowInputs make_row(int64_t num_tokens) {
    RowInputs row;
    row.num_tokens = num_tokens;
    row.projected = values(num_tokens * 2 * kChannels, 1.0f);
    row.delta_raw = values(num_tokens * kChannels, 1.0f);
    row.selective = values(num_tokens * 2 * kState, 1.0f);
    row.state = values(kSlotSize, 0.5f);
    return row;
  }

  struct RowOutputs {
    std::vector<float> gated, state;  // the row's scan outputs [tokens, Di]; its slot after the step
  };

  // The rows as one step, row r in slot slots[r]; what the row at `probe` leaves.
  RowOutputs run(const std::vector<const RowInputs*>& rows, const std::vector<int64_t>& slots, size_t probe) {
    const int64_t num_slots = *std::max_element(slots.begin(), slots.end()) + 1;
    std::vector<float> pool(size_t(num_slots * kSlotSize), std::nanf(""));  // slots no row owns are never read
    std::vector<float> projected, delta_raw, selective;
    std::vector<backend::BatchRow> batch(rows.size());
    std::vector<int64_t> offsets;
    int64_t first_token = 0, probe_first = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
      const RowInputs& row = *rows[r];
      std::copy(row.state.begin(), row.state.end(), pool.begin() + slots[r] * kSlotSize);
      projected.insert(projected.end(), row.projected.begin(), row.projected.end());
      delta_raw.insert(delta_raw.end(), row.delta_raw.begin(), row.delta_raw.end());
      selective.insert(selective.end(), row.selective.begin(), row.selective.end());
      batch[r].tokens = std::span<const int32_t>(tokens_).subspan(0, size_t(row.num_tokens));
      batch[r].start_position = 5;
      batch[r].has_initial_state = true;
      batch[r].slot = slots[r];
      offsets.push_back(slots[r] * kSlotSize);
      if (r == probe) probe_first = first_token;
      first_token += row.num_tokens;
    }
    const int64_t num_tokens = first_token;
    DeviceBuffer<float> device_pool = upload(pool.data(), int64_t(pool.size()));
    const DeviceBuffer<float> device_projected = upload(projected.data(), int64_t(projected.size()));
    const DeviceBuffer<float> device_delta = upload(delta_raw.data(), int64_t(delta_raw.size()));
    const DeviceBuffer<float> device_selective = upload(selective.data(), int64_t(selective.size()));
    DeviceBuffer<float> activated(num_tokens * kChannels), gated(num_tokens * kChannels);
    const backend::StateValues state{device_pool.data(), DType::F32};
    const backend::cuda::MambaStateLayout layout{kChannels, kKernel, kState, 0};
    const std::vector<int32_t> reads(rows.size(), 1);
    const backend::cuda::DeviceRows device_rows = uploader_.upload(batch, offsets, reads, {}, stream_);
    backend::cuda::causal_conv1d(device_rows, layout, device_projected.data(), conv_weight_.data(),
                                 conv_bias_.data(), state, activated.data(), {}, stream_);
    backend::cuda::selective_scan(device_rows, layout, activated.data(), device_delta.data(), dt_bias_.data(),
                                  device_selective.data(), 2 * kState, 0, device_projected.data(), a_.data(),
                                  d_.data(), state, gated.data(), {}, stream_);
    const std::vector<float> all_gated = download_after(stream_, gated.data(), num_tokens * kChannels);
    const std::vector<float> all_state = download(device_pool.data(), int64_t(pool.size()));
    const auto gated_begin = all_gated.begin() + probe_first * kChannels;
    const auto state_begin = all_state.begin() + slots[probe] * kSlotSize;
    return {std::vector<float>(gated_begin, gated_begin + rows[probe]->num_tokens * kChannels),
            std::vector<float>(state_begin, state_begin + kSlotSize)};
  }

  void SetUp() override {
    StreamTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    conv_weight_ = device_values(kChannels * kKernel, 0.5f);
    conv_bias_ = device_values(kChannels, 0.1f);
    dt_bias_ = device_values(kChannels, 0.5f);
    d_ = device_values(kChannels, 1.0f);
    std::vector<float> a = values(kChannels * kState, 1.0f);  // A = -exp(A_log), A_log in [0, 2)
    for (float& x : a) x = -std::exp(x + 1.0f);
    a_ = upload(a.data(), int64_t(a.size()));
  }

  TensorStore store_{79};
  const std::vector<int32_t> tokens_ = std::vector<int32_t>(200, 0);
  DeviceBuffer<float> conv_weight_, conv_bias_, dt_bias_, d_, a_;
  backend::cuda::StepRowsUploader uploader_;

 private:
  std::vector<float> values(int64_t count, float spread) {
    const backend::cpu::Matrix m = store_.matrix(1, count, spread);
    return std::vector<float>(m.data(), m.data() + count);
  }
  DeviceBuffer<float> device_values(int64_t count, float spread) {
    const std::vector<float> v = values(count, spread);
    return upload(v.data(), int64_t(v.size()));
  }
};

TEST_F(ScanRowTest, ARowsScanIsItsOwn) {
  static_assert(backend::cuda::kScanChunkTokens == 64, "the prefill probe spans two chunks");
  // Fillers of 1, 5, 33 and 70 tokens; compositions of up to 9 rows, of 0 to 6 rows of several tokens.
  std::vector<RowInputs> fillers;
  for (const int64_t num_tokens : {1, 5, 33, 70, 1, 1, 5, 33, 1}) fillers.push_back(make_row(num_tokens));
  for (const int64_t probe_tokens : {int64_t(1), int64_t(100)}) {
    SCOPED_TRACE("a probe of " + std::to_string(probe_tokens) + " tokens");
    const RowInputs probe = make_row(probe_tokens);
    const RowOutputs alone = run({&probe}, {0}, 0);
    for (const int64_t num_fillers : {1, 2, 3, 5, 9}) {
      for (const size_t position : {size_t(0), size_t(num_fillers / 2), size_t(num_fillers)}) {
        std::vector<const RowInputs*> rows;
        std::vector<int64_t> slots;
        for (int64_t f = 0; f < num_fillers; ++f) rows.push_back(&fillers[size_t(f)]), slots.push_back(f + 1);
        rows.insert(rows.begin() + std::ptrdiff_t(position), &probe);
        slots.insert(slots.begin() + std::ptrdiff_t(position), 3 * num_fillers + 2);  // a slot past the fillers'
        const RowOutputs among = run(rows, slots, position);
        const std::string where = "the probe at row " + std::to_string(position) + " of " +
                                  std::to_string(rows.size()) + ", slot " + std::to_string(slots[position]);
        EXPECT_EQ(first_difference(alone.gated.data(), among.gated.data(), probe_tokens * kChannels), "")
            << where << ": scan outputs";
        EXPECT_EQ(first_difference(alone.state.data(), among.state.data(), kSlotSize), "") << where << ": slot";
      }
    }
  }
}

}  // namespace
}  // namespace jambo::testing
