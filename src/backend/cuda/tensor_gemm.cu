#include "backend/cuda/device_math.cuh"
#include "backend/cuda/tensor_gemm.h"

#include <cudaTypedefs.h>

#include <algorithm>
#include <optional>
#include <string>

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
// the products of a k-step, where each accumulator lies, and the waits its instruction needs before the
// accumulators are read (none here: mma.sync is synchronous).
template <int kWarpsM_, int kWarpsN_, int kTilesM_, int kTilesN_, int kSteps_, int kStages_>
struct Tile {
  using Element = uint16_t;
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
  static constexpr int kChunkElements = 8;                // a 16-byte copy
  static constexpr int kChunksPerRow = kDepth / kChunkElements;
  static constexpr size_t kPipelineBytes = size_t(kStages) * kStageElements * sizeof(uint16_t);
  static_assert(kTilesN == 1 || kTilesN % 2 == 0, "B fragments are loaded two tiles at a time");
  using Accumulators = float[kTilesM][kTilesN][4];

  __device__ static int staged_offset(int row, int chunk) { return row * kPitch + chunk * 8; }
  template <DType kType>
  __device__ static void multiply_step(const uint16_t* stage, int j, bool fresh, Accumulators& acc);
  template <typename F>
  __device__ static void for_each_accumulator(int64_t row0, int64_t token0, Accumulators& acc, Accumulators& totals,
                                              F&& f);
  __device__ static void begin_products(Accumulators&) {}
  __device__ static void finish_products(Accumulators&) {}
};

struct Operands {
  const void* w = nullptr;  // [n, k] in the tile's Element
  const void* x = nullptr;  // [num_rows, x_stride] in the tile's Element, the first k columns read
  float* y = nullptr;       // [num_rows, n]
  int64_t num_rows = 0, n = 0, k = 0, x_stride = 0;
  bool weights_aligned = false;  // every weight starts 16-byte aligned
  GemmOrder order;
  float* partials = nullptr;     // [num_slices, num_rows, n], for a launch of a block per slice
  int64_t slice_elements = 0;    // num_rows * n of the whole launch (grouped: every group's rows)
  uint32_t* arrivals = nullptr;  // [tiles], zero between launches
  // A grouped launch (tensor_gemm_grouped) where weights is set: the launch group of blockIdx.y is blockIdx.y /
  // group_token_tiles, and group_rows, group_ids and weights are TensorGemmGroups'.
  const void* const* weights = nullptr;
  const int64_t* group_rows = nullptr;
  const int32_t* group_ids = nullptr;
  int64_t num_groups = 1;         // launch groups
  int64_t max_group_rows = 0;     // rows of a group at most
  int64_t group_token_tiles = 0;  // tiles of x a launch group's blocks cover, set by the launch
};

// A grouped launch's block: its group's weight, rows of x and y and partial sums into p, and its tile's first row
// of x within the group into token0. False where the launch group has no group or the tile lies past the group's
// rows (every slice of a tile alike). The counts are the kernel ahead's output: waited for first.
template <typename T>
__device__ bool enter_group(Operands& p, int64_t& token0) {
  wait_for_previous_kernel();
  const int32_t group = p.group_ids[blockIdx.y / p.group_token_tiles];
  if (group < 0) return false;
  const int64_t first = p.group_rows[group];
  p.num_rows = p.group_rows[group + 1] - first;
  token0 = int64_t(blockIdx.y % p.group_token_tiles) * T::kTokens;
  if (token0 >= p.num_rows) return false;
  p.w = p.weights[group];
  p.x = static_cast<const typename T::Element*>(p.x) + device_offset(first, p.x_stride);
  p.y += device_offset(first, p.n);
  if (p.partials != nullptr) p.partials += device_offset(first, p.n);
  return true;
}

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

// Copies k columns [k0, k0 + kDepth) of kNumRows rows of a [num_rows, stride] operand from row `first` on into
// `staged` (chunk q of row r at T::staged_offset(r, q)): zeros past k_end (the end of what the block sums) and past
// the operand's last row. kWholeCopies: every row starts 16-byte aligned and holds whole copies of 16 bytes, which go
// through cp.async; otherwise the rows are copied one element at a time (the small test models: dt_proj of K = 3).
template <typename T, bool kWholeCopies, int kNumRows>
__device__ void load_rows(const void* operand, int64_t first, int64_t num_rows, int64_t stride,
                          typename T::Element* staged, int64_t k0, int64_t k_end) {
  using Element = typename T::Element;
  const Element* base = static_cast<const Element*>(operand);
  constexpr int kChunks = kNumRows * T::kChunksPerRow;
#pragma unroll
  for (int c = int(threadIdx.x); c < kChunks; c += T::kThreads) {
    const int r = c / T::kChunksPerRow, q = c % T::kChunksPerRow;
    const int64_t row = first + r, column = k0 + q * T::kChunkElements;
    const bool row_valid = row < num_rows;
    Element* chunk = staged + T::staged_offset(r, q);
    if constexpr (kWholeCopies) {
      const bool valid = row_valid && column < k_end;
      copy_16_bytes(chunk, valid ? base + device_offset(row, stride) + column : base, valid);
    } else {
#pragma unroll
      for (int e = 0; e < T::kChunkElements; ++e)
        chunk[e] = row_valid && column + e < k_end ? base[device_offset(row, stride) + column + e] : Element(0);
    }
  }
}

