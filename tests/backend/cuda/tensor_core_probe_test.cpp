// Facts about the tensor cores that an invariant GEMM rests on (docs/DESIGN.md, "GPU invariance"), read off the GPU
// for bf16 inputs and fp32 accumulation, in the orientation such a GEMM would use: A a weight's rows, B's rows the
// tokens, so that a token is one output column (tensor_core_probe.h). Inputs are random bf16 with exponents over
// 2^-30 .. 2^30, exact zeros and subnormals.
//   P1: an output column is the same bits whatever the other columns hold and wherever it sits, and (wgmma) whatever
//       the instruction's N; an output row likewise. Asserted: a token's result would otherwise depend on its batch.
//   P2: mma.sync and wgmma give the same bits. Printed: it decides whether one design may mix them.
//   P4: a k-step of zero products leaves the accumulator's bits (masked attention tiles), and zero weights make
//       whatever finite values the inputs hold there irrelevant (K padded with zeros). Asserted.
// Also printed: how a k-step's sum compares with the exactly rounded sum, and what -0 and subnormal accumulators
// become. Lines start "[probe]", which scripts/gpu-test collects.
#include "tensor_core_probe.h"
#include "cuda_test_util.h"

#include <cstring>
#include <random>

namespace jambo::testing {
namespace {

using backend::cuda::DeviceBuffer;

constexpr int64_t kK = 64;  // four k-steps

// A bf16 of exponent 2^-spread .. 2^spread, or now and then +-0 or (with subnormals) a subnormal.
uint16_t random_bf16(std::mt19937_64& random, int spread = 30, bool subnormals = true) {
  const uint64_t r = random();
  const uint16_t sign = uint16_t((r >> 8) & 1) << 15;
  const int kind = int(r % 100);
  if (kind < 5) return sign;
  if (kind < 8 && subnormals) return uint16_t(sign | (1 + (r >> 9) % 127));  // exponent field 0
  const int exponent = 127 - spread + int((r >> 16) % uint64_t(2 * spread + 1));
  return uint16_t(sign | exponent << 7 | ((r >> 24) & 127));
}

float bf16_value(uint16_t bits) {
  const uint32_t wide = uint32_t(bits) << 16;
  float value;
  std::memcpy(&value, &wide, 4);
  return value;
}

std::vector<uint16_t> random_bf16s(int64_t count, std::mt19937_64& random) {
  std::vector<uint16_t> values(static_cast<size_t>(count));
  for (uint16_t& value : values) value = random_bf16(random);
  return values;
}

std::vector<float> random_floats(int64_t count, std::mt19937_64& random) {
  std::vector<float> values(static_cast<size_t>(count));
  for (float& value : values) value = bf16_value(random_bf16(random));
  return values;
}

struct Operands {
  std::vector<uint16_t> a;  // [64, K]
  std::vector<uint16_t> b;  // [N, K]
  std::vector<float> c;     // [64, N]
  int64_t n = 8, k = kK;
};

Operands random_operands(int64_t n, int64_t k, std::mt19937_64& random) {
  return {random_bf16s(kProbeRows * k, random), random_bf16s(n * k, random), random_floats(kProbeRows * n, random), n,
          k};
}

const char* name(TensorCoreInstruction instruction) {
  return instruction == TensorCoreInstruction::kMmaSync ? "mma.sync m16n8k16" : "wgmma m64nNk16";
}

// D [64, N] of the operands.
std::vector<float> product(TensorCoreInstruction instruction, const Operands& x) {
  const DeviceBuffer<uint16_t> a = upload(x.a.data(), int64_t(x.a.size())), b = upload(x.b.data(), int64_t(x.b.size()));
  const DeviceBuffer<float> c = upload(x.c.data(), int64_t(x.c.size()));
  DeviceBuffer<float> d(kProbeRows * x.n);
  tensor_core_product(instruction, a.data(), b.data(), c.data(), d.data(), x.n, x.k, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return download(d.data(), kProbeRows * x.n);
}

double exact_entry(const Operands& x, int64_t m, int64_t j) {
  double sum = x.c[size_t(m * x.n + j)];
  for (int64_t i = 0; i < x.k; ++i) sum += double(bf16_value(x.a[size_t(m * x.k + i)])) * bf16_value(x.b[size_t(j * x.k + i)]);
  return sum;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

std::vector<float> column(const std::vector<float>& d, int64_t n, int64_t j) {
  std::vector<float> out;
  for (int64_t m = 0; m < kProbeRows; ++m) out.push_back(d[size_t(m * n + j)]);
  return out;
}

void expect_same_bits(const std::vector<float>& actual, const std::vector<float>& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i)
    ASSERT_TRUE(same_bits(actual[i], expected[i])) << what << ", entry " << i << ": " << actual[i] << " against "
                                                   << expected[i];
}

class TensorCoreProbeTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    cudaDeviceProp properties{};
    ASSERT_EQ(cudaGetDeviceProperties(&properties, 0), cudaSuccess);
    if (properties.major != 9 || properties.minor != 0)
      GTEST_SKIP() << "the probe is built for sm_90a, the GPU is sm_" << properties.major << properties.minor;
  }

