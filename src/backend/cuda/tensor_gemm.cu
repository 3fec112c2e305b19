#include "backend/cuda/device_math.cuh"
#include "backend/cuda/tensor_gemm.h"

#include <algorithm>

namespace jambo::backend::cuda {

GemmOrder gemm_order(int64_t n, int64_t k) {
  GemmOrder order;
  order.num_steps = (k + 15) / 16;
  const int64_t num_pieces = (n + 15) / 16;
  const int64_t slices_wanted = std::max<int64_t>(1, (kGemmPiecesWanted + num_pieces - 1) / num_pieces);
  order.slice_steps = std::max((order.num_steps + slices_wanted - 1) / slices_wanted,
                               std::min(kGemmMinSliceSteps, order.num_steps));
  order.num_slices = order.slice_steps == 0 ? 0 : (order.num_steps + order.slice_steps - 1) / order.slice_steps;
  return order;
}

namespace {

struct Place {
  int64_t output, token;
};

// A block's tile on mma.sync: kRows output rows of w (kWarpsM warps of kTilesM mma tiles of 16) by kTokens rows of x
// (kWarpsN warps of kTilesN tiles of 8), its operands staged in shared memory kSteps k-steps at a time in a ring of
// kStages. The kernel asks of a tile: its sizes, where chunk q (8 elements) of staged row r lies (`staged_offset`),
// the products of a k-step, where each accumulator lies, and the waits its instruction needs (none here: mma.sync is
// synchronous, so a stage may be refilled as soon as every warp is past it).
template <int kWarpsM_, int kWarpsN_, int kTilesM_, int kTilesN_, int kSteps_, int kStages_>
struct Tile {
  static constexpr int kWarpsM = kWarpsM_, kWarpsN = kWarpsN_, kTilesM = kTilesM_, kTilesN = kTilesN_;
  static constexpr int kSteps = kSteps_, kStages = kStages_;
  static constexpr int kThreads = kWarpsM * kWarpsN * kWarpSize;
  static constexpr int kRows = kWarpsM * kTilesM * 16;
  static constexpr int kTokens = kWarpsN * kTilesN * 8;
  static constexpr int kDepth = kSteps * 16;  // elements of K a stage holds
  // Padding a staged row by 16 bytes puts the 8 rows an ldmatrix reads in 8 different bank quads.
  static constexpr int kPitch = kDepth + 8;
  static constexpr int kStageElements = (kRows + kTokens) * kPitch;
  static constexpr int kInputsOffset = kRows * kPitch;  // x's rows follow w's in a stage
  static constexpr int kChunksPerRow = kDepth / 8;      // 16-byte copies
  static constexpr int kAlignment = 16;
  static constexpr int kRefillDistance = 1;  // the stage refilled is the one the block finished last
  static constexpr size_t kPipelineBytes = size_t(kStages) * kStageElements * sizeof(uint16_t);
  static_assert(kTilesN == 1 || kTilesN % 2 == 0, "B fragments are loaded two tiles at a time");
  using Accumulators = float[kTilesM][kTilesN][4];

  __device__ static int staged_offset(int row, int chunk) { return row * kPitch + chunk * 8; }
  template <DType kType>
  __device__ static void multiply_step(const uint16_t* stage, int j, bool fresh, Accumulators& acc);
  template <typename F>
  __device__ static void for_each_accumulator(int64_t row0, int64_t token0, Accumulators& acc, Accumulators& totals,
                                              F&& f);
  __device__ static void after_copies() {}
  __device__ static void begin_products(Accumulators&) {}
  __device__ static void end_stage(Accumulators&) {}
  __device__ static void finish_products(Accumulators&) {}
};

struct Operands {
  const uint16_t* w;
  const uint16_t* x;
  float* y;
  int64_t num_rows, n, k;
  GemmOrder order;
  float* partials;     // [num_slices, num_rows, n], for a launch of a block per slice
  uint32_t* arrivals;  // [tiles], zero between launches
};

__device__ inline uint32_t shared_address(const void* pointer) {
  return uint32_t(__cvta_generic_to_shared(pointer));
}

// 16 bytes from global to shared memory through L2, or zeros where !valid (src then only names a mapped address).
__device__ inline void copy_16_bytes(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ inline void commit_copies() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ inline void wait_for_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ inline void load_matrices_x4(uint32_t (&r)[4], const uint16_t* address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(address)));
}
__device__ inline void load_matrices_x2(uint32_t (&r)[2], const uint16_t* address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(shared_address(address)));
}

