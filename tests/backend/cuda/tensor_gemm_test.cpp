// The invariant GEMM (tensor_gemm.h), through linear(): 16-bit weights' products against a double-precision sum of
// the same rounded operands, fp32 weights' bit for bit against their order computed on the host, and its one
// summation order, bit for bit, for a row alone and among 1 to 600 rows (every tile a row count takes, each with a
// block per slice where its tiles are few and without), at shapes of the 3B model, of a small model (K = 20: staged
// an element at a time) and of ragged tiles.
#include "invariance_util.h"
#include "support/random_tensors.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/tensor_gemm.h"
#include "cuda_test_util.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

namespace jambo::testing {
namespace {

using backend::cuda::DeviceBuffer;

struct Shape {
  int64_t n, k;
};

std::string describe(DType dtype, const Shape& shape) {
  return std::string(dtype_name(dtype)) + " [" + std::to_string(shape.n) + ", " + std::to_string(shape.k) + "]";
}

class TensorGemmTest : public StreamTest {
 protected:
  // After the stream, and only with a GPU: cuBLAS's handle needs one.
  void SetUp() override {
    StreamTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    gemm_ = std::make_unique<backend::cuda::Gemm>(stream_, /*pedantic=*/false, /*invariant=*/true);
  }
  void TearDown() override {
    gemm_.reset();
    StreamTest::TearDown();
  }

  // The weight on the GPU, and its values as the host sees them.
  struct Weight {
    TensorView host;
    DeviceBuffer<std::byte> device;
    backend::cuda::DeviceMatrix matrix;
  };
  Weight make_weight(DType dtype, const Shape& shape) {
    Weight w;
    w.host = store_.make({shape.n, shape.k}, dtype, 1.0f);
    w.device = upload(static_cast<const std::byte*>(w.host.data), shape.n * shape.k * dtype_size(dtype));
    w.matrix = {w.device.data(), dtype, shape.n, shape.k};
    return w;
  }

  // linear_strided over rows of x that lie `stride` floats apart, as dt_proj reads its input.
  std::vector<float> multiply(const backend::cuda::DeviceMatrix& w, const std::vector<float>& x, int64_t num_rows,
                              int64_t stride) {
    DeviceBuffer<float> device_x = upload(x.data(), num_rows * stride);
    DeviceBuffer<float> y(num_rows * w.rows);
    backend::cuda::linear_strided(*gemm_, device_x.data(), stride, num_rows, w, y.data());
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    return download(y.data(), num_rows * w.rows);
  }

  void expect_every_launch_agrees(DType dtype, const Shape& shape, int64_t rows);

