// The tensor-core products the probe test reads facts off (tensor_core_probe_test.cpp): D = A · Bᵀ + C for one tile,
// in the orientation an invariant GEMM would use (A: a weight's 64 output rows, B: the tokens, one output column
// each). A [64, K] and B [N, K] are bf16 bits, C and D [64, N] fp32, all row-major on the GPU; K is a multiple of 16,
// walked in k-steps of 16 in increasing k, accumulating from C. Built for sm_90a (wgmma) alone.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace jambo::testing {

enum class TensorCoreInstruction {
  kMmaSync,  // mma.sync.m16n8k16: each warp 16 rows, n-blocks of 8, any N a multiple of 8
  kWgmma,    // wgmma.mma_async.m64nNk16, A and B in shared memory: one instruction of width N a k-step
};

constexpr int64_t kProbeRows = 64;

// The N wgmma is built for here.
bool wgmma_takes(int64_t n);

void tensor_core_product(TensorCoreInstruction instruction,
                         const uint16_t* a,  // [64, K]
                         const uint16_t* b,  // [N, K]
                         const float* c,     // [64, N]
                         float* d,           // [64, N]
                         int64_t n, int64_t k, cudaStream_t stream);

}  // namespace jambo::testing