// d += a · b on the tensor cores: a 16x16 tile of w (rows = outputs), b 16x8 of x (columns = rows of x). Not
// volatile: registers only, so the compiler may interleave it with the next k-step's ldmatrix.
template <DType kType>
__device__ inline void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kType == DType::BF16)
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Copies k columns [k0, k0 + kDepth) of kNumRows rows of a [num_rows, k] operand from row `first` on into `staged`
// (chunk q of row r at T::staged_offset(r, q)): zeros past k_end (the end of what the block sums) and past the
// operand's last row. kWholeCopies: every row starts 16-byte aligned and holds whole copies of 16 bytes (K a multiple
// of 8), which go through cp.async; otherwise the rows are copied one element at a time (the small test models:
// dt_proj of K = 3).
template <typename T, bool kWholeCopies, int kNumRows>
__device__ void load_rows(const uint16_t* base, int64_t first, int64_t num_rows, int64_t k, uint16_t* staged,
                          int64_t k0, int64_t k_end) {
  constexpr int kChunks = kNumRows * T::kChunksPerRow;
#pragma unroll
  for (int c = int(threadIdx.x); c < kChunks; c += T::kThreads) {
    const int r = c / T::kChunksPerRow, q = c % T::kChunksPerRow;
    const int64_t row = first + r, column = k0 + q * 8;
    const bool row_valid = row < num_rows;
    uint16_t* chunk = staged + T::staged_offset(r, q);
    if constexpr (kWholeCopies) {
      const bool valid = row_valid && column < k_end;
      copy_16_bytes(chunk, valid ? base + device_offset(row, k) + column : base, valid);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        chunk[e] = row_valid && column + e < k_end ? base[device_offset(row, k) + column + e] : uint16_t(0);
    }
  }
}

// A stage holds the block's kRows rows of w, then its kTokens rows of x.
template <typename T, bool kWholeCopies>
__device__ void load_weights(const Operands& p, uint16_t* stage, int64_t row0, int64_t k0, int64_t k_end) {
  load_rows<T, kWholeCopies, T::kRows>(p.w, row0, p.n, p.k, stage, k0, k_end);
}
template <typename T, bool kWholeCopies>
__device__ void load_inputs(const Operands& p, uint16_t* stage, int64_t token0, int64_t k0, int64_t k_end) {
  load_rows<T, kWholeCopies, T::kTokens>(p.x, token0, p.num_rows, p.k, stage + T::kInputsOffset, k0, k_end);
}

// The mma's of k-step j of a staged stage for the warp's tiles: A fragments of its kTilesM tiles of w, B fragments
// of its kTilesN tiles of x, each read by ldmatrix. fresh: the step starts a slice, from zero.
template <int kWarpsM, int kWarpsN, int kTilesM, int kTilesN, int kSteps, int kStages>
template <DType kType>
__device__ inline void Tile<kWarpsM, kWarpsN, kTilesM, kTilesN, kSteps, kStages>::multiply_step(const uint16_t* stage,
                                                                                               int j, bool fresh,
                                                                                               Accumulators& acc) {
  if (fresh) {
#pragma unroll
    for (int i = 0; i < kTilesM; ++i)
#pragma unroll
      for (int jn = 0; jn < kTilesN; ++jn)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[i][jn][q] = 0.0f;
  }
  const int warp = int(threadIdx.x) / kWarpSize, lane = int(threadIdx.x) % kWarpSize;
  const uint16_t* w_tile = stage + (warp % kWarpsM) * kTilesM * 16 * kPitch + j * 16;
  const uint16_t* x_tile = stage + kInputsOffset + (warp / kWarpsM) * kTilesN * 8 * kPitch + j * 16;
  uint32_t a[kTilesM][4];
#pragma unroll
  for (int i = 0; i < kTilesM; ++i) load_matrices_x4(a[i], w_tile + (i * 16 + lane % 16) * kPitch + (lane / 16) * 8);
  uint32_t b[kTilesN][2];
  if constexpr (kTilesN == 1) {
    load_matrices_x2(b[0], x_tile + (lane % 8) * kPitch + ((lane / 8) % 2) * 8);
  } else {
#pragma unroll
    for (int jj = 0; jj < kTilesN / 2; ++jj) {
      uint32_t r[4];
      load_matrices_x4(r, x_tile + (jj * 16 + lane % 8 + (lane / 16) * 8) * kPitch + ((lane / 8) % 2) * 8);
      b[2 * jj][0] = r[0], b[2 * jj][1] = r[1], b[2 * jj + 1][0] = r[2], b[2 * jj + 1][1] = r[3];
    }
  }
#pragma unroll
  for (int i = 0; i < kTilesM; ++i)
#pragma unroll
    for (int jn = 0; jn < kTilesN; ++jn) mma_16x8x16<kType>(acc[i][jn], a[i], b[jn][0], b[jn][1]);
}

