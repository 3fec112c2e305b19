// The values of seeded random weights: the counter-based generator and the rule that turns its noise into one
// tensor's elements. One definition for the host fill (random_weights.cpp) and the GPU fill
// (backend/cuda/random_fill.cu), which must produce the same bits. Plain C++ that nvcc also compiles.
#pragma once

#include "core/dtype.h"
#include "core/host_device.h"

#include <cstdint>

namespace jambo::model {

// Element `index` of a random stream: splitmix64's output function applied to a counter. Each element depends
// only on (stream, index), so fill loops carry no state, vectorize, and split across threads in any way.
JAMBO_HOST_DEVICE inline uint64_t random_bits(uint64_t stream, int64_t index) {
  uint64_t z = stream + uint64_t(index + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// a * b and a + b, each rounded on its own. nvcc would fuse them into one fma (one rounding), which differs
// in the last bit from the host build (-ffp-contract=off keeps the two roundings).
JAMBO_HOST_DEVICE inline float multiply_rounded(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
JAMBO_HOST_DEVICE inline float add_rounded(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// Uniform on [-1, 1) from the top 24 bits.
JAMBO_HOST_DEVICE inline float uniform_symmetric(uint64_t bits) {
  return add_rounded(multiply_rounded(float(bits >> 40), 1.0f / 8388608.0f), -1.0f);
}

// How one tensor's elements are drawn from uniform noise on [-1, 1).
struct RandomInitializer {
  enum class Kind : uint8_t {
    Affine,      // offset + amplitude * noise
    RandomSign,  // +-1
    ALog,        // log(1..N) along each row, as Mamba: A = -(1..N)
    DtBias,      // softplus^-1 of a time step log-uniform in [1e-3, 1e-1], as Mamba
  };
  Kind kind = Kind::Affine;
  float offset = 0.0f;     // 1 for norm weights and D
  float amplitude = 0.0f;  // half-width of the uniform noise
  int64_t cols = 0;        // last dimension

  // Whether elements need only +, * and comparisons, and so come out bitwise equal on the host and the GPU.
  // ALog and DtBias call log and exp, whose GPU and glibc versions differ in the last bit.
  JAMBO_HOST_DEVICE bool is_arithmetic() const { return kind == Kind::Affine || kind == Kind::RandomSign; }

  // Element `index` of an arithmetic kind, from its stream.
  JAMBO_HOST_DEVICE float arithmetic_value(uint64_t stream, int64_t index) const {
    const float noise = uniform_symmetric(random_bits(stream, index));
    if (kind == Kind::RandomSign) return noise < 0.0f ? -1.0f : 1.0f;
    return add_rounded(offset, multiply_rounded(amplitude, noise));
  }
};

// Where element i of a tensor lies in the tensor whose random stream it follows: i itself (block 0), or in a
// tensor-parallel shard's slice of it (model/tensor_parallel.h), blocks of `block` consecutive elements taken
// `block_stride` apart from `block_offset` on: a run of rows (one block), a share of each row's columns (a block a
// row), or a share of each of several parts of the rows.
struct ElementMap {
  int64_t block = 0, block_stride = 0, block_offset = 0;

  JAMBO_HOST_DEVICE int64_t source(int64_t index) const {
    return block == 0 ? index : index / block * block_stride + block_offset + index % block;
  }
};

// One random tensor: element i is init's value for index map.source(i) of `stream`, rounded to `dtype`, for i in
// [0, numel).
struct RandomTensor {
  RandomInitializer init;
  uint64_t stream = 0;
  DType dtype = DType::F32;
  int64_t numel = 0;
  ElementMap map;
};

}  // namespace jambo::model