  TensorStore store_{71};
  std::unique_ptr<backend::cuda::Gemm> gemm_;
};

// y equals the product of x rounded to the weight's type with the weights, summed in double, to fp32 accumulation
// order: every tile (1 to 600 rows; the largest tiles at [11392, 64] and 600 rows), outputs
// and rows that fill no whole tile, a K that is not a multiple of 16 or 8, a weight of several slices (K = 2560 at 40
// outputs: 20 of 8 k-steps).
TEST_F(TensorGemmTest, SixteenBitWeightsMultiplyInputsRoundedToTheirType) {
  for (const DType dtype : {DType::BF16, DType::F16})
    for (const Shape& shape : {Shape{37, 64}, Shape{40, 2560}, Shape{1000, 2560}, Shape{5, 8}, Shape{24, 20},
                               Shape{1100, 136}, Shape{130, 3}, Shape{11392, 64}}) {
      const Weight w = make_weight(dtype, shape);
      for (const int64_t rows : {1, 2, 8, 9, 17, 33, 65, 130, 257, 600}) {
        const int64_t stride = shape.k + 4;
        const backend::cpu::Matrix x = store_.matrix(rows, stride, 1.0f);
        const std::vector<float> x_values(x.data(), x.data() + rows * stride);
        const std::vector<float> y = multiply(w.matrix, x_values, rows, stride);
        double magnitude = 0.0, worst = 0.0;
        for (int64_t m = 0; m < rows; ++m)
          for (int64_t o = 0; o < shape.n; ++o) {
            double sum = 0.0;
            for (int64_t i = 0; i < shape.k; ++i) {
              const float value = x_values[size_t(m * stride + i)];
              const double rounded = dtype == DType::BF16 ? to_float(to_bf16(value)) : to_float(to_f16(value));
              sum += rounded * double(w.host.at(o * shape.k + i));
            }
            magnitude = std::max(magnitude, std::fabs(sum));
            worst = std::max(worst, std::fabs(double(y[size_t(m * shape.n + o)]) - sum));
          }
        EXPECT_LE(worst, 1e-5 * magnitude) << describe(dtype, shape) << ", " << rows << " rows";
      }
    }
}

// The order of fp32 weights, on the host: per slice, from zero, a fused multiply-add per k in increasing k (zeros
// past K, to the end of the slice's last k-step), and the slices' sums added in slice order from zero.
float sum_in_order(const float* x, const float* w, int64_t k, const backend::cuda::GemmOrder& order) {
  float total = 0.0f;
  for (int64_t s = 0; s < order.num_slices; ++s) {
    const int64_t first = s * order.slice_steps * 16;
    const int64_t end = std::min(order.num_steps, (s + 1) * order.slice_steps) * 16;
    float sum = 0.0f;
    for (int64_t i = first; i < end; ++i) sum = std::fma(i < k ? x[i] : 0.0f, i < k ? w[i] : 0.0f, sum);
    total += sum;
  }
  return total;
}

// fp32 weights: y is the bits of sum_in_order, at every FMA tile (1 to 600 rows), with a block per slice and
// without (x_proj's 40 slices, a [40, 2560] of 20), outputs and rows that fill no whole tile, K not a multiple of 16
// or 4 (rows then staged an element at a time) and rows of x apart by more than K.
TEST_F(TensorGemmTest, Fp32WeightsSumInTheOrderBitForBit) {
  for (const Shape& shape : {Shape{37, 64}, Shape{40, 2560}, Shape{192, 5120}, Shape{1000, 2560}, Shape{5, 8},
                             Shape{24, 20}, Shape{130, 3}, Shape{600, 136}}) {
    const Weight w = make_weight(DType::F32, shape);
    const backend::cuda::GemmOrder order = backend::cuda::gemm_order(shape.n, shape.k);
    const float* weights = static_cast<const float*>(w.host.data);
    for (const int64_t rows : {1, 2, 8, 9, 32, 33, 64, 65, 130, 600}) {
      if (rows * shape.n * shape.k > (int64_t(1) << 29)) continue;  // the host's sums stay within seconds
      const int64_t stride = shape.k + 4;
      const backend::cpu::Matrix x = store_.matrix(rows, stride, 1.0f);
      const std::vector<float> x_values(x.data(), x.data() + rows * stride);
      const std::vector<float> y = multiply(w.matrix, x_values, rows, stride);
      int64_t num_different = 0;
      for (int64_t m = 0; m < rows; ++m)
        for (int64_t o = 0; o < shape.n; ++o) {
          const float expected = sum_in_order(&x_values[size_t(m * stride)], weights + o * shape.k, shape.k, order);
          num_different += !bitwise_equal(&y[size_t(m * shape.n + o)], &expected, 1);
        }
      EXPECT_EQ(num_different, 0) << describe(DType::F32, shape) << ", " << rows << " rows";
    }
  }
}

// A row's outputs are the same bits alone and among any other rows, first, in the middle or last, whichever tile
// and launch the row count takes (row counts on both sides of every tile's bound): the 3B model's down_proj (7
// slices, its few tiles a block per slice), x_proj (40 slices of 8 k-steps, few outputs: the narrow tiles), dt_proj
// (K = 160, a slice of 8 k-steps and one of 2, too short to slice), k_proj (N = 128), gate_up (N = 16384, one
// slice), a [7168, 2560] of 3 slices (its tiles keep running totals at many rows, its slices meet in the partials at
// few: the two ways of adding slices, with enough of them for the order to matter), and shapes of the small models.
TEST_F(TensorGemmTest, ARowsOutputsAreItsOwn) {
  struct Case {
    DType dtype;
    Shape shape;
  };
  for (const Case& c : {Case{DType::BF16, {2560, 8192}}, Case{DType::BF16, {192, 5120}}, Case{DType::BF16, {5120, 160}},
                        Case{DType::BF16, {128, 2560}}, Case{DType::BF16, {16384, 2560}},
                        Case{DType::BF16, {7168, 2560}},
                        Case{DType::F16, {1000, 2560}}, Case{DType::BF16, {24, 20}},
                        Case{DType::F16, {130, 3}}, Case{DType::F32, {2560, 8192}}, Case{DType::F32, {192, 5120}},
                        Case{DType::F32, {16384, 2560}}, Case{DType::F32, {24, 20}}}) {
    SCOPED_TRACE(describe(c.dtype, c.shape));
    const Weight w = make_weight(c.dtype, c.shape);
    const BatchOp<float> op = [&](const std::vector<float>& inputs, int64_t num_rows) {
      return multiply(w.matrix, inputs, num_rows, c.shape.k);
    };
    std::mt19937_64 random(73);
    expect_row_invariant(op, uniform_rows(c.shape.k, 2.0f)(random), c.shape.n, uniform_rows(c.shape.k, 2.0f),
                         {1, 2, 7, 8, 9, 17, 32, 33, 64, 96, 97, 130, 160, 161, 257, 511, 512, 600});
  }
}

// A grouped launch (tensor_gemm_grouped, the MoE experts) gives each group's rows the bits of a GEMM of that group's
// rows alone, by its own weight: groups without rows, a launch group of none (-1), a group of several tiles, a
// launch of few tiles (a block per slice, whose partial sums lie at the group's rows) and of many, 16-bit and fp32.
TEST_F(TensorGemmTest, GroupedRowsEqualTheirGroupAlone) {
  struct Case {
    std::vector<int64_t> counts;    // rows of each group
    std::vector<int32_t> launches;  // group_ids
  };
  const Shape shape{2560, 2048};  // 7 slices
  for (const DType dtype : {DType::BF16, DType::F32})
    for (const Case& c : {Case{{1, 0, 3}, {0, 2, -1}}, Case{{0, 1, 37, 300, 9}, {1, 2, 3, 4, -1, 0}}}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + ", " + std::to_string(c.counts.size()) + " groups");
      std::vector<int64_t> group_rows = {0};
      for (const int64_t count : c.counts) group_rows.push_back(group_rows.back() + count);
      const int64_t num_rows = group_rows.back();
      std::vector<Weight> weights;
      std::vector<const void*> pointers;
      for (size_t g = 0; g < c.counts.size(); ++g) {
        weights.push_back(make_weight(dtype, shape));
        pointers.push_back(weights.back().matrix.data);
      }
      const TensorView x = store_.make({num_rows, shape.k}, dtype, 1.0f);
      const DeviceBuffer<std::byte> device_x =
          upload(static_cast<const std::byte*>(x.data), num_rows * shape.k * dtype_size(dtype));
      const DeviceBuffer<int64_t> device_rows = upload(group_rows.data(), int64_t(group_rows.size()));
      const DeviceBuffer<int32_t> device_ids = upload(c.launches.data(), int64_t(c.launches.size()));
      const DeviceBuffer<const void*> device_pointers = upload(pointers.data(), int64_t(pointers.size()));
      backend::cuda::TensorGemm operands;
      operands.dtype = dtype, operands.x = device_x.data(), operands.x_stride = shape.k;
      operands.num_rows = num_rows, operands.n = shape.n, operands.k = shape.k;
      DeviceBuffer<float> grouped(num_rows * shape.n);
      operands.y = grouped.data();
      backend::cuda::TensorGemmGroups groups;
      groups.group_rows = device_rows.data(), groups.group_ids = device_ids.data();
      groups.weights = device_pointers.data(), groups.weights_aligned = true;
      groups.num_launch_groups = int64_t(c.launches.size());
      groups.max_group_rows = *std::max_element(c.counts.begin(), c.counts.end());
      backend::cuda::tensor_gemm_grouped(operands, groups, gemm_->tensor_scratch(), stream_);
      ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      const std::vector<float> y = download(grouped.data(), num_rows * shape.n);
      for (const int32_t g : c.launches) {
        if (g < 0 || c.counts[size_t(g)] == 0) continue;
        backend::cuda::TensorGemm alone = operands;
        alone.w = pointers[size_t(g)], alone.num_rows = c.counts[size_t(g)];
        alone.x = static_cast<const std::byte*>(operands.x) + group_rows[size_t(g)] * shape.k * dtype_size(dtype);
        DeviceBuffer<float> y_alone(alone.num_rows * shape.n);
        alone.y = y_alone.data();
        backend::cuda::tensor_gemm(alone, gemm_->tensor_scratch(), stream_);
        ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
        const std::vector<float> expected = download(y_alone.data(), alone.num_rows * shape.n);
        EXPECT_TRUE(bitwise_equal(&y[size_t(group_rows[size_t(g)] * shape.n)], expected.data(),
                                  alone.num_rows * shape.n))
            << "group " << g;
      }
    }
}

// Every launch that can run a GEMM (tensor_gemm.h: gemm_launches, every tile with a block per slice and without)
// gives the bits of the one tensor_gemm chooses, which is among them: the choice is speed alone.
void TensorGemmTest::expect_every_launch_agrees(DType dtype, const Shape& shape, int64_t rows) {
  SCOPED_TRACE(describe(dtype, shape) + ", " + std::to_string(rows) + " rows");
  const Weight w = make_weight(dtype, shape);
  const TensorView x_host = store_.make({rows, shape.k}, dtype, 1.0f);
  const DeviceBuffer<std::byte> x =
      upload(static_cast<const std::byte*>(x_host.data), rows * shape.k * dtype_size(dtype));
  DeviceBuffer<float> y(rows * shape.n);
  const backend::cuda::TensorGemm operands{w.matrix.data, dtype, x.data(), y.data(), rows, shape.n, shape.k, shape.k};
  const backend::cuda::GemmLaunch chosen = backend::cuda::choose_gemm_launch(operands);
  const std::vector<backend::cuda::GemmLaunch> launches = backend::cuda::gemm_launches(operands);
  EXPECT_NE(std::find(launches.begin(), launches.end(), chosen), launches.end()) << describe(chosen);
  backend::cuda::tensor_gemm(operands, chosen, gemm_->tensor_scratch(), stream_);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  const std::vector<float> expected = download(y.data(), rows * shape.n);
  for (const backend::cuda::GemmLaunch& launch : launches) {
    backend::cuda::tensor_gemm(operands, launch, gemm_->tensor_scratch(), stream_);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    EXPECT_TRUE(bitwise_equal(download(y.data(), rows * shape.n).data(), expected.data(), rows * shape.n))
        << describe(launch) << " against " << describe(chosen);
  }
}

// At shapes of the 3B model: weights of many slices (x_proj's 40) and of 7, K = 20 (staged an element at a time),
// 16-bit and fp32, 1 to 300 rows.
TEST_F(TensorGemmTest, EveryLaunchGivesTheChosenLaunchsBits) {
  for (const DType dtype : {DType::BF16, DType::F16, DType::F32})
    for (const Shape& shape : {Shape{2560, 8192}, Shape{192, 5120}, Shape{24, 20}})
      for (const int64_t rows : {1, 37, 300}) expect_every_launch_agrees(dtype, shape, rows);
}

// The same, small enough for Compute Sanitizer (scripts/gpu-test runs it under its four tools): every launch kind
// once at a few rows and at many, 16-bit and fp32.
TEST_F(TensorGemmTest, EveryLaunchKindOnce) {
  for (const DType dtype : {DType::BF16, DType::F32})
    for (const int64_t rows : {3, 200}) expect_every_launch_agrees(dtype, Shape{384, 2560}, rows);
}

// The same launch again gives the same bits: the sliced launch's per-tile counts are back at zero after it.
TEST_F(TensorGemmTest, RepeatedDecodeLaunchesAgree) {
  const Weight w = make_weight(DType::BF16, {2560, 8192});
  const backend::cpu::Matrix x = store_.matrix(3, 8192, 1.0f);
  const std::vector<float> x_values(x.data(), x.data() + 3 * 8192);
  const std::vector<float> first = multiply(w.matrix, x_values, 3, 8192);
  for (int repeat = 0; repeat < 3; ++repeat)
    EXPECT_TRUE(bitwise_equal(multiply(w.matrix, x_values, 3, 8192).data(), first.data(), 3 * 2560)) << repeat;
}

// The order follows the weight's shape alone (no GPU needed): slices for 1024 pieces of 16 outputs, none shorter
// than 8 k-steps nor than K.
TEST(GemmOrderTest, SlicesFollowTheShapeAlone) {
  const auto expect_order = [](int64_t n, int64_t k, int64_t steps, int64_t slice_steps, int64_t slices) {
    const backend::cuda::GemmOrder order = backend::cuda::gemm_order(n, k);
    EXPECT_EQ(order.num_steps, steps) << n << " x " << k;
    EXPECT_EQ(order.slice_steps, slice_steps) << n << " x " << k;
    EXPECT_EQ(order.num_slices, slices) << n << " x " << k;
  };
  expect_order(2560, 8192, 512, 74, 7);   // down_proj: 160 pieces
  expect_order(192, 5120, 320, 8, 40);    // x_proj: 12 pieces, slices of the shortest length
  expect_order(5120, 160, 10, 8, 2);      // dt_proj: a short last slice
  expect_order(65536, 2560, 160, 160, 1);  // lm_head: pieces enough
  expect_order(24, 20, 2, 2, 1);           // K shorter than the shortest slice
}

}  // namespace
}  // namespace jambo::testing
