#include "tensor_core_probe.h"

#include <stdexcept>
#include <string>

namespace jambo::testing {
namespace {

constexpr int kThreads = 128;  // four warps: a warpgroup

// The two bf16 at p and p + 1, the lower index in the low half (the fragments' packing).
__device__ inline uint32_t bf16_pair(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// mma.sync m16n8k16 (row.col): warp w takes rows 16w .. 16w + 15 of every n-block of 8, with the PTX fragment layout
// (groupID g = lane / 4, t = lane % 4: A rows g and g + 8, k 2t, 2t + 1 and those + 8; B column g, the same k; C and
// D rows g and g + 8, columns 2t and 2t + 1).
__global__ void __launch_bounds__(kThreads) mma_sync_kernel(const uint16_t* a, const uint16_t* b, const float* c,
                                                            float* d, int n, int k) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  const int row = 16 * warp + g;
  for (int block = 0; block < n / 8; ++block) {
    const int column = 8 * block + 2 * t, b_row = 8 * block + g;
    float acc[4] = {c[row * n + column], c[row * n + column + 1], c[(row + 8) * n + column],
                    c[(row + 8) * n + column + 1]};
    for (int step = 0; step < k / 16; ++step) {
      const int kk = 16 * step + 2 * t;
      const uint32_t a0 = bf16_pair(a + row * k + kk), a1 = bf16_pair(a + (row + 8) * k + kk);
      const uint32_t a2 = bf16_pair(a + row * k + kk + 8), a3 = bf16_pair(a + (row + 8) * k + kk + 8);
      const uint32_t b0 = bf16_pair(b + b_row * k + kk), b1 = bf16_pair(b + b_row * k + kk + 8);
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
          "{%0, %1, %2, %3};"
          : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
    d[row * n + column] = acc[0], d[row * n + column + 1] = acc[1];
    d[(row + 8) * n + column] = acc[2], d[(row + 8) * n + column + 1] = acc[3];
  }
}

// Element (row, kk) of a [rows, 16] tile in shared memory without swizzle, K-major: 8x8 core matrices of 128
// contiguous bytes (8 rows of 16 bytes), the two k-halves of a row group 128 bytes apart (the descriptor's leading
// byte offset), row groups 256 bytes apart (its stride byte offset).
__device__ inline int core_offset(int row, int kk) { return (row / 8) * 128 + (kk / 8) * 64 + (row % 8) * 8 + kk % 8; }

__device__ inline uint64_t tile_descriptor(const uint16_t* tile) {
  const uint64_t address = uint64_t(__cvta_generic_to_shared(tile));
  return ((address & 0x3FFFF) >> 4) | (uint64_t(128 >> 4) << 16) | (uint64_t(256 >> 4) << 32);  // swizzle 0
}

// Accumulator i of a thread of the warpgroup (wgmma's D fragment: warp w rows 16w + g and + 8, as mma.sync's C in
// each n-block of 8).
__device__ inline int fragment_row(int i) {
  return 16 * (int(threadIdx.x) / 32) + (int(threadIdx.x) % 32) / 4 + 8 * ((i % 4) / 2);
}
__device__ inline int fragment_column(int i) { return 8 * (i / 4) + 2 * (int(threadIdx.x) % 4) + i % 2; }

// Keeps the compiler from moving accesses of an accumulator across the asynchronous product.
__device__ inline void fence_accumulator(float& value) { asm volatile("" : "+f"(value)::"memory"); }

#define JAMBO_ACC4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])

// One wgmma.mma_async.m64nNk16 with scale-d 1 (D += A · B), A and B by descriptor.
template <int N>
__device__ void wgmma_step(float (&d)[N / 2], uint64_t a, uint64_t b);

template <>
__device__ inline void wgmma_step<8>(float (&d)[4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3"
      "}, %4, %5, p, 1, 1, 0, 0;\n}\n"
      : JAMBO_ACC4(0)
      : "l"(a), "l"(b), "r"(1));
}

template <>
__device__ inline void wgmma_step<64>(float (&d)[32], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : JAMBO_ACC4(0), JAMBO_ACC4(4), JAMBO_ACC4(8), JAMBO_ACC4(12), JAMBO_ACC4(16), JAMBO_ACC4(20),
        JAMBO_ACC4(24), JAMBO_ACC4(28)
      : "l"(a), "l"(b), "r"(1));
}

template <>
__device__ inline void wgmma_step<256>(float (&d)[128], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : JAMBO_ACC4(0), JAMBO_ACC4(4), JAMBO_ACC4(8), JAMBO_ACC4(12), JAMBO_ACC4(16), JAMBO_ACC4(20),
        JAMBO_ACC4(24), JAMBO_ACC4(28), JAMBO_ACC4(32), JAMBO_ACC4(36), JAMBO_ACC4(40), JAMBO_ACC4(44),
        JAMBO_ACC4(48), JAMBO_ACC4(52), JAMBO_ACC4(56), JAMBO_ACC4(60), JAMBO_ACC4(64), JAMBO_ACC4(68),
        JAMBO_ACC4(72), JAMBO_ACC4(76), JAMBO_ACC4(80), JAMBO_ACC4(84), JAMBO_ACC4(88), JAMBO_ACC4(92),
        JAMBO_ACC4(96), JAMBO_ACC4(100), JAMBO_ACC4(104), JAMBO_ACC4(108), JAMBO_ACC4(112), JAMBO_ACC4(116),
        JAMBO_ACC4(120), JAMBO_ACC4(124)
      : "l"(a), "l"(b), "r"(1));
}

#undef JAMBO_ACC4

template <int N>
__global__ void __launch_bounds__(kThreads) wgmma_kernel(const uint16_t* a, const uint16_t* b, const float* c,
                                                         float* d, int k) {
  __shared__ __align__(256) uint16_t a_tile[kProbeRows * 16];
  __shared__ __align__(256) uint16_t b_tile[N * 16];
  float acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = c[fragment_row(i) * N + fragment_column(i)];
  for (int step = 0; step < k / 16; ++step) {
    for (int e = int(threadIdx.x); e < kProbeRows * 16; e += kThreads)
      a_tile[core_offset(e / 16, e % 16)] = a[(e / 16) * k + 16 * step + e % 16];
    for (int e = int(threadIdx.x); e < N * 16; e += kThreads)
      b_tile[core_offset(e / 16, e % 16)] = b[(e / 16) * k + 16 * step + e % 16];
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // ordinary stores, read by the tensor cores
    __syncthreads();
#pragma unroll
    for (int i = 0; i < N / 2; ++i) fence_accumulator(acc[i]);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    wgmma_step<N>(acc, tile_descriptor(a_tile), tile_descriptor(b_tile));
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
    for (int i = 0; i < N / 2; ++i) fence_accumulator(acc[i]);
    __syncthreads();  // the tiles are rewritten by the next step
  }
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[fragment_row(i) * N + fragment_column(i)] = acc[i];
}

void check_launch(const char* what) {
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(error));
}

}  // namespace