// Calls f(place, accumulator, its running total) for each of the thread's accumulators, placed for the block's
// corner (row0, token0): the mma's C fragment, lane l holding rows l/4 and l/4 + 8, columns 2(l%4) and 2(l%4) + 1.
template <int kWarpsM, int kWarpsN, int kTilesM, int kTilesN, int kSteps, int kStages>
template <typename F>
__device__ inline void Tile<kWarpsM, kWarpsN, kTilesM, kTilesN, kSteps, kStages>::for_each_accumulator(
    int64_t row0, int64_t token0, Accumulators& acc, Accumulators& totals, F&& f) {
  const int warp = int(threadIdx.x) / kWarpSize, lane = int(threadIdx.x) % kWarpSize;
#pragma unroll
  for (int i = 0; i < kTilesM; ++i)
#pragma unroll
    for (int j = 0; j < kTilesN; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q)
        f(Place{row0 + (warp % kWarpsM) * kTilesM * 16 + i * 16 + lane / 4 + (q / 2) * 8,
                token0 + (warp / kWarpsM) * kTilesN * 8 + j * 8 + (lane % 4) * 2 + q % 2},
          acc[i][j][q], totals[i][j][q]);
}

// d = a · b + (accumulate ? d : 0) for one k-step of wgmma m64n128k16 (fp32 accumulation), A (64 rows of w) and B (128 rows of x) in
// shared memory, both K-major, by descriptor. An sm_90a instruction: other targets never launch the tiles using it.
#define JAMBO_WGMMA_M64N128K16(TYPE) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " {" \
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
        "}, %64, %65, p, 1, 1, 0, 0;\n}\n" \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
        : "l"(a), "l"(b), "r"(int(accumulate)))
template <DType kType>
__device__ inline void wgmma_m64n128k16(float (&d)[64], uint64_t a, uint64_t b, bool accumulate) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (kType == DType::BF16)
    JAMBO_WGMMA_M64N128K16("bf16");
  else
    JAMBO_WGMMA_M64N128K16("f16");
#else
  (void)d, (void)a, (void)b, (void)accumulate;
  __trap();
#endif
}
#undef JAMBO_WGMMA_M64N128K16

__device__ inline void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ inline void wgmma_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int kPending>
__device__ inline void wgmma_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}

// Keeps the compiler from moving an accumulator's reads and writes across the asynchronous products.
template <int kCount>
__device__ inline void fence_accumulators(float (&values)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(values[i])::"memory");
}

// A block's tile on wgmma: 128 output rows of w (two warpgroups of 64) by 128 rows of x, staged kSteps = 4 k-steps
// (one 128-byte row of each operand) at a time in a ring of kStages. A staged row's 16-byte chunk q lies at chunk
// q ^ (row % 8) of its row, the 128-byte swizzle the instruction's descriptors name, in stages 1024-byte aligned.
// The products run asynchronously: a stage is refilled only once the products of the stage after it have been
// issued and its own have been waited for (kRefillDistance 2), and the accumulators are read only after a wait for
// all of them. Cp.async writes shared memory through the generic proxy, so a fence orders them before the tensor
// cores read.
template <int kStages_>
struct WgmmaTile {
  static constexpr int kThreads = 256, kRows = 128, kTokens = 128, kSteps = 4, kStages = kStages_;
  static constexpr int kDepth = kSteps * 16;
  static constexpr int kChunksPerRow = kDepth / 8;
  static constexpr int kStageElements = (kRows + kTokens) * kDepth;
  static constexpr int kInputsOffset = kRows * kDepth;
  static constexpr int kAlignment = 1024;
  static constexpr int kRefillDistance = 2;
  static constexpr size_t kPipelineBytes = size_t(kStages) * kStageElements * sizeof(uint16_t) + kAlignment;
  static_assert(kDepth * sizeof(uint16_t) == 128, "a staged row is one row of the 128-byte swizzle");
  using Accumulators = float[kTokens / 2];