  // The instructions and the widths N each is probed at.
  static std::vector<std::pair<TensorCoreInstruction, int64_t>> shapes() {
    return {{TensorCoreInstruction::kMmaSync, 8},
            {TensorCoreInstruction::kMmaSync, 64},
            {TensorCoreInstruction::kWgmma, 8},
            {TensorCoreInstruction::kWgmma, 64},
            {TensorCoreInstruction::kWgmma, 256}};
  }

  std::mt19937_64 random_{5};
};

// The kernels' fragment and shared-memory layouts are right (the products are close to the exact ones), so that
// the bitwise facts below are about the instructions, not about a misplaced operand.
TEST_F(TensorCoreProbeTest, ProductsAreCloseToTheExactOnes) {
  for (const auto& [instruction, n] : shapes()) {
    const Operands x = random_operands(n, kK, random_);
    const std::vector<float> d = product(instruction, x);
    for (int64_t m = 0; m < kProbeRows; ++m)
      for (int64_t j = 0; j < n; ++j) {
        double magnitude = std::fabs(x.c[size_t(m * n + j)]);
        for (int64_t i = 0; i < kK; ++i)
          magnitude += std::fabs(double(bf16_value(x.a[size_t(m * kK + i)])) * bf16_value(x.b[size_t(j * kK + i)]));
        ASSERT_NEAR(d[size_t(m * n + j)], exact_entry(x, m, j), 1e-5 * magnitude)
            << name(instruction) << ", N " << n << ", row " << m << ", column " << j;
      }
  }
}

// P1, columns: a probe token (its B row and its C column) alone in an instruction of width 8 at column 0, then at
// the first, second, middle and last column of every width among random others.
TEST_F(TensorCoreProbeTest, AColumnIsItsOwnWhateverTheOthersAndItsPlace) {
  const std::vector<uint16_t> a = random_bf16s(kProbeRows * kK, random_), probe_b = random_bf16s(kK, random_);
  const std::vector<float> probe_c = random_floats(kProbeRows, random_);
  const auto with_probe = [&](int64_t n, int64_t j, bool random_others) {
    Operands x{a, random_others ? random_bf16s(n * kK, random_) : std::vector<uint16_t>(size_t(n * kK), 0),
               random_others ? random_floats(kProbeRows * n, random_) : std::vector<float>(size_t(kProbeRows * n), 0.0f),
               n, kK};
    std::copy(probe_b.begin(), probe_b.end(), x.b.begin() + j * kK);
    for (int64_t m = 0; m < kProbeRows; ++m) x.c[size_t(m * n + j)] = probe_c[size_t(m)];
    return x;
  };
  for (const TensorCoreInstruction instruction : {TensorCoreInstruction::kMmaSync, TensorCoreInstruction::kWgmma}) {
    const std::vector<float> alone = column(product(instruction, with_probe(8, 0, false)), 8, 0);
    for (const auto& [shape_instruction, n] : shapes()) {
      if (shape_instruction != instruction) continue;
      for (const int64_t j : {int64_t(0), int64_t(1), n / 2, n - 1})
        for (int trial = 0; trial < 2; ++trial)
          expect_same_bits(column(product(instruction, with_probe(n, j, true)), n, j), alone,
                           std::string(name(instruction)) + ", N " + std::to_string(n) + ", column " +
                               std::to_string(j));
    }
  }
  std::printf("[probe] P1 columns: a token's output column of mma.sync m16n8k16 and of wgmma m64nNk16 (N 8, 64, 256) "
              "is the same bits at every place and beside any other columns\n");
}

// P1, rows: a probe weight row (its A row and its C row) at rows 0, 1, 8, 15, 16 and 63 among random rows.
TEST_F(TensorCoreProbeTest, ARowIsItsOwnWhateverTheOthersAndItsPlace) {
  for (const auto& [instruction, n] : shapes()) {
    const Operands base = random_operands(n, kK, random_);
    const std::vector<uint16_t> probe_a = random_bf16s(kK, random_);
    const std::vector<float> probe_c = random_floats(n, random_);
    std::vector<float> first;
    for (const int64_t m : {0, 1, 8, 15, 16, 63}) {
      Operands x = random_operands(n, kK, random_);
      x.b = base.b;
      std::copy(probe_a.begin(), probe_a.end(), x.a.begin() + m * kK);
      std::copy(probe_c.begin(), probe_c.end(), x.c.begin() + m * n);
      const std::vector<float> d = product(instruction, x);
      const std::vector<float> row(d.begin() + m * n, d.begin() + (m + 1) * n);
      if (first.empty()) first = row;
      expect_same_bits(row, first, std::string(name(instruction)) + ", N " + std::to_string(n) + ", row " +
                                       std::to_string(m));
    }
  }
  std::printf("[probe] P1 rows: an output row is the same bits at every row place, for both instructions\n");
}

// P2, printed: element by element, mma.sync against wgmma on the same operands, over four k-steps and over one.
TEST_F(TensorCoreProbeTest, MmaSyncAgainstWgmmaIsPrinted) {
  for (const int64_t k : {int64_t(16), kK}) {
    for (const int64_t n : {int64_t(8), int64_t(64), int64_t(256)}) {
      const Operands x = random_operands(n, k, random_);
      const std::vector<float> sync = product(TensorCoreInstruction::kMmaSync, x),
                               group = product(TensorCoreInstruction::kWgmma, x);
      int64_t equal = 0;
      for (size_t i = 0; i < sync.size(); ++i) equal += same_bits(sync[i], group[i]);
      std::printf("[probe] P2 mma.sync m16n8k16 against wgmma m64n%dk16, K %d: %d of %d elements bitwise equal\n",
                  int(n), int(k), int(equal), int(sync.size()));
    }
  }
}

// P4: B all zeros leaves C's bits (asserted for C's normal values; printed for -0 and subnormal C); zero A entries past
// K = 40 make B's entries there irrelevant.
TEST_F(TensorCoreProbeTest, ZeroProductsLeaveTheAccumulator) {
  for (const auto& [instruction, n] : shapes()) {
    const std::string what = std::string(name(instruction)) + ", N " + std::to_string(n);
    Operands x = random_operands(n, kK, random_);
    std::fill(x.b.begin(), x.b.end(), uint16_t(0));
    x.c[0] = -0.0f;
    x.c[1] = bf16_value(0x0005);  // a subnormal
    const std::vector<float> d = product(instruction, x);
    for (size_t i = 2; i < d.size(); ++i) {
      if (std::fpclassify(x.c[i]) != FP_NORMAL) continue;
      ASSERT_TRUE(same_bits(d[i], x.c[i])) << what << ", entry " << i;
    }
    std::printf("[probe] P4 %s, N %d: C + A * 0 keeps every normal C; -0 becomes %s, a subnormal %s\n",
                name(instruction), int(n), std::signbit(d[0]) ? "-0" : "+0",
                same_bits(d[1], x.c[1]) ? "is kept" : "is flushed");

    Operands padded = random_operands(n, kK, random_);
    for (int64_t m = 0; m < kProbeRows; ++m)
      std::fill(padded.a.begin() + m * kK + 40, padded.a.begin() + (m + 1) * kK, uint16_t(0));
    Operands zeroed = padded;
    for (int64_t j = 0; j < n; ++j) std::fill(zeroed.b.begin() + j * kK + 40, zeroed.b.begin() + (j + 1) * kK, uint16_t(0));
    expect_same_bits(product(instruction, padded), product(instruction, zeroed), what + ", inputs past K = 40");
  }
}

// Printed: a single k-step from a zero accumulator against the exactly rounded sum of its 16 products, and against
// fp32 fused multiply-adds in k order. Exponents within 2^-8 .. 2^8 and no subnormals, so that the double sum is
// exact.
TEST_F(TensorCoreProbeTest, RoundingOfAKStepIsPrinted) {
  for (const TensorCoreInstruction instruction : {TensorCoreInstruction::kMmaSync, TensorCoreInstruction::kWgmma}) {
    Operands x{{}, {}, std::vector<float>(size_t(kProbeRows * 64), 0.0f), 64, 16};
    for (int64_t i = 0; i < kProbeRows * 16; ++i) x.a.push_back(random_bf16(random_, 8, false));
    for (int64_t i = 0; i < 64 * 16; ++i) x.b.push_back(random_bf16(random_, 8, false));
    const std::vector<float> d = product(instruction, x);
    int64_t exact = 0, chain = 0;
    for (int64_t m = 0; m < kProbeRows; ++m)
      for (int64_t j = 0; j < x.n; ++j) {
        const float value = d[size_t(m * x.n + j)];
        exact += same_bits(value, float(exact_entry(x, m, j)));
        float sum = 0.0f;
        for (int64_t i = 0; i < x.k; ++i)
          sum = std::fma(bf16_value(x.a[size_t(m * x.k + i)]), bf16_value(x.b[size_t(j * x.k + i)]), sum);
        chain += same_bits(value, sum);
      }
    std::printf("[probe] %s, one k-step of 16 products: %d of %d equal the exactly rounded sum, %d the fp32 FMA chain\n",
                name(instruction), int(exact), int(d.size()), int(chain));
  }
}

}  // namespace
}  // namespace jambo::testing
