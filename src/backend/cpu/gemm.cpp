#include "backend/cpu/gemm.h"

#include "core/error.h"

#include <algorithm>
#include <cstring>

#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

namespace jambo::backend::cpu {
namespace {

constexpr int64_t kNumLanes = 16;
using Lanes = float __attribute__((vector_size(64)));  // the 16 partial sums of one output

constexpr int64_t kBlockRows = 4;        // rows of x and of w per register block (16 accumulators)
constexpr int64_t kPanelColumns = 16;    // output columns per unit of thread work
constexpr int64_t kMinParallelFlops = 1 << 18;  // below this, threads cost more than they save

// Loads 16 consecutive values as fp32; the conversions are exact for every dtype.
inline Lanes load_lanes(const float* values) {
  Lanes out;
  std::memcpy(&out, values, sizeof out);
  return out;
}

inline Lanes load_lanes(const bf16* values) {
  using Halves = uint16_t __attribute__((vector_size(32)));
  using Words = uint32_t __attribute__((vector_size(64)));
  Halves halves;
  std::memcpy(&halves, values, sizeof halves);
  return (Lanes)(__builtin_convertvector(halves, Words) << 16);  // bf16 is the top half of fp32
}

// The conversion instructions themselves, not _Float16: clang before 15 has no _Float16 on x86 (the sanitizer and
// fuzz builds use clang 14, on machines with or without AVX-512).
inline Lanes load_lanes(const f16* values) {
#if defined(__AVX512F__)
  return (Lanes)_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(values)));
#elif defined(__F16C__)
  const __m256 low = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(values)));
  const __m256 high = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(values + 8)));
  Lanes out;
  std::memcpy(&out, &low, sizeof low);
  std::memcpy(reinterpret_cast<char*>(&out) + sizeof low, &high, sizeof high);
  return out;
#else
  Lanes out;
  for (int64_t i = 0; i < kNumLanes; ++i) out[i] = to_float(values[i]);
  return out;
#endif
}

// The last K % 16 values, zero-padded: the padding adds exact zeros to the sums.
template <typename Value>
Lanes load_partial_lanes(const Value* values, int64_t count) {
  Value padded[kNumLanes] = {};
  std::memcpy(padded, values, size_t(count) * sizeof(Value));
  return load_lanes(padded);
}

inline Lanes multiply_add(Lanes a, Lanes b, Lanes sum) {
#if defined(__AVX512F__)
  return (Lanes)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)sum);
#else
  return sum + a * b;
#endif
}

// The fixed reduction tree: lanes i and i + width are added for width 8, 4, 2, 1.
inline float sum_lanes(Lanes lanes) {
  float sums[kNumLanes];
  std::memcpy(sums, &lanes, sizeof sums);
  for (int64_t width = kNumLanes / 2; width >= 1; width /= 2)
    for (int64_t i = 0; i < width; ++i) sums[i] = sums[i] + sums[i + width];
  return sums[0];
}

// y[i, j] = x[i] · w[j] for a block of num_x rows of x and num_w rows of w, each over all of K.
template <int64_t num_x, int64_t num_w, typename Weight>
void dot_block(const float* x,   // [num_x, K]
               const Weight* w,  // [num_w, K]
               int64_t K,
               float* y,         // [num_x, y_stride]
               int64_t y_stride) {
  Lanes sums[num_x][num_w] = {};
  auto accumulate = [&](auto load_x, auto load_w) {
    Lanes x_lanes[num_x];
    Lanes w_lanes[num_w];
    for (int64_t i = 0; i < num_x; ++i) x_lanes[i] = load_x(x + element_offset(i, K));
    for (int64_t j = 0; j < num_w; ++j) w_lanes[j] = load_w(w + element_offset(j, K));
    for (int64_t i = 0; i < num_x; ++i)
      for (int64_t j = 0; j < num_w; ++j) sums[i][j] = multiply_add(x_lanes[i], w_lanes[j], sums[i][j]);
  };
  int64_t k = 0;
  for (; k + kNumLanes <= K; k += kNumLanes) {
    accumulate([k](const float* row) { return load_lanes(row + k); },
               [k](const Weight* row) { return load_lanes(row + k); });
  }
  if (k < K) {
    const int64_t rest = K - k;
    accumulate([k, rest](const float* row) { return load_partial_lanes(row + k, rest); },
               [k, rest](const Weight* row) { return load_partial_lanes(row + k, rest); });
  }
  for (int64_t i = 0; i < num_x; ++i)
    for (int64_t j = 0; j < num_w; ++j) y[element_offset(i, y_stride) + j] = sum_lanes(sums[i][j]);
}

// One tile of at most kBlockRows x kBlockRows outputs; edge tiles use the narrower kernels,
// which sum each output in exactly the same order.
template <typename Weight>
void dot_tile(const float* x, int64_t num_x, const Weight* w, int64_t num_w, int64_t K, float* y,
              int64_t y_stride) {
  if (num_x == kBlockRows && num_w == kBlockRows) {
    dot_block<kBlockRows, kBlockRows>(x, w, K, y, y_stride);
    return;
  }
  for (int64_t i = 0; i < num_x; ++i) {
    const float* x_row = x + element_offset(i, K);
    float* y_row = y + element_offset(i, y_stride);
    if (num_w == kBlockRows) {
      dot_block<1, kBlockRows>(x_row, w, K, y_row, y_stride);
      continue;
    }
    for (int64_t j = 0; j < num_w; ++j) dot_block<1, 1>(x_row, w + element_offset(j, K), K, y_row + j, y_stride);
  }
}

template <typename Weight>
void matmul_typed(const float* x, int64_t M, const Weight* w, int64_t N, int64_t K, float* y) {
  const int64_t num_panels = (N + kPanelColumns - 1) / kPanelColumns;
  const bool worth_threads = M * N * K >= kMinParallelFlops;
#pragma omp parallel for schedule(static) if (worth_threads)
  for (int64_t panel = 0; panel < num_panels; ++panel) {
    const int64_t first_column = panel * kPanelColumns;
    const int64_t end_column = std::min(N, first_column + kPanelColumns);
    for (int64_t m = 0; m < M; m += kBlockRows) {
      const int64_t num_x = std::min(kBlockRows, M - m);
      for (int64_t n = first_column; n < end_column; n += kBlockRows) {
        dot_tile(x + element_offset(m, K), num_x, w + element_offset(n, K), std::min(kBlockRows, end_column - n),
                 K, y + element_offset(m, N) + n, N);
      }
    }
  }
}

}  // namespace

void matmul(const float* x, int64_t num_rows, const TensorView& weight, float* y) {
  JAMBO_REQUIRE(weight.shape.size() == 2, "matmul: weight '{}' must be 2-D", weight.name);
  const int64_t N = weight.rows();
  const int64_t K = weight.cols();
  switch (weight.dtype) {
    case DType::F32: matmul_typed(x, num_rows, static_cast<const float*>(weight.data), N, K, y); return;
    case DType::BF16: matmul_typed(x, num_rows, static_cast<const bf16*>(weight.data), N, K, y); return;
    case DType::F16: matmul_typed(x, num_rows, static_cast<const f16*>(weight.data), N, K, y); return;
  }
}

void matmul(const Matrix& x, const TensorView& weight, Matrix& y) {
  JAMBO_REQUIRE(x.num_cols() == weight.cols(), "matmul: input has {} columns but weight '{}' has {}", x.num_cols(),
                weight.name, weight.cols());
  y.resize(x.num_rows(), weight.rows());
  matmul(x.data(), x.num_rows(), weight, y.data());
}

}  // namespace jambo::backend::cpu