  __device__ static int staged_offset(int row, int chunk) { return row * kDepth + (chunk ^ (row % 8)) * 8; }

  // A K-major operand at `rows` (1024-byte aligned, plus k-step j's 32 bytes) with the 128-byte swizzle: 8-row
  // groups 1024 bytes apart.
  __device__ static uint64_t descriptor(const uint16_t* rows) {
    const uint64_t address = shared_address(rows);
    return ((address & 0x3FFFF) >> 4) | uint64_t(1) << 16 | uint64_t(1024 >> 4) << 32 | uint64_t(1) << 62;
  }

  // A fresh step overwrites the accumulators (scale-d 0) rather than zeroing them first: an instruction writing
  // them while products are in flight would make the compiler serialize every wgmma.
  template <DType kType>
  __device__ static void multiply_step(const uint16_t* stage, int j, bool fresh, Accumulators& acc) {
    const int warpgroup = int(threadIdx.x) / 128;
    wgmma_m64n128k16<kType>(acc, descriptor(stage + warpgroup * 64 * kDepth + j * 16),
                            descriptor(stage + kInputsOffset + j * 16), !fresh);
  }

  // wgmma's D fragment: warp w of a warpgroup holds its rows 16w + l/4 and + 8, in each n-block of 8 the columns
  // 2(l%4) and 2(l%4) + 1, as mma.sync's C.
  template <typename F>
  __device__ static void for_each_accumulator(int64_t row0, int64_t token0, Accumulators& acc, Accumulators& totals,
                                              F&& f) {
    const int warp = int(threadIdx.x) / kWarpSize, lane = int(threadIdx.x) % kWarpSize;
#pragma unroll
    for (int i = 0; i < kTokens / 2; ++i)
      f(Place{row0 + (warp / 4) * 64 + (warp % 4) * 16 + lane / 4 + ((i % 4) / 2) * 8,
              token0 + (i / 4) * 8 + (lane % 4) * 2 + i % 2},
        acc[i], totals[i]);
  }

  __device__ static void after_copies() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
  __device__ static void begin_products(Accumulators& acc) {
    fence_accumulators(acc);
    wgmma_fence();
  }
  __device__ static void end_stage(Accumulators& acc) {
    wgmma_commit();
    wgmma_wait<1>();
    fence_accumulators(acc);
  }
  __device__ static void finish_products(Accumulators& acc) {
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(acc);
  }
};

