// The GEMM against a plain double-precision product, and its batch and thread invariance.
#include "backend/cpu/gemm.h"
#include "support/random_tensors.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>

namespace jambo::backend::cpu {
namespace {

using cpu::Matrix;
using testing::TensorStore;

struct Shape {
  int64_t M, N, K;
};

class MatmulTest : public ::testing::TestWithParam<DType> {};

TEST_P(MatmulTest, MatchesDoublePrecisionProduct) {
  TensorStore store(7);
  for (Shape shape : {Shape{1, 1, 1}, Shape{3, 5, 17}, Shape{7, 33, 64}, Shape{9, 18, 100}, Shape{5, 40, 300}}) {
    const TensorView w = store.make({shape.N, shape.K}, GetParam(), 1.0f);
    const Matrix x = store.matrix(shape.M, shape.K, 1.0f);
    Matrix y;
    cpu::matmul(x, w, y);
    ASSERT_EQ(y.num_rows(), shape.M);
    ASSERT_EQ(y.num_cols(), shape.N);
    for (int64_t m = 0; m < shape.M; ++m) {
      for (int64_t n = 0; n < shape.N; ++n) {
        double expected = 0.0, magnitude = 0.0;
        for (int64_t k = 0; k < shape.K; ++k) {
          expected += double(x.row(m)[k]) * testing::weight_at(w, n, k);
          magnitude += std::fabs(double(x.row(m)[k]) * testing::weight_at(w, n, k));
        }
        EXPECT_NEAR(y.row(m)[n], expected, 1e-6 * magnitude + 1e-30)
            << "M=" << shape.M << " N=" << shape.N << " K=" << shape.K << " at (" << m << ", " << n << ")";
      }
    }
  }
}

// Each row alone, and every contiguous group of rows, gives bitwise the rows of the full product.
TEST_P(MatmulTest, RowsAreBitwiseIndependentOfTheBatch) {
  TensorStore store(11);
  const int64_t M = 11, N = 37, K = 83;
  const TensorView w = store.make({N, K}, GetParam(), 1.0f);
  const Matrix x = store.matrix(M, K, 1.0f);
  Matrix full;
  cpu::matmul(x, w, full);
  for (int64_t first = 0; first < M; ++first) {
    for (int64_t count = 1; first + count <= M; ++count) {
      Matrix part(count, N);
      cpu::matmul(x.row(first), count, w, part.data());
      ASSERT_TRUE(testing::bitwise_equal(part.data(), full.row(first), count * N))
          << "rows " << first << ".." << first + count - 1;
    }
  }
}

TEST_P(MatmulTest, ThreadCountDoesNotChangeBits) {
  TensorStore store(13);
  const int64_t M = 21, N = 130, K = 260;  // big enough to run threaded
  const TensorView w = store.make({N, K}, GetParam(), 1.0f);
  const Matrix x = store.matrix(M, K, 1.0f);
  const int saved_threads = omp_get_max_threads();
  Matrix one_thread, two_threads;
  omp_set_num_threads(1);
  cpu::matmul(x, w, one_thread);
  omp_set_num_threads(2);
  cpu::matmul(x, w, two_threads);
  omp_set_num_threads(saved_threads);
  EXPECT_TRUE(testing::bitwise_equal(one_thread.data(), two_threads.data(), M * N));
}

INSTANTIATE_TEST_SUITE_P(AllWeightDtypes, MatmulTest, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace jambo::backend::cpu