bool wgmma_takes(int64_t n) { return n == 8 || n == 64 || n == 256; }

void tensor_core_product(TensorCoreInstruction instruction, const uint16_t* a, const uint16_t* b, const float* c,
                         float* d, int64_t n, int64_t k, cudaStream_t stream) {
  if (k % 16 != 0 || n % 8 != 0 || n > 256) throw std::invalid_argument("the probe takes K % 16 == 0, N % 8 == 0, N <= 256");
  if (instruction == TensorCoreInstruction::kMmaSync) {
    mma_sync_kernel<<<1, kThreads, 0, stream>>>(a, b, c, d, int(n), int(k));
    return check_launch("mma_sync_kernel");
  }
  if (!wgmma_takes(n)) throw std::invalid_argument("the probe's wgmma takes N = 8, 64 or 256, got " + std::to_string(n));
  if (n == 8) wgmma_kernel<8><<<1, kThreads, 0, stream>>>(a, b, c, d, int(k));
  if (n == 64) wgmma_kernel<64><<<1, kThreads, 0, stream>>>(a, b, c, d, int(k));
  if (n == 256) wgmma_kernel<256><<<1, kThreads, 0, stream>>>(a, b, c, d, int(k));
  check_launch("wgmma_kernel");
}

}  // namespace jambo::testing