// One launch of the GEMM. A launch of one block per (tile, slice) (gridDim.z = the slices) sums one slice per block
// into the partials, and the last of a tile's blocks adds them up in slice order. Any other launch walks all of K per
// block, adding each slice's sum to running totals (kKeepsTotals: in registers, beside the accumulators) as it ends.
template <DType kType, typename T, bool kWholeCopies, bool kKeepsTotals>
__global__ void __launch_bounds__(T::kThreads, 1) tensor_gemm_kernel(const Operands p) {
  extern __shared__ __align__(16) unsigned char shared[];
  uint16_t* ring = reinterpret_cast<uint16_t*>(
      shared + (T::kAlignment - shared_address(shared) % T::kAlignment) % T::kAlignment);
  let_next_kernel_start();
  const int64_t row0 = int64_t(blockIdx.x) * T::kRows, token0 = int64_t(blockIdx.y) * T::kTokens;
  const bool sliced = gridDim.z > 1;
  const int64_t slice_steps = p.order.slice_steps;
  const int64_t first_step = sliced ? int64_t(blockIdx.z) * slice_steps : 0;
  const int64_t end_step = sliced ? min(first_step + slice_steps, p.order.num_steps) : p.order.num_steps;
  const int64_t k_end = min(end_step * 16, p.k);
  const int64_t num_stages = (end_step - first_step + T::kSteps - 1) / T::kSteps;
  const auto k0_of = [&](int64_t stage) { return (first_step + stage * T::kSteps) * 16; };
  constexpr int kAhead = T::kStages - T::kRefillDistance;  // stages in flight when the block starts a stage

  // The weights are no kernel's output: the first stages' are in flight before the wait (device_math.cuh), and the
  // first commit group holds them all with the first stage's x, so stage s is in once group s is.
#pragma unroll
  for (int s = 0; s < kAhead; ++s)
    if (s < num_stages) load_weights<T, kWholeCopies>(p, ring + s * T::kStageElements, row0, k0_of(s), k_end);
  wait_for_previous_kernel();  // x is the previous kernel's output
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < num_stages) load_inputs<T, kWholeCopies>(p, ring + s * T::kStageElements, token0, k0_of(s), k_end);
    commit_copies();
  }

  typename T::Accumulators acc = {}, totals = {};
  int64_t steps_left_in_slice = slice_steps;  // a counter, not a division per k-step
  bool fresh = false;                         // the next step starts a slice (acc then holds the last one's sum)
  for (int64_t stage = 0; stage < num_stages; ++stage) {
    wait_for_copies<kAhead - 1>();
    T::after_copies();
    __syncthreads();  // the stage is in, and every warp is done with the buffer refilled next
    const int64_t next = stage + kAhead;
    if (next < num_stages) {
      uint16_t* refilled = ring + (next % T::kStages) * T::kStageElements;
      load_weights<T, kWholeCopies>(p, refilled, row0, k0_of(next), k_end);
      load_inputs<T, kWholeCopies>(p, refilled, token0, k0_of(next), k_end);
    }
    commit_copies();
    const uint16_t* staged = ring + (stage % T::kStages) * T::kStageElements;
    T::begin_products(acc);
#pragma unroll
    for (int j = 0; j < T::kSteps; ++j) {
      const int64_t step = first_step + stage * T::kSteps + j;
      if (step >= end_step) break;
      T::template multiply_step<kType>(staged, j, fresh, acc);
      fresh = false;
      // A slice ends before the last step: its sum joins the totals (0 + slice 0, then + slice 1, ...).
      if constexpr (kKeepsTotals) {
        if (--steps_left_in_slice == 0 && step + 1 < end_step) {
          T::finish_products(acc);
          T::for_each_accumulator(row0, token0, acc, totals,
                                  [&](Place, float& sum, float& total) { total = __fadd_rn(total, sum); });
          T::begin_products(acc);
          fresh = true;
          steps_left_in_slice = slice_steps;
        }
      }
    }
    T::end_stage(acc);
  }
  T::finish_products(acc);

  if (!sliced) {
    T::for_each_accumulator(row0, token0, acc, totals, [&](Place at, float& sum, float& total) {
      if (at.output < p.n && at.token < p.num_rows) p.y[device_offset(at.token, p.n) + at.output] = __fadd_rn(total, sum);
    });
    return;
  }
  const int64_t slice_size = device_offset(p.num_rows, p.n);
  float* partial = p.partials + device_offset(blockIdx.z, slice_size);
  T::for_each_accumulator(row0, token0, acc, totals, [&](Place at, float& sum, float&) {
    if (at.output < p.n && at.token < p.num_rows) partial[device_offset(at.token, p.n) + at.output] = sum;
  });
  __threadfence();  // the partials reach every block before the count says they are there
  __syncthreads();
  __shared__ bool adds_up;
  uint32_t& arrivals = p.arrivals[blockIdx.y * gridDim.x + blockIdx.x];
  if (threadIdx.x == 0) adds_up = atomicAdd(&arrivals, 1u) == gridDim.z - 1;
  __syncthreads();
  if (!adds_up) return;
  __threadfence();
  T::for_each_accumulator(row0, token0, acc, totals, [&](Place at, float&, float&) {
    if (at.output >= p.n || at.token >= p.num_rows) return;
    const int64_t offset = device_offset(at.token, p.n) + at.output;
    float total = 0.0f;
    for (unsigned s = 0; s < gridDim.z; ++s) total = __fadd_rn(total, __ldcg(p.partials + s * slice_size + offset));
    p.y[offset] = total;
  });
  if (threadIdx.x == 0) arrivals = 0;  // ready for the next launch
}