// A stage holds the block's kRows rows of w, then its kTokens rows of x.
template <typename T, bool kWholeCopies>
__device__ void load_weights(const Operands& p, typename T::Element* stage, int64_t row0, int64_t k0,
                             int64_t k_end) {
  load_rows<T, kWholeCopies, T::kRows>(p.w, row0, p.n, p.k, stage, k0, k_end);
}
template <typename T, bool kWholeCopies>
__device__ void load_inputs(const Operands& p, typename T::Element* stage, int64_t token0, int64_t k0,
                            int64_t k_end) {
  load_rows<T, kWholeCopies, T::kTokens>(p.x, token0, p.num_rows, p.x_stride, stage + T::kInputsOffset, k0, k_end);
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

// A block's tile on the FMA units, for fp32 weights: kRows output rows of w by kTokens rows of x, each of the
// kTokenThreads x kOutputThreads threads holding kThreadTokens x kThreadOutputs sums (outputs kOutputThreads apart,
// rows kTokenThreads apart), the operands staged kSteps k-steps at a time in a ring of kStages. A k-step of an output
// is 16 fused multiply-adds in increasing k, whichever tile holds it, so the bits follow the order alone; operands are
// multiplied as they are.
template <int kTokenThreads_, int kThreadTokens_, int kOutputThreads_, int kThreadOutputs_, int kSteps_,
          int kStages_>
struct FmaTile {
  using Element = float;
  static constexpr int kTokenThreads = kTokenThreads_, kOutputThreads = kOutputThreads_;
  static constexpr int kThreads = kTokenThreads * kOutputThreads;
  static constexpr int kThreadTokens = kThreadTokens_, kThreadOutputs = kThreadOutputs_;
  static constexpr int kRows = kOutputThreads * kThreadOutputs;
  static constexpr int kTokens = kTokenThreads * kThreadTokens;
  static constexpr int kSteps = kSteps_, kStages = kStages_;
  static constexpr int kDepth = kSteps * 16;
  // Padding a staged row by 16 bytes puts 8 consecutive rows' 16 bytes at one column in 8 different bank quads.
  static constexpr int kPitch = kDepth + 4;
  static constexpr int kStageElements = (kRows + kTokens) * kPitch;
  static constexpr int kInputsOffset = kRows * kPitch;
  static constexpr int kChunkElements = 4;
  static constexpr int kChunksPerRow = kDepth / kChunkElements;
  static constexpr size_t kPipelineBytes = size_t(kStages) * kStageElements * sizeof(float);
  static_assert(kOutputThreads % 8 == 0, "a quarter warp reads 8 rows of w");
  using Accumulators = float[kThreadTokens][kThreadOutputs];

  __device__ static int output_thread() { return int(threadIdx.x) % kOutputThreads; }
  __device__ static int token_thread() { return int(threadIdx.x) / kOutputThreads; }
  __device__ static int staged_offset(int row, int chunk) { return row * kPitch + chunk * kChunkElements; }

  template <DType kType>
  __device__ static void multiply_step(const float* stage, int j, bool fresh, Accumulators& acc) {
    static_assert(kType == DType::F32, "the FMA tile multiplies fp32 weights");
    if (fresh) {
#pragma unroll
      for (int t = 0; t < kThreadTokens; ++t)
#pragma unroll
        for (int o = 0; o < kThreadOutputs; ++o) acc[t][o] = 0.0f;
    }
    const float* w_rows = stage + output_thread() * kPitch + j * 16;
    const float* x_rows = stage + kInputsOffset + token_thread() * kPitch + j * 16;
#pragma unroll
    for (int c = 0; c < 16; c += 4) {
      float4 a[kThreadTokens], b[kThreadOutputs];
#pragma unroll
      for (int t = 0; t < kThreadTokens; ++t)
        a[t] = *reinterpret_cast<const float4*>(x_rows + t * kTokenThreads * kPitch + c);
#pragma unroll
      for (int o = 0; o < kThreadOutputs; ++o)
        b[o] = *reinterpret_cast<const float4*>(w_rows + o * kOutputThreads * kPitch + c);
#pragma unroll
      for (int t = 0; t < kThreadTokens; ++t)
#pragma unroll
        for (int o = 0; o < kThreadOutputs; ++o) {
          float& sum = acc[t][o];
          sum = __fmaf_rn(a[t].x, b[o].x, sum);
          sum = __fmaf_rn(a[t].y, b[o].y, sum);
          sum = __fmaf_rn(a[t].z, b[o].z, sum);
          sum = __fmaf_rn(a[t].w, b[o].w, sum);
        }
    }
  }

  template <typename F>
  __device__ static void for_each_accumulator(int64_t row0, int64_t token0, Accumulators& acc, Accumulators& totals,
                                              F&& f) {
#pragma unroll
    for (int t = 0; t < kThreadTokens; ++t)
#pragma unroll
      for (int o = 0; o < kThreadOutputs; ++o)
        f(Place{row0 + output_thread() + o * kOutputThreads, token0 + token_thread() + t * kTokenThreads}, acc[t][o],
          totals[t][o]);
  }
  __device__ static void begin_products(Accumulators&) {}
  __device__ static void finish_products(Accumulators&) {}
};

// d = a · b + (accumulate ? d : 0) for one k-step of wgmma m64nNk16 (fp32 accumulation), A (64 rows of w) and B (N
// rows of x) in shared memory, both K-major, by descriptor. An sm_90a instruction: other targets never launch the
// tiles using it.
#define JAMBO_WGMMA_REGISTERS_32                                                                                    \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31"
#define JAMBO_WGMMA_REGISTERS_64                                                                                     \
  JAMBO_WGMMA_REGISTERS_32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, " \
                           "%49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define JAMBO_F8(i) \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define JAMBO_F32 JAMBO_F8(0), JAMBO_F8(8), JAMBO_F8(16), JAMBO_F8(24)
#define JAMBO_F64 JAMBO_F32, JAMBO_F8(32), JAMBO_F8(40), JAMBO_F8(48), JAMBO_F8(56)
// SHAPE and TYPE name the instruction; REGISTERS list D's operands, A B P the operand numbers after them.
#define JAMBO_WGMMA(SHAPE, TYPE, REGISTERS, A, B, P, ...)                                                          \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\nwgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE "." \
               TYPE " {" REGISTERS "}, " A ", " B ", p, 1, 1, 0, 0;\n}\n"                                          \
               : __VA_ARGS__                                                                                     \
               : "l"(a), "l"(b), "r"(int(accumulate)))
template <DType kType, int kTokens>
__device__ inline void wgmma_step(float (&d)[kTokens / 2], uint64_t a, uint64_t b, bool accumulate) {
  static_assert(kTokens == 64 || kTokens == 128, "wgmma tiles of 64 or 128 rows of x");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (kTokens == 128 && kType == DType::BF16)
    JAMBO_WGMMA("m64n128k16", "bf16", JAMBO_WGMMA_REGISTERS_64, "%64", "%65", "%66", JAMBO_F64);
  else if constexpr (kTokens == 128)
    JAMBO_WGMMA("m64n128k16", "f16", JAMBO_WGMMA_REGISTERS_64, "%64", "%65", "%66", JAMBO_F64);
  else if constexpr (kType == DType::BF16)
    JAMBO_WGMMA("m64n64k16", "bf16", JAMBO_WGMMA_REGISTERS_32, "%32", "%33", "%34", JAMBO_F32);
  else
    JAMBO_WGMMA("m64n64k16", "f16", JAMBO_WGMMA_REGISTERS_32, "%32", "%33", "%34", JAMBO_F32);
#else
  (void)d, (void)a, (void)b, (void)accumulate;
  __trap();
#endif
}
#undef JAMBO_WGMMA
#undef JAMBO_F64
#undef JAMBO_F32
#undef JAMBO_F8
#undef JAMBO_WGMMA_REGISTERS_64
#undef JAMBO_WGMMA_REGISTERS_32