// The tiles (outputs of w x rows of x), chosen by rows of x from a sweep of tile shapes over the 3B model's GEMMs
// (bench/HISTORY.md). Every tile takes the same order, and a k-step's sum is the same bits on mma.sync and on wgmma
// (tensor_core_probe_test.cpp), so the choice changes the speed and never the bits.
using Tile64x8 = Tile<4, 1, 1, 1, 8, 3>;       // 4 warps of 16 x 8
using Tile64x32 = Tile<4, 1, 1, 4, 4, 4>;      // 4 warps of 16 x 32
using Tile64x64 = Tile<4, 2, 1, 4, 4, 4>;      // 8 warps of 16 x 32
using Tile64x64Long = Tile<4, 1, 1, 8, 4, 4>;  // 4 warps of 16 x 64
using Tile128x64 = Tile<4, 2, 2, 4, 4, 4>;     // 8 warps of 32 x 32
using Tile128x128 = Tile<2, 4, 4, 4, 4, 3>;    // 8 warps of 64 x 32
// 4 warps of 64 x 64, for weights of one slice only: with the running totals beside them, a warp's 128
// accumulators would not fit in its registers.
using Tile128x128Unsliced = Tile<2, 2, 4, 8, 4, 3>;
using Wgmma128x128 = WgmmaTile<5>;
constexpr int64_t kMinTile128x128Rows = 512;

// wgmma is built where the CUDA architectures include sm_90a (CMakeLists.txt), and runs on compute capability 9.0.
bool wgmma_runs() {
#if defined(JAMBO_CUDA_WGMMA)
  static const bool runs = current_device_attribute(cudaDevAttrComputeCapabilityMajor) == 9 &&
                           current_device_attribute(cudaDevAttrComputeCapabilityMinor) == 0;
  return runs;
#else
  return false;
#endif
}

template <DType kType, typename T, bool kWholeCopies, bool kKeepsTotals>
void launch(const Operands& p, dim3 grid, cudaStream_t stream) {
  static const bool configured = [] {
    JAMBO_CUDA_CHECK(cudaFuncSetAttribute(tensor_gemm_kernel<kType, T, kWholeCopies, kKeepsTotals>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, int(T::kPipelineBytes)));
    return true;
  }();
  (void)configured;
  launch_early(tensor_gemm_kernel<kType, T, kWholeCopies, kKeepsTotals>, grid, dim3(T::kThreads), T::kPipelineBytes,
               stream, p);
}

// Rows staged by cp.async where they allow it; running totals where a block walks several slices.
template <DType kType, typename T>
void launch(const Operands& p, dim3 grid, cudaStream_t stream) {
  const auto aligned = [](const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; };
  const bool whole_copies = p.k % 8 == 0 && aligned(p.w) && aligned(p.x);
  const bool keeps_totals = grid.z == 1 && p.order.num_slices > 1;
  if (whole_copies && keeps_totals)
    launch<kType, T, true, true>(p, grid, stream);
  else if (whole_copies)
    launch<kType, T, true, false>(p, grid, stream);
  else if (keeps_totals)
    launch<kType, T, false, true>(p, grid, stream);
  else
    launch<kType, T, false, false>(p, grid, stream);
}

// A block per tile, or per (tile, slice) with sliced (the slices' sums then meet in the partials).
template <DType kType, typename T>
void launch_tiles(Operands p, bool sliced, TensorGemmScratch& scratch, cudaStream_t stream) {
  const dim3 grid(num_blocks_for(p.n, T::kRows), num_blocks_for(p.num_rows, T::kTokens),
                  sliced ? unsigned(p.order.num_slices) : 1u);
  if (grid.z > 1) {
    const int64_t num_tiles = int64_t(grid.x) * grid.y;
    p.partials = scratch.partials.reserve(device_offset(p.order.num_slices, device_offset(p.num_rows, p.n)));
    if (scratch.arrivals.size() < num_tiles) {
      scratch.arrivals.reserve(num_tiles);
      JAMBO_CUDA_CHECK(cudaMemsetAsync(scratch.arrivals.data(), 0,
                                       size_t(device_offset(scratch.arrivals.size(), sizeof(uint32_t))), stream));
    }
    p.arrivals = scratch.arrivals.data();
  }
  launch<kType, T>(p, grid, stream);
}

template <typename T>
int64_t num_tiles(const Operands& p) {
  return int64_t(num_blocks_for(p.n, T::kRows)) * num_blocks_for(p.num_rows, T::kTokens);
}

// A block per slice where a launch has fewer tiles than this, K is long enough (kMinStepsToSlice) and there are
// slices to cut.
constexpr int64_t kMaxTilesToSlice = 200;
constexpr int64_t kMinStepsToSlice = 32;
// A tile that leaves fewer tiles than kMinTiles, or fewer than kMinOutputTiles along N, gives way to a narrower one
// (few outputs: k_proj, x_proj).
constexpr int64_t kMinTiles = 8;
constexpr int64_t kMinOutputTiles = 4;

template <DType kType, typename T>
void launch_sized(const Operands& p, TensorGemmScratch& scratch, cudaStream_t stream) {
  const bool sliced = p.order.num_slices > 1 && p.order.num_steps >= kMinStepsToSlice &&
                      num_tiles<T>(p) < kMaxTilesToSlice;
  launch_tiles<kType, T>(p, sliced, scratch, stream);
}

// T, or Narrow where T is too wide for the weight.
template <DType kType, typename T, typename Narrow>
void launch_sized(const Operands& p, TensorGemmScratch& scratch, cudaStream_t stream) {
  if (num_tiles<T>(p) < kMinTiles || num_blocks_for(p.n, T::kRows) < kMinOutputTiles)
    launch_sized<kType, Narrow>(p, scratch, stream);
  else
    launch_sized<kType, T>(p, scratch, stream);
}

// The wgmma tile where it has two waves of blocks (one an SM): with fewer its large tile leaves SMs idle.
constexpr int64_t kMinWgmmaWaves = 2;
bool wgmma_fills_the_gpu(const Operands& p) {
  static const int64_t num_sms = current_device_attribute(cudaDevAttrMultiProcessorCount);
  return num_tiles<Wgmma128x128>(p) >= kMinWgmmaWaves * num_sms;
}

template <DType kType>
void launch_for_rows(const Operands& p, TensorGemmScratch& scratch, cudaStream_t stream) {
  if (p.num_rows <= 8)
    launch_sized<kType, Tile64x8>(p, scratch, stream);
  else if (p.num_rows <= 32)
    launch_sized<kType, Tile64x32, Tile64x8>(p, scratch, stream);
  else if (p.num_rows <= 96)
    launch_sized<kType, Tile64x64, Tile64x8>(p, scratch, stream);
  else if (p.num_rows <= 160)
    launch_sized<kType, Tile128x64, Tile64x64>(p, scratch, stream);
  else if (wgmma_runs() && wgmma_fills_the_gpu(p))
    launch_sized<kType, Wgmma128x128, Tile64x64Long>(p, scratch, stream);
  else if (p.order.num_slices == 1)
    launch_sized<kType, Tile128x128Unsliced, Tile64x64Long>(p, scratch, stream);
  else if (p.num_rows < kMinTile128x128Rows)
    launch_sized<kType, Tile64x64Long, Tile64x64>(p, scratch, stream);
  else
    launch_sized<kType, Tile128x128, Tile64x64Long>(p, scratch, stream);
}

}  // namespace

void tensor_gemm(const TensorGemm& g, TensorGemmScratch& scratch, cudaStream_t stream) {
  require((g.dtype == DType::BF16 || g.dtype == DType::F16) && g.num_rows >= 1 && g.n >= 1 && g.k >= 1,
          "tensor_gemm takes 16-bit weights and at least one row, output and column (please report this)");
  const GemmOrder order = gemm_order(g.n, g.k);
  require(order.num_slices < 65536 && g.num_rows <= int64_t(65535) * 64,
          "a GEMM of " + std::to_string(g.num_rows) + " rows by a [" + std::to_string(g.n) + ", " +
              std::to_string(g.k) + "] weight is beyond the tensor-core GEMM's grid");
  const Operands p{g.w, g.x, g.y, g.num_rows, g.n, g.k, order, nullptr, nullptr};
  if (g.dtype == DType::BF16)
    launch_for_rows<DType::BF16>(p, scratch, stream);
  else
    launch_for_rows<DType::F16>(p, scratch, stream);
}

}  // namespace jambo::backend::cuda