// The sm_90a instructions of the wgmma tile and its pipeline; empty elsewhere, where it never runs.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define JAMBO_SM90A(...) asm volatile(__VA_ARGS__)
#else
#define JAMBO_SM90A(...) (void)0
#endif
__device__ inline void wgmma_fence() { JAMBO_SM90A("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void wgmma_commit() { JAMBO_SM90A("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ inline void wgmma_wait() {
  JAMBO_SM90A("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// A warpgroup's registers a thread: fewer for the producer, more for the consumers (sm_90a's setmaxnreg).
template <int kCount>
__device__ inline void release_registers() {
  JAMBO_SM90A("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kCount));
}
template <int kCount>
__device__ inline void claim_registers() {
  JAMBO_SM90A("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kCount));
}

// The mbarriers of the pipeline: a stage's `filled` completes a phase when its copies have landed, its `emptied`
// when every consumer is done reading it.
__device__ inline void barrier_init(uint64_t* barrier, int count) {
  JAMBO_SM90A("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(barrier)), "r"(count) : "memory");
}
__device__ inline void barrier_init_fence() { JAMBO_SM90A("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ inline void barrier_arrive(uint64_t* barrier) {
  JAMBO_SM90A("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_address(barrier)) : "memory");
}
// The producer's arrival, announcing the bytes its copies will bring.
__device__ inline void barrier_arrive_expecting(uint64_t* barrier, uint32_t bytes) {
  JAMBO_SM90A("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(barrier)), "r"(bytes)
              : "memory");
}
// Returns once the barrier's phase of this parity has completed.
__device__ inline void barrier_wait(uint64_t* barrier, uint32_t parity) {
  JAMBO_SM90A(
      "{\n.reg .pred done;\nwaiting:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra waiting;\n}\n" ::"r"(shared_address(barrier)),
      "r"(parity)
      : "memory");
}
// The box of a 2-D tensor map at (column, row) into shared memory by the TMA unit, its bytes counted on `barrier`.
// Elements outside the tensor arrive as zeros.
__device__ inline void copy_box(uint16_t* staged, const CUtensorMap* map, int column, int row, uint64_t* barrier) {
  JAMBO_SM90A(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          shared_address(staged)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(column), "r"(row), "r"(shared_address(barrier))
      : "memory");
}
#undef JAMBO_SM90A

// Keeps the compiler from moving an accumulator's reads and writes across the asynchronous products.
template <int kCount>
__device__ inline void fence_accumulators(float (&values)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(values[i])::"memory");
}

// A block's tile on wgmma: 128 output rows of w (two consumer warpgroups of 64) by kTokens rows of x, staged kSteps =
// 4 k-steps (one 128-byte row of each operand) at a time in a ring of kStages, filled by the TMA unit on the orders
// of a third, producer warpgroup. A staged row's 16-byte chunk q lies at chunk q ^ (row % 8) of its row: the TMA's 128-byte swizzle, which the instruction's
// descriptors name, in stages 1024-byte aligned. The products run asynchronously: a stage is handed back to the
// producer once the products of the stage after it have been issued and its own waited for, and the accumulators
// are read only after a wait for all of them.
template <int kTokens_, int kStages_>
struct WgmmaTile {
  using Element = uint16_t;
  static constexpr int kConsumers = 256;                  // two warpgroups
  static constexpr int kThreads = kConsumers + 128;       // and the producer's
  static constexpr int kRows = 128, kTokens = kTokens_, kSteps = 4, kStages = kStages_;
  static constexpr int kDepth = kSteps * 16;
  static constexpr int kStageElements = (kRows + kTokens) * kDepth;
  static constexpr int kInputsOffset = kRows * kDepth;
  static constexpr uint32_t kStageBytes = kStageElements * sizeof(uint16_t);
  static constexpr int kAlignment = 1024;
  static constexpr size_t kPipelineBytes = size_t(kStages) * kStageBytes + kAlignment;
  static_assert(kDepth * sizeof(uint16_t) == 128, "a staged row is one row of the 128-byte swizzle");
  using Accumulators = float[kTokens / 2];

  // The thread's rank among the consumers.
  __device__ static int consumer() { return int(threadIdx.x) - 128; }

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
    const int warpgroup = consumer() / 128;
    wgmma_step<kType, kTokens>(acc, descriptor(stage + warpgroup * 64 * kDepth + j * 16),
                               descriptor(stage + kInputsOffset + j * 16), !fresh);
  }

  // wgmma's D fragment: warp w of a warpgroup holds its rows 16w + l/4 and + 8, in each n-block of 8 the columns
  // 2(l%4) and 2(l%4) + 1, as mma.sync's C.
  template <typename F>
  __device__ static void for_each_accumulator(int64_t row0, int64_t token0, Accumulators& acc, Accumulators& totals,
                                              F&& f) {
    const int warp = consumer() / kWarpSize, lane = consumer() % kWarpSize;
#pragma unroll
    for (int i = 0; i < kTokens / 2; ++i)
      f(Place{row0 + (warp / 4) * 64 + (warp % 4) * 16 + lane / 4 + ((i % 4) / 2) * 8,
              token0 + (i / 4) * 8 + (lane % 4) * 2 + i % 2},
        acc[i], totals[i]);
  }

  __device__ static void begin_products(Accumulators& acc) {
    fence_accumulators(acc);
    wgmma_fence();
  }
  // After a stage's products are issued: all but these are done.
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

// The k-steps a block sums: all of K, or in a launch of a block per slice (gridDim.z > 1) slice blockIdx.z.
struct StepRange {
  int64_t first_step, end_step;
  int64_t k_end;       // the end of the columns summed
  int64_t num_stages;  // of the tile's kSteps
};
template <typename T>
__device__ StepRange step_range(const Operands& p) {
  StepRange r;
  const bool sliced = gridDim.z > 1;
  r.first_step = sliced ? int64_t(blockIdx.z) * p.order.slice_steps : 0;
  r.end_step = sliced ? min(r.first_step + p.order.slice_steps, p.order.num_steps) : p.order.num_steps;
  r.k_end = min(r.end_step * 16, p.k);
  r.num_stages = (r.end_step - r.first_step + T::kSteps - 1) / T::kSteps;
  return r;
}

// A thread's sums as the block walks its k-steps: the current slice's in acc, and with kKeepsTotals those of the
// slices before it added up in totals.
template <typename T>
struct Sums {
  typename T::Accumulators acc = {}, totals = {};
  int64_t steps_left_in_slice = 0;  // a counter, not a division per k-step
  bool fresh = false;               // the next step starts a slice (acc then holds the last one's sum)
};

// The k-steps of the stage staged at `staged`, from step `step0` on: where a slice ends before the block's last step,
// its sum joins the totals (0 + slice 0, then + slice 1, ...).
template <DType kType, typename T, bool kKeepsTotals>
__device__ inline void multiply_stage(const typename T::Element* staged, int64_t step0, const StepRange& range,
                                      int64_t slice_steps, int64_t row0, int64_t token0, Sums<T>& sums) {
  T::begin_products(sums.acc);
#pragma unroll
  for (int j = 0; j < T::kSteps; ++j) {
    const int64_t step = step0 + j;
    if (step >= range.end_step) break;
    T::template multiply_step<kType>(staged, j, sums.fresh, sums.acc);
    sums.fresh = false;
    if constexpr (kKeepsTotals) {
      if (--sums.steps_left_in_slice == 0 && step + 1 < range.end_step) {
        T::finish_products(sums.acc);
        T::for_each_accumulator(row0, token0, sums.acc, sums.totals,
                                [&](Place, float& sum, float& total) { total = __fadd_rn(total, sum); });
        T::begin_products(sums.acc);
        sums.fresh = true;
        sums.steps_left_in_slice = slice_steps;
      }
    }
  }
}

// The block's sums into y: at once, or in a launch of a block per slice into the partials, where the last of a
// tile's blocks adds the slices' partial sums in slice order. `thread` is the caller's rank among the kThreads
// (kConsumers) threads that hold sums, and `sync` their barrier.
template <typename T, typename Sync>
__device__ void store_sums(const Operands& p, int64_t row0, int64_t token0, int64_t tile, int thread, Sums<T>& sums,
                           Sync&& sync) {
  if (gridDim.z == 1) {
    T::for_each_accumulator(row0, token0, sums.acc, sums.totals, [&](Place at, float& sum, float& total) {
      if (at.output < p.n && at.token < p.num_rows) p.y[device_offset(at.token, p.n) + at.output] = __fadd_rn(total, sum);
    });
    return;
  }
  const int64_t slice_size = p.slice_elements;
  float* partial = p.partials + device_offset(blockIdx.z, slice_size);
  T::for_each_accumulator(row0, token0, sums.acc, sums.totals, [&](Place at, float& sum, float&) {
    if (at.output < p.n && at.token < p.num_rows) partial[device_offset(at.token, p.n) + at.output] = sum;
  });
  __threadfence();  // the partials reach every block before the count says they are there
  sync();
  __shared__ bool adds_up;
  uint32_t& arrivals = p.arrivals[tile];
  if (thread == 0) adds_up = atomicAdd(&arrivals, 1u) == gridDim.z - 1;
  sync();
  if (!adds_up) return;
  __threadfence();
  // The accumulators, their own sums stored, become the running totals: slice after slice, every accumulator's
  // partial sum is read and added. A slice's loads are independent of each other and no store comes between them,
  // so they are all in flight at once (a total a thread, read slice by slice, waited on L2 once per accumulator).
  T::for_each_accumulator(row0, token0, sums.acc, sums.totals, [](Place, float& sum, float&) { sum = 0.0f; });
  for (unsigned s = 0; s < gridDim.z; ++s) {
    const float* slice = p.partials + device_offset(s, slice_size);
    T::for_each_accumulator(row0, token0, sums.acc, sums.totals, [&](Place at, float& sum, float&) {
      if (at.output < p.n && at.token < p.num_rows)
        sum = __fadd_rn(sum, __ldcg(slice + device_offset(at.token, p.n) + at.output));
    });
  }
  T::for_each_accumulator(row0, token0, sums.acc, sums.totals, [&](Place at, float& sum, float&) {
    if (at.output < p.n && at.token < p.num_rows) p.y[device_offset(at.token, p.n) + at.output] = sum;
  });
  if (thread == 0) arrivals = 0;  // ready for the next launch
}

// One launch of the GEMM on mma.sync or FMA tiles, every thread copying and multiplying, for one weight or for the
// groups of a grouped launch (enter_group). A launch of one block per (tile,
// slice) (gridDim.z = the slices) sums one slice per block into the partials (store_sums). Any other launch walks all
// of K per block, adding each slice's sum to running totals (kKeepsTotals: in registers, beside the accumulators) as
// it ends.
template <DType kType, typename T, bool kWholeCopies, bool kKeepsTotals>
__global__ void __launch_bounds__(T::kThreads, 1) tensor_gemm_kernel(const Operands operands) {
  extern __shared__ __align__(16) unsigned char shared[];
  typename T::Element* ring = reinterpret_cast<typename T::Element*>(shared);
  let_next_kernel_start();
  Operands p = operands;
  const int64_t row0 = int64_t(blockIdx.x) * T::kRows;
  int64_t token0 = int64_t(blockIdx.y) * T::kTokens;
  if (p.weights != nullptr && !enter_group<T>(p, token0)) return;
  const StepRange range = step_range<T>(p);
  const auto k0_of = [&](int64_t stage) { return (range.first_step + stage * T::kSteps) * 16; };
  constexpr int kAhead = T::kStages - 1;  // stages in flight when the block starts a stage

  // The weights are no kernel's output: the first stages' are in flight before the wait (device_math.cuh), and the
  // first commit group holds them all with the first stage's x, so stage s is in once group s is.
#pragma unroll
  for (int s = 0; s < kAhead; ++s)
    if (s < range.num_stages)
      load_weights<T, kWholeCopies>(p, ring + s * T::kStageElements, row0, k0_of(s), range.k_end);
  wait_for_previous_kernel();  // x is the previous kernel's output
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < range.num_stages)
      load_inputs<T, kWholeCopies>(p, ring + s * T::kStageElements, token0, k0_of(s), range.k_end);
    commit_copies();
  }

  Sums<T> sums;
  sums.steps_left_in_slice = p.order.slice_steps;
  for (int64_t stage = 0; stage < range.num_stages; ++stage) {
    wait_for_copies<kAhead - 1>();
    __syncthreads();  // the stage is in, and every warp is done with the buffer refilled next
    const int64_t next = stage + kAhead;
    if (next < range.num_stages) {
      typename T::Element* refilled = ring + (next % T::kStages) * T::kStageElements;
      load_weights<T, kWholeCopies>(p, refilled, row0, k0_of(next), range.k_end);
      load_inputs<T, kWholeCopies>(p, refilled, token0, k0_of(next), range.k_end);
    }
    commit_copies();
    multiply_stage<kType, T, kKeepsTotals>(ring + (stage % T::kStages) * T::kStageElements,
                                           range.first_step + stage * T::kSteps, range, p.order.slice_steps, row0,
                                           token0, sums);
  }
  store_sums<T>(p, row0, token0, int64_t(blockIdx.y) * gridDim.x + blockIdx.x, int(threadIdx.x), sums,
                [] { __syncthreads(); });
}

// The wgmma launch's operands: w and x also as TMA tensor maps, [n, k] and [num_rows, k] in boxes of 64 columns by
// the tile's rows.
struct TmaOperands {
  CUtensorMap w_map;
  CUtensorMap x_map;
  Operands p;
};

// The producer's one thread: stage after stage, once the consumers have handed its buffer back, a box of w and one of
// x into it. The first stages' weights go before the wait for the kernel ahead (they are no kernel's output).
template <typename T>
__device__ void produce_stages(const TmaOperands& t, const StepRange& range, int64_t row0, int64_t token0,
                               uint16_t* ring, uint64_t* filled, uint64_t* emptied) {
  const auto k0_of = [&](int64_t stage) { return int((range.first_step + stage * T::kSteps) * 16); };
  const int64_t num_first = min(int64_t(T::kStages), range.num_stages);
  for (int64_t s = 0; s < num_first; ++s) {
    barrier_arrive_expecting(&filled[s], T::kStageBytes);
    copy_box(ring + s * T::kStageElements, &t.w_map, k0_of(s), int(row0), &filled[s]);
  }
  wait_for_previous_kernel();  // x is the previous kernel's output
  for (int64_t s = 0; s < num_first; ++s)
    copy_box(ring + s * T::kStageElements + T::kInputsOffset, &t.x_map, k0_of(s), int(token0), &filled[s]);
  for (int64_t s = T::kStages; s < range.num_stages; ++s) {
    const int64_t slot = s % T::kStages;
    barrier_wait(&emptied[slot], uint32_t(s / T::kStages - 1) & 1);
    barrier_arrive_expecting(&filled[slot], T::kStageBytes);
    copy_box(ring + slot * T::kStageElements, &t.w_map, k0_of(s), int(row0), &filled[slot]);
    copy_box(ring + slot * T::kStageElements + T::kInputsOffset, &t.x_map, k0_of(s), int(token0), &filled[slot]);
  }
}

// The tile of block b in an order that keeps a wave's tiles near each other: kGroupTokenTiles tiles of x side by
// side, walked along N, so that a wave of blocks reads a few tiles of x and a part of w from L2 rather than all of w
// for one tile of x.
constexpr int64_t kGroupTokenTiles = 8;
struct TileIndex {
  int64_t output_tile, token_tile;
};
__device__ inline TileIndex grouped_tile(int64_t block, int64_t num_output_tiles, int64_t num_token_tiles) {
  const int64_t group_blocks = kGroupTokenTiles * num_output_tiles;
  const int64_t first_token_tile = block / group_blocks * kGroupTokenTiles;
  const int64_t group_width = min(num_token_tiles - first_token_tile, kGroupTokenTiles);
  const int64_t in_group = block % group_blocks;
  return {in_group / group_width, first_token_tile + in_group % group_width};
}

// One launch of the GEMM on the wgmma tile: the producer warpgroup's one thread keeps the ring full through the TMA
// unit while the two consumer warpgroups multiply, their sums as in tensor_gemm_kernel.
template <DType kType, typename T, bool kKeepsTotals>
__global__ void __launch_bounds__(T::kThreads, 1) wgmma_gemm_kernel(const __grid_constant__ TmaOperands t) {
  extern __shared__ __align__(16) unsigned char shared[];
  uint16_t* ring = reinterpret_cast<uint16_t*>(
      shared + (T::kAlignment - shared_address(shared) % T::kAlignment) % T::kAlignment);
  __shared__ uint64_t filled[T::kStages], emptied[T::kStages];
  let_next_kernel_start();
  const Operands& p = t.p;
  const TileIndex tile = grouped_tile(int64_t(blockIdx.y) * gridDim.x + blockIdx.x, gridDim.x, gridDim.y);
  const int64_t row0 = tile.output_tile * T::kRows, token0 = tile.token_tile * T::kTokens;
  const StepRange range = step_range<T>(p);
  if (threadIdx.x == 0) {
    for (int s = 0; s < T::kStages; ++s) {
      barrier_init(&filled[s], 1);
      barrier_init(&emptied[s], T::kConsumers);
    }
    barrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x < T::kThreads - T::kConsumers) {
    release_registers<40>();
    if (threadIdx.x == 0) produce_stages<T>(t, range, row0, token0, ring, filled, emptied);
    return;
  }
  claim_registers<232>();
  Sums<T> sums;
  sums.steps_left_in_slice = p.order.slice_steps;
  for (int64_t stage = 0; stage < range.num_stages; ++stage) {
    barrier_wait(&filled[stage % T::kStages], uint32_t(stage / T::kStages) & 1);
    multiply_stage<kType, T, kKeepsTotals>(ring + (stage % T::kStages) * T::kStageElements,
                                           range.first_step + stage * T::kSteps, range, p.order.slice_steps, row0,
                                           token0, sums);
    T::end_stage(sums.acc);
    if (stage > 0) barrier_arrive(&emptied[(stage - 1) % T::kStages]);
  }
  T::finish_products(sums.acc);
  store_sums<T>(p, row0, token0, tile.token_tile * gridDim.x + tile.output_tile, T::consumer(), sums,
                [] { asm volatile("bar.sync 1, %0;\n" ::"n"(T::kConsumers) : "memory"); });
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
// fp32 weights: up to 8 rows of x, 64 threads of one output (each weight read from shared memory once, by its
// output's thread; the rows of x broadcast); from 9 rows, 256 threads of 4 x 2 sums, 4 x 4 and 8 x 8 (the smaller
// tiles in registers enough for two blocks an SM).
template <int kTokens>
using FmaDecodeTile = FmaTile<1, kTokens, 64, 1, 4, 4>;
using Fma64x32 = FmaTile<8, 4, 32, 2, 2, 4>;
using Fma64x64 = FmaTile<16, 4, 16, 4, 2, 4>;
using Fma128x128 = FmaTile<16, 8, 16, 8, 2, 3>;
using Wgmma128x128 = WgmmaTile<128, 6>;
using Wgmma128x64 = WgmmaTile<64, 8>;

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

// Every row of w and x, of elements this wide, starts 16-byte aligned and holds whole 16-byte copies: what cp.async's
// copies and the TMA unit's boxes need.
bool aligned_16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }
bool rows_copy_whole(const Operands& p, int64_t element_bytes) {
  return p.k * element_bytes % 16 == 0 && p.x_stride * element_bytes % 16 == 0 && p.weights_aligned &&
         aligned_16(p.x);
}

// The first k columns of a [num_rows, stride] operand as a TMA tensor map: boxes of 64 columns (128 bytes, the
// swizzle's row) by box_rows rows, zeros outside. The encoder is the driver's, reached through the runtime so that
// nothing links libcuda.
CUtensorMap tensor_map(const void* base, int64_t num_rows, int64_t k, int64_t stride, int box_rows) {
  static const auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(
      driver_function("cuTensorMapEncodeTiled", 12000, "the wgmma GEMM needs a driver for CUDA 12 or later"));
  CUtensorMap map;
  const cuuint64_t dims[2] = {cuuint64_t(k), cuuint64_t(num_rows)};
  const cuuint64_t strides[1] = {cuuint64_t(stride) * sizeof(uint16_t)};
  const cuuint32_t box[2] = {64, cuuint32_t(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult status =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, const_cast<void*>(base), dims, strides, box,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  require(status == CUDA_SUCCESS, "cuTensorMapEncodeTiled refused a [" + std::to_string(num_rows) + ", " +
                                      std::to_string(k) + "] operand (error " + std::to_string(int(status)) +
                                      "; please report this)");
  return map;
}

template <DType kType, typename T, bool kKeepsTotals>
void launch_wgmma(const TmaOperands& t, dim3 grid, cudaStream_t stream) {
  static const bool configured = [] {
    JAMBO_CUDA_CHECK(cudaFuncSetAttribute(wgmma_gemm_kernel<kType, T, kKeepsTotals>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, int(T::kPipelineBytes)));
    return true;
  }();
  (void)configured;
  launch_early(wgmma_gemm_kernel<kType, T, kKeepsTotals>, grid, dim3(T::kThreads), T::kPipelineBytes, stream, t);
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
  const bool whole_copies = rows_copy_whole(p, sizeof(typename T::Element));
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

// The rows of x that choose the tile: all of them, or a grouped launch's rows a launch group.
int64_t rows_per_group(const Operands& p) { return (p.num_rows + p.num_groups - 1) / p.num_groups; }

// The partial sums and the tiles' arrival counts of a launch of a block per slice.
void reserve_slices(Operands& p, dim3 grid, TensorGemmScratch& scratch, cudaStream_t stream) {
  const int64_t num_tiles = int64_t(grid.x) * grid.y;
  p.partials = scratch.partials.reserve(device_offset(p.order.num_slices, p.slice_elements));
  if (scratch.arrivals.size() < num_tiles) {
    scratch.arrivals.reserve(num_tiles);
    JAMBO_CUDA_CHECK(cudaMemsetAsync(scratch.arrivals.data(), 0,
                                     size_t(device_offset(scratch.arrivals.size(), sizeof(uint32_t))), stream));
  }
  p.arrivals = scratch.arrivals.data();
}

// A block per tile, or per (tile, slice) with sliced; a grouped launch has a launch group's blocks cover
// max_group_rows rows.
template <DType kType, typename T>
void launch_tiles(Operands p, bool sliced, TensorGemmScratch& scratch, cudaStream_t stream) {
  p.group_token_tiles = num_blocks_for(p.max_group_rows, T::kTokens);
  require(p.group_token_tiles * p.num_groups < 65536, "a grouped GEMM of " + std::to_string(p.num_groups) +
                                                          " groups of up to " + std::to_string(p.max_group_rows) +
                                                          " rows is beyond the GEMM's grid");
  const dim3 grid(num_blocks_for(p.n, T::kRows), unsigned(p.group_token_tiles * p.num_groups),
                  sliced ? unsigned(p.order.num_slices) : 1u);
  if (sliced) reserve_slices(p, grid, scratch, stream);
  launch<kType, T>(p, grid, stream);
}

// The same on the wgmma tiles, whose operands the TMA unit reads through tensor maps.
template <DType kType, typename T>
void launch_wgmma_tiles(Operands p, bool sliced, TensorGemmScratch& scratch, cudaStream_t stream) {
  const dim3 grid(num_blocks_for(p.n, T::kRows), num_blocks_for(p.num_rows, T::kTokens),
                  sliced ? unsigned(p.order.num_slices) : 1u);
  if (sliced) reserve_slices(p, grid, scratch, stream);
  const TmaOperands t{tensor_map(p.w, p.n, p.k, p.k, T::kRows),
                      tensor_map(p.x, p.num_rows, p.k, p.x_stride, T::kTokens), p};
  if (!sliced && p.order.num_slices > 1)
    launch_wgmma<kType, T, true>(t, grid, stream);
  else
    launch_wgmma<kType, T, false>(t, grid, stream);
}

template <DType kType>
void launch_16(const Operands& p, const GemmLaunch& l, TensorGemmScratch& scratch, cudaStream_t stream) {
  switch (l.tile) {
    case GemmTile::Mma64x8: return launch_tiles<kType, Tile64x8>(p, l.sliced, scratch, stream);
    case GemmTile::Mma64x32: return launch_tiles<kType, Tile64x32>(p, l.sliced, scratch, stream);
    case GemmTile::Mma64x64: return launch_tiles<kType, Tile64x64>(p, l.sliced, scratch, stream);
    case GemmTile::Mma64x64Long: return launch_tiles<kType, Tile64x64Long>(p, l.sliced, scratch, stream);
    case GemmTile::Mma128x64: return launch_tiles<kType, Tile128x64>(p, l.sliced, scratch, stream);
    case GemmTile::Mma128x128: return launch_tiles<kType, Tile128x128>(p, l.sliced, scratch, stream);
    case GemmTile::Mma128x128Unsliced: return launch_tiles<kType, Tile128x128Unsliced>(p, l.sliced, scratch, stream);
    case GemmTile::Wgmma128x64: return launch_wgmma_tiles<kType, Wgmma128x64>(p, l.sliced, scratch, stream);
    case GemmTile::Wgmma128x128: return launch_wgmma_tiles<kType, Wgmma128x128>(p, l.sliced, scratch, stream);
    default: break;
  }
  require(false, "the " + describe(l) + " launch is not one of 16-bit weights (please report this)");
}

void launch_fp32(const Operands& p, const GemmLaunch& l, TensorGemmScratch& scratch, cudaStream_t stream) {
  switch (l.tile) {
    case GemmTile::FmaDecode2: return launch_tiles<DType::F32, FmaDecodeTile<2>>(p, l.sliced, scratch, stream);
    case GemmTile::FmaDecode8: return launch_tiles<DType::F32, FmaDecodeTile<8>>(p, l.sliced, scratch, stream);
    case GemmTile::Fma64x32: return launch_tiles<DType::F32, Fma64x32>(p, l.sliced, scratch, stream);
    case GemmTile::Fma64x64: return launch_tiles<DType::F32, Fma64x64>(p, l.sliced, scratch, stream);
    case GemmTile::Fma128x128: return launch_tiles<DType::F32, Fma128x128>(p, l.sliced, scratch, stream);
    default: break;
  }
  require(false, "the " + describe(l) + " launch is not one of fp32 weights (please report this)");
}

// A tile's outputs of w and rows of x, and what it runs on.
struct TileFacts {
  const char* name;
  int64_t rows, tokens;
  bool wgmma, fp32;
};
template <typename T>
constexpr TileFacts facts_of(const char* name, bool wgmma, bool fp32) {
  return {name, T::kRows, T::kTokens, wgmma, fp32};
}
TileFacts tile_facts(GemmTile tile) {
  switch (tile) {
    case GemmTile::Mma64x8: return facts_of<Tile64x8>("mma 64x8", false, false);
    case GemmTile::Mma64x32: return facts_of<Tile64x32>("mma 64x32", false, false);
    case GemmTile::Mma64x64: return facts_of<Tile64x64>("mma 64x64", false, false);
    case GemmTile::Mma64x64Long: return facts_of<Tile64x64Long>("mma 64x64 (4 warps)", false, false);
    case GemmTile::Mma128x64: return facts_of<Tile128x64>("mma 128x64", false, false);
    case GemmTile::Mma128x128: return facts_of<Tile128x128>("mma 128x128", false, false);
    case GemmTile::Mma128x128Unsliced: return facts_of<Tile128x128Unsliced>("mma 128x128 (4 warps)", false, false);
    case GemmTile::Wgmma128x64: return facts_of<Wgmma128x64>("wgmma 128x64", true, false);
    case GemmTile::Wgmma128x128: return facts_of<Wgmma128x128>("wgmma 128x128", true, false);
    case GemmTile::FmaDecode2: return facts_of<FmaDecodeTile<2>>("fma 64x2", false, true);
    case GemmTile::FmaDecode8: return facts_of<FmaDecodeTile<8>>("fma 64x8", false, true);
    case GemmTile::Fma64x32: return facts_of<Fma64x32>("fma 64x32", false, true);
    case GemmTile::Fma64x64: return facts_of<Fma64x64>("fma 64x64", false, true);
    case GemmTile::Fma128x128: return facts_of<Fma128x128>("fma 128x128", false, true);
  }
  return {"?", 1, 1, false, false};
}
constexpr GemmTile kEveryTile[] = {
    GemmTile::Mma64x8,     GemmTile::Mma64x32,     GemmTile::Mma64x64,   GemmTile::Mma64x64Long,
    GemmTile::Mma128x64,   GemmTile::Mma128x128,   GemmTile::Mma128x128Unsliced,
    GemmTile::Wgmma128x64, GemmTile::Wgmma128x128, GemmTile::FmaDecode2, GemmTile::FmaDecode8,
    GemmTile::Fma64x32,    GemmTile::Fma64x64,     GemmTile::Fma128x128};

// The tiles a launch of this tile has (a grouped launch's, for rows_per_group rows a group).
int64_t num_tiles(const Operands& p, GemmTile tile) {
  const TileFacts f = tile_facts(tile);
  return int64_t(num_blocks_for(p.n, int(f.rows))) * num_blocks_for(rows_per_group(p), int(f.tokens)) * p.num_groups;
}

// The TMA unit reads the operands of one weight (not a grouped launch's) whose rows copy whole, on a GPU that runs
// wgmma.
bool wgmma_reads(const Operands& p) {
  return wgmma_runs() && p.weights == nullptr && rows_copy_whole(p, sizeof(uint16_t));
}

bool launch_runs(const Operands& p, DType dtype, const GemmLaunch& l) {
  const TileFacts f = tile_facts(l.tile);
  if (f.fp32 != (dtype == DType::F32) || (f.wgmma && !wgmma_reads(p))) return false;
  if (l.sliced) return p.order.num_slices > 1;
  // Running totals beside its 128 accumulators a thread would not fit in registers.
  return l.tile != GemmTile::Mma128x128Unsliced || p.order.num_slices == 1;
}

// A block per slice where a launch has fewer tiles than this, K is long enough (kMinStepsToSlice) and there are
// slices to cut.
constexpr int64_t kMaxTilesToSlice = 200;
constexpr int64_t kMinStepsToSlice = 32;
// A tile that leaves fewer tiles than kMinTiles, or fewer than kMinOutputTiles along N, gives way to a narrower one
// (few outputs: k_proj, x_proj).
constexpr int64_t kMinTiles = 8;
constexpr int64_t kMinOutputTiles = 4;

GemmLaunch sized(const Operands& p, GemmTile tile) {
  const bool sliced =
      p.order.num_slices > 1 && p.order.num_steps >= kMinStepsToSlice && num_tiles(p, tile) < kMaxTilesToSlice;
  return {tile, sliced};
}
// tile, or narrow where tile is too wide for the weight.
GemmLaunch sized(const Operands& p, GemmTile tile, GemmTile narrow) {
  const bool too_wide = num_tiles(p, tile) < kMinTiles ||
                        num_blocks_for(p.n, int(tile_facts(tile).rows)) < kMinOutputTiles;
  return sized(p, too_wide ? narrow : tile);
}

GemmLaunch choose_fp32(const Operands& p) {
  const int64_t rows = rows_per_group(p);
  if (rows <= 2) return sized(p, GemmTile::FmaDecode2);
  if (rows <= 8) return sized(p, GemmTile::FmaDecode8);
  if (rows <= 32) return sized(p, GemmTile::Fma64x32, GemmTile::FmaDecode8);
  if (rows <= 64) return sized(p, GemmTile::Fma64x64, GemmTile::Fma64x32);
  return sized(p, GemmTile::Fma128x128, GemmTile::Fma64x64);
}

// From kMinWgmmaRows rows, where the TMA unit can read the operands, a wgmma tile walking all of K: 128 x 128 or
// 128 x 64, the one whose launch takes least time, reckoned as its waves of blocks (one an SM) times the time a
// block of it takes (kWgmmaTileTimes, relative; bench/HISTORY.md). Not where it
// leaves few tiles (kMinWgmmaTiles, or kMinWgmmaTilesLongK for a K of more than kLongKSteps k-steps: k_proj and
// x_proj below 512 rows, out_proj and down_proj below 128), where one block's walk over K is the launch's time and
// a block per slice on mma.sync beats it. Else the mma.sync tiles, chosen by rows of x from a sweep of tile shapes
// over the 3B model's GEMMs.
constexpr int64_t kMinWgmmaRows = 33;
constexpr int64_t kMinWgmmaTiles = 8, kMinWgmmaTilesLongK = 32, kLongKSteps = 256;
struct WgmmaTileTime {
  GemmTile tile;
  double block_time;  // a block's time, that of a 128 x 128 block 1
};
constexpr WgmmaTileTime kWgmmaTileTimes[] = {{GemmTile::Wgmma128x128, 1.0}, {GemmTile::Wgmma128x64, 0.8}};
constexpr int64_t kMinTile128x128Rows = 512;

// The wgmma tile of least reckoned time, or none where wgmma does not take the GEMM.
std::optional<GemmTile> choose_wgmma(const Operands& p) {
  if (rows_per_group(p) < kMinWgmmaRows || !wgmma_reads(p)) return std::nullopt;
  static const int64_t wave = current_device_attribute(cudaDevAttrMultiProcessorCount);
  GemmTile best = GemmTile::Wgmma128x128;
  double best_time = 0.0;
  for (const WgmmaTileTime& candidate : kWgmmaTileTimes) {
    const double time = double((num_tiles(p, candidate.tile) + wave - 1) / wave) * candidate.block_time;
    if (best_time == 0.0 || time < best_time) best = candidate.tile, best_time = time;
  }
  const int64_t min_tiles = p.order.num_steps > kLongKSteps ? kMinWgmmaTilesLongK : kMinWgmmaTiles;
  if (num_tiles(p, best) < min_tiles) return std::nullopt;
  return best;
}

GemmLaunch choose_16(const Operands& p) {
  if (const std::optional<GemmTile> tile = choose_wgmma(p)) return {*tile, false};
  const int64_t rows = rows_per_group(p);
  if (rows <= 8) return sized(p, GemmTile::Mma64x8);
  if (rows <= 32) return sized(p, GemmTile::Mma64x32, GemmTile::Mma64x8);
  if (rows <= 96) return sized(p, GemmTile::Mma64x64, GemmTile::Mma64x8);
  if (rows <= 160) return sized(p, GemmTile::Mma128x64, GemmTile::Mma64x64);
  if (p.order.num_slices == 1) return sized(p, GemmTile::Mma128x128Unsliced, GemmTile::Mma64x64Long);
  if (rows < kMinTile128x128Rows) return sized(p, GemmTile::Mma64x64Long, GemmTile::Mma64x64);
  return sized(p, GemmTile::Mma128x128, GemmTile::Mma64x64Long);
}

GemmLaunch choose(const Operands& p, DType dtype) { return dtype == DType::F32 ? choose_fp32(p) : choose_16(p); }

std::vector<GemmLaunch> launches(const Operands& p, DType dtype) {
  std::vector<GemmLaunch> all;
  for (const GemmTile tile : kEveryTile)
    for (const bool sliced : {false, true})
      if (launch_runs(p, dtype, {tile, sliced})) all.push_back({tile, sliced});
  return all;
}

void run(const Operands& p, DType dtype, const GemmLaunch& l, TensorGemmScratch& scratch, cudaStream_t stream) {
  require(launch_runs(p, dtype, l), "the " + describe(l) + " launch cannot run a GEMM of " +
                                        std::string(dtype_name(dtype)) + " weights [" + std::to_string(p.n) + ", " +
                                        std::to_string(p.k) + "] here (please report this)");
  if (dtype == DType::F32)
    launch_fp32(p, l, scratch, stream);
  else if (dtype == DType::BF16)
    launch_16<DType::BF16>(p, l, scratch, stream);
  else
    launch_16<DType::F16>(p, l, scratch, stream);
}

// The operands of one weight, checked.
Operands operands_of(const TensorGemm& g) {
  require((g.dtype == DType::BF16 || g.dtype == DType::F16 || g.dtype == DType::F32) && g.num_rows >= 1 &&
              g.n >= 1 && g.k >= 1 && g.x_stride >= g.k,
          "tensor_gemm takes bf16, f16 or fp32 weights, at least one row, output and column, and rows of x at least "
          "K apart (please report this)");
  Operands p;
  p.w = g.w, p.x = g.x, p.y = g.y, p.num_rows = g.num_rows, p.n = g.n, p.k = g.k, p.x_stride = g.x_stride;
  p.weights_aligned = aligned_16(g.w);
  p.order = gemm_order(g.n, g.k);
  p.slice_elements = device_offset(g.num_rows, g.n);
  p.max_group_rows = g.num_rows;
  require(p.order.num_slices < 65536 && g.num_rows <= int64_t(65535) * 64,
          "a GEMM of " + std::to_string(g.num_rows) + " rows by a [" + std::to_string(g.n) + ", " +
              std::to_string(g.k) + "] weight is beyond the tensor-core GEMM's grid");
  return p;
}

}  // namespace

std::string describe(const GemmLaunch& launch) {
  return std::string(tile_facts(launch.tile).name) + (launch.sliced ? ", a block per slice" : "");
}

std::vector<GemmLaunch> gemm_launches(const TensorGemm& g) { return launches(operands_of(g), g.dtype); }

GemmLaunch choose_gemm_launch(const TensorGemm& g) { return choose(operands_of(g), g.dtype); }

void tensor_gemm(const TensorGemm& g, TensorGemmScratch& scratch, cudaStream_t stream) {
  const Operands p = operands_of(g);
  run(p, g.dtype, choose(p, g.dtype), scratch, stream);
}

void tensor_gemm(const TensorGemm& g, const GemmLaunch& launch, TensorGemmScratch& scratch, cudaStream_t stream) {
  run(operands_of(g), g.dtype, launch, scratch, stream);
}

void tensor_gemm_grouped(const TensorGemm& g, const TensorGemmGroups& groups, TensorGemmScratch& scratch,
                         cudaStream_t stream) {
  require(groups.group_rows != nullptr && groups.group_ids != nullptr && groups.weights != nullptr &&
              groups.num_launch_groups >= 1 && groups.max_group_rows >= 1 && groups.max_group_rows <= g.num_rows,
          "tensor_gemm_grouped takes the groups' rows, ids and weights, a launch group and a bound of at least one "
          "row (please report this)");
  Operands p = operands_of(g);
  p.w = nullptr, p.weights = groups.weights, p.group_rows = groups.group_rows, p.group_ids = groups.group_ids;
  p.weights_aligned = groups.weights_aligned;
  p.num_groups = groups.num_launch_groups, p.max_group_rows = groups.max_group_rows;
  run(p, g.dtype, choose(p, g.dtype), scratch, stream);
}

}  // namespace jambo::backend::cuda
