#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/logits_ops.h"

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cooperative_groups.h>

#include <cmath>

namespace jambo::backend::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 1024;
constexpr int kWarpLanes = 32, kWarps = kThreads / kWarpLanes;

// Unsigned keys in the order of the floats (radix select and sort work on these).
__device__ inline uint32_t order_key(float x) {
  const uint32_t bits = __float_as_uint(x);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Sort key of a candidate: larger logit first, then lower id.
__device__ inline uint64_t candidate_key(float logit, int32_t id) {
  return (uint64_t(order_key(logit)) << 32) | uint64_t(0xFFFFFFFFu - uint32_t(id));
}

// The ids [first, end) thread t walks when a pass needs id order (contiguous chunks).
struct Chunk {
  int64_t first, end;
};
__device__ inline Chunk thread_chunk(int64_t vocab_size) {
  const int64_t size = (vocab_size + blockDim.x - 1) / blockDim.x;
  const int64_t first = min(vocab_size, threadIdx.x * size);
  return {first, min(vocab_size, first + size)};
}

struct MaxArg {
  float value;
  int32_t id;
};
struct HigherLogit {
  __device__ MaxArg operator()(const MaxArg& a, const MaxArg& b) const {
    return (b.value > a.value || (b.value == a.value && b.id < a.id)) ? b : a;
  }
};

// A vector's exp-sum has one decomposition whatever the step's vector count (batch invariance): kStatsSlices
// contiguous slices of ceil(V / kStatsSlices) ids, each summed in double by a block's threads over strided ids and
// then by slice_totals' tree, and the slice sums added in slice order. Max, argmax and the non-finite count are exact
// in any order. A vector takes a cluster of blocks sharing partial results through distributed shared memory: few
// vectors (decode at small batches) take kStatsSlices blocks each, one slice a block: one block per vector left a
// batch-1 step with one SM reading 256 KB twice (H200, ncu, the 3B shape's 65,536 logits: 39-48 us, 11.5 us with 8
// blocks). Many take one block each, which fills the GPU already (256 vectors: 62 us with one block each, 171 us
// with 8); it sums all its slices' partials in one pass and reduces them together (a cub reduction for each slice,
// each ending in one thread's serial walk over the warps' sums, made the step's statistics markedly slower).
constexpr int kStatsSlices = 8;
constexpr int64_t kMaxVectorsToSplit = 32;

// values[j] summed over the block's threads, for thread 0: xor butterflies within each warp, the warps' sums written
// to `warp_sums`, the same butterflies over them in warp 0. Each entry's tree is the same whatever kCount, so a
// block reducing one slice and a block reducing eight give a slice the same bits. blockDim.x is 1024.
template <int kCount>
__device__ void slice_totals(double (&values)[kCount], double (&warp_sums)[kWarps][kCount]) {
  const int lane = int(threadIdx.x) % kWarpLanes, warp = int(threadIdx.x) / kWarpLanes;
  const auto butterfly = [&] {
#pragma unroll
    for (int j = 0; j < kCount; ++j)
#pragma unroll
      for (int offset = kWarpLanes / 2; offset > 0; offset /= 2)
        values[j] += __shfl_xor_sync(0xffffffffu, values[j], offset);
  };
  butterfly();
  if (lane == 0)
#pragma unroll
    for (int j = 0; j < kCount; ++j) warp_sums[warp][j] = values[j];
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int j = 0; j < kCount; ++j) values[j] = warp_sums[lane][j];
  butterfly();
}

// The ids [begin, end) of slice s of a vector.
struct Slice {
  int64_t begin, end;
};
__device__ inline Slice stats_slice(int64_t vocab_size, int s) {
  const int64_t size = (vocab_size + kStatsSlices - 1) / kStatsSlices;
  const int64_t begin = min(vocab_size, s * size);
  return {begin, min(vocab_size, begin + size)};
}

// A block of a vector's cluster of kBlocks = kStatsSlices / kSlicesPerBlock blocks walks slices rank + j * kBlocks.
template <int kSlicesPerBlock>
__global__ void __launch_bounds__(kThreads) logits_stats_kernel(const float* logits,     // [num_vectors, V]
                                                                const int32_t* targets,  // [num_vectors]
                                                                int64_t vocab_size,
                                                                VectorStats* stats) {  // [num_vectors]
  using MaxReduce = cub::BlockReduce<MaxArg, kThreads>;
  using CountReduce = cub::BlockReduce<int, kThreads>;
  __shared__ union {
    typename MaxReduce::TempStorage max;
    typename CountReduce::TempStorage count;
  } scratch;
  __shared__ MaxArg block_best;  // this block's, then read by the cluster's blocks
  __shared__ int block_nonfinite;
  __shared__ double warp_sums[kWarps][kSlicesPerBlock];
  __shared__ double slice_sums[kSlicesPerBlock];  // of slices rank + j * kBlocks, at [j]
  constexpr int kBlocks = kStatsSlices / kSlicesPerBlock;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = int(cluster.block_rank());
  const int64_t v = blockIdx.x / kBlocks;
  const float* row = logits + device_offset(v, vocab_size);
  const auto slice = [&](int j) { return stats_slice(vocab_size, rank + j * kBlocks); };

  MaxArg best{-INFINITY, 0};
  int num_nonfinite = 0;
#pragma unroll
  for (int j = 0; j < kSlicesPerBlock; ++j)
    for (int64_t i = slice(j).begin + threadIdx.x; i < slice(j).end; i += blockDim.x) {
      const float logit = row[i];
      if (!isfinite(logit)) ++num_nonfinite;
      if (logit > best.value) best = {logit, int32_t(i)};  // a thread's ids rise, so ties keep the lower
    }
  const MaxArg reduced_best = MaxReduce(scratch.max).Reduce(best, HigherLogit());
  __syncthreads();
  const int reduced_nonfinite = CountReduce(scratch.count).Sum(num_nonfinite);
  if (threadIdx.x == 0) block_best = reduced_best, block_nonfinite = reduced_nonfinite;
  cluster.sync();
  // Every block combines the blocks' maxima in rank order: the same maximum everywhere, ties to the lower id.
  MaxArg top = *cluster.map_shared_rank(&block_best, 0);
  for (int r = 1; r < kBlocks; ++r) top = HigherLogit()(top, *cluster.map_shared_rank(&block_best, r));
  double partials[kSlicesPerBlock];  // this thread's share of each slice, all loads of the pass in flight at once
#pragma unroll
  for (int j = 0; j < kSlicesPerBlock; ++j) {
    partials[j] = 0.0;
    for (int64_t i = slice(j).begin + threadIdx.x; i < slice(j).end; i += blockDim.x)
      partials[j] += exp(double(row[i]) - double(top.value));
  }
  slice_totals(partials, warp_sums);
  if (threadIdx.x == 0)
#pragma unroll
    for (int j = 0; j < kSlicesPerBlock; ++j) slice_sums[j] = partials[j];
  cluster.sync();
  if (rank == 0 && threadIdx.x == 0) {
    double total = 0.0;
    for (int s = 0; s < kStatsSlices; ++s) total += *cluster.map_shared_rank(&slice_sums[s / kBlocks], s % kBlocks);
    int total_nonfinite = 0;
    for (int r = 0; r < kBlocks; ++r) total_nonfinite += *cluster.map_shared_rank(&block_nonfinite, r);
    VectorStats out;
    out.max_logit = top.value;
    out.argmax = top.id;
    out.log_normalizer = double(top.value) + log(total);
    out.num_nonfinite = total_nonfinite;
    out.target_logit = targets[v] >= 0 ? row[targets[v]] : 0.0f;
    stats[v] = out;
  }
  cluster.sync();  // the others' shared memory stays until rank 0 has read it
}

// Radix select of the count-th largest key (4 passes of 8 bits), then the candidates in id order (all keys
// above the threshold, and the lowest ids of those equal to it), then a bitonic sort in shared memory.
__global__ void __launch_bounds__(kThreads) top_candidates_kernel(const float* logits,         // [num_vectors, V]
                                                                  const TopRequest* requests,  // [num_requests]
                                                                  int64_t vocab_size,
                                                                  int32_t* candidate_ids,     // [sum of counts]
                                                                  float* candidate_logits) {  // [sum of counts]
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int histogram[256];
  __shared__ uint32_t prefix, mask;
  __shared__ int remaining;
  __shared__ uint64_t keys[kMaxCandidates];
  const TopRequest request = requests[blockIdx.x];
  const float* row = logits + device_offset(request.vector, vocab_size);

  if (threadIdx.x == 0) {
    prefix = 0;
    mask = 0;
    remaining = request.count;
  }
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) histogram[b] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < vocab_size; i += blockDim.x) {
      const uint32_t key = order_key(row[i]);
      if ((key & mask) == prefix) atomicAdd(&histogram[(key >> shift) & 255u], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int above = 0, bin = 255;
      for (; bin > 0 && above + histogram[bin] < remaining; --bin) above += histogram[bin];
      remaining -= above;
      prefix |= uint32_t(bin) << shift;
      mask |= 255u << shift;
    }
    __syncthreads();
  }
  const uint32_t threshold = prefix;
  const int num_equal_taken = remaining;
  const int num_above = request.count - num_equal_taken;

  const Chunk chunk = thread_chunk(vocab_size);
  int above = 0, equal = 0;
  for (int64_t i = chunk.first; i < chunk.end; ++i) {
    const uint32_t key = order_key(row[i]);
    above += key > threshold;
    equal += key == threshold;
  }
  int above_before = 0, equal_before = 0;
  Scan(scan_storage).ExclusiveSum(above, above_before);
  __syncthreads();
  Scan(scan_storage).ExclusiveSum(equal, equal_before);
  int sorted_size = 1;
  while (sorted_size < request.count) sorted_size *= 2;
  for (int i = threadIdx.x; i < sorted_size; i += blockDim.x) keys[i] = 0;  // padding sorts last
  __syncthreads();
  for (int64_t i = chunk.first; i < chunk.end; ++i) {
    const float logit = row[i];
    const uint32_t key = order_key(logit);
    if (key > threshold) keys[above_before++] = candidate_key(logit, int32_t(i));
    if (key == threshold && equal_before < num_equal_taken)
      keys[num_above + equal_before++] = candidate_key(logit, int32_t(i));
  }
  __syncthreads();
  // Bitonic sort, descending.
  for (int size = 2; size <= sorted_size; size *= 2) {
    for (int stride = size / 2; stride > 0; stride /= 2) {
      for (int i = threadIdx.x; i < sorted_size; i += blockDim.x) {
        const int partner = i ^ stride;
        if (partner > i) {
          const bool descending = (i & size) == 0;
          if ((keys[i] < keys[partner]) == descending) {
            const uint64_t swapped = keys[i];
            keys[i] = keys[partner];
            keys[partner] = swapped;
          }
        }
      }
      __syncthreads();
    }
  }
  for (int i = threadIdx.x; i < request.count; i += blockDim.x) {
    const int32_t id = int32_t(0xFFFFFFFFu - uint32_t(keys[i] & 0xFFFFFFFFu));
    candidate_ids[request.offset + i] = id;
    candidate_logits[request.offset + i] = row[id];
  }
}

// exp((logit - max) / T), or 0 below the min-p cut (as logits_ops.cpp).
__device__ inline double sampling_weight(float logit, double max_logit, double min_logit, double temperature) {
  return double(logit) < min_logit ? 0.0 : exp((double(logit) - max_logit) / temperature);
}

// Inverse CDF over every id in id order: each thread sums its contiguous chunk, a block scan gives the
// chunk offsets, and the thread whose chunk holds the draw walks it.
__device__ int32_t sample_in_id_order(const float* row, int64_t vocab_size, const SampleRequest& request,
                                      double max_logit, double min_logit) {
  using Scan = cub::BlockScan<double, kThreads>;
  using Reduce = cub::BlockReduce<double, kThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ typename Reduce::TempStorage reduce_storage;
  __shared__ double total;
  __shared__ int32_t token;
  const Chunk chunk = thread_chunk(vocab_size);
  double partial = 0.0;
  for (int64_t i = chunk.first; i < chunk.end; ++i)
    partial += sampling_weight(row[i], max_logit, min_logit, request.temperature);
  double before = 0.0;
  Scan(scan_storage).ExclusiveSum(partial, before);
  const double block_total = Reduce(reduce_storage).Sum(partial);
  if (threadIdx.x == 0) {
    total = block_total;
    token = int32_t(vocab_size - 1);  // the host's choice when rounding leaves the draw past every token
  }
  __syncthreads();
  const double target = request.uniform * total;
  if (partial > 0.0 && before <= target && target < before + partial) {
    double left = target - before;
    for (int64_t i = chunk.first; i < chunk.end; ++i) {
      const double weight = sampling_weight(row[i], max_logit, min_logit, request.temperature);
      if (weight == 0.0) continue;
      token = int32_t(i);
      left -= weight;
      if (left < 0.0) break;
    }
  }
  __syncthreads();
  return token;
}

__global__ void __launch_bounds__(kThreads) sample_tokens_kernel(const float* logits,            // [num_vectors, V]
                                                                 const SampleRequest* requests,  // [num_requests]
                                                                 int64_t vocab_size,
                                                                 const VectorStats* stats,        // [num_vectors]
                                                                 const TopRequest* top_requests,  // [num_top]
                                                                 const int32_t* candidate_ids,    // [sum of counts]
                                                                 const float* candidate_logits,   // [sum of counts]
                                                                 SampleResult* results) {         // [num_requests]
  using Reduce = cub::BlockReduce<double, kThreads>;
  __shared__ typename Reduce::TempStorage reduce_storage;
  __shared__ double weights[kMaxCandidates];
  const SampleRequest request = requests[blockIdx.x];
  const float* row = logits + device_offset(request.vector, vocab_size);
  const double max_logit = stats[request.vector].max_logit;
  const double min_logit = request.min_p > 0.0 ? max_logit + request.temperature * log(request.min_p) : -INFINITY;
  if (request.top_request < 0) {
    const int32_t token = sample_in_id_order(row, vocab_size, request, max_logit, min_logit);
    if (threadIdx.x == 0) results[blockIdx.x] = {token, row[token], 0};
    return;
  }
  // Sorted candidates: the top_k, or (top_p alone) the most likely ones with the whole vocabulary's mass.
  const TopRequest top = top_requests[request.top_request];
  const int num_candidates = request.top_k > 0 ? int(request.top_k) : top.count;
  for (int i = threadIdx.x; i < num_candidates; i += blockDim.x)
    weights[i] = sampling_weight(candidate_logits[top.offset + i], max_logit, min_logit, request.temperature);
  double vocabulary_sum = 0.0;
  if (request.top_k == 0)
    for (int64_t i = threadIdx.x; i < vocab_size; i += blockDim.x)
      vocabulary_sum += sampling_weight(row[i], max_logit, min_logit, request.temperature);
  const double vocabulary_total = Reduce(reduce_storage).Sum(vocabulary_sum);
  __syncthreads();
  if (threadIdx.x != 0) return;
  // From here on one thread, in the host's order of operations (logits_ops.cpp sample_token).
  double total = 0.0;
  if (request.top_k > 0)
    for (int i = 0; i < num_candidates; ++i) total += weights[i];
  else
    total = vocabulary_total;
  int num_kept = num_candidates;
  if (request.top_p < 1.0) {
    double mass = 0.0;
    int i = 0;
    for (; i < num_candidates; ++i) {
      mass += weights[i] / total;
      if (mass >= request.top_p) break;
    }
    if (i == num_candidates && request.top_k == 0 && num_candidates < vocab_size) {
      results[blockIdx.x] = {0, 0.0f, 1};  // the nucleus is wider than the candidates
      return;
    }
    num_kept = min(i + 1, num_candidates);
  }
  double kept_total = 0.0;
  for (int i = 0; i < num_kept; ++i) kept_total += weights[i];
  double target = request.uniform * kept_total;
  int32_t token = candidate_ids[top.offset + num_kept - 1];
  for (int i = 0; i < num_kept; ++i) {
    target -= weights[i];
    if (target < 0.0) {
      token = candidate_ids[top.offset + i];
      break;
    }
  }
  results[blockIdx.x] = {token, row[token], 0};
}

}  // namespace

void logits_stats(const float* logits, const int32_t* targets, int64_t num_vectors, int64_t vocab_size,
                  VectorStats* stats, cudaStream_t stream) {
  if (num_vectors == 0) return;
  require(num_vectors < (int64_t(1) << 31), "too many logits vectors in one step");
  const bool split = num_vectors <= kMaxVectorsToSplit;
  const int blocks_per_vector = split ? kStatsSlices : 1;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = unsigned(blocks_per_vector), cluster.val.clusterDim.y = 1, cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(num_vectors * blocks_per_vector));
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  JAMBO_CUDA_CHECK(cudaLaunchKernelEx(&config, split ? logits_stats_kernel<1> : logits_stats_kernel<kStatsSlices>,
                                      logits, targets, vocab_size, stats));
}

void top_candidates(const float* logits, const TopRequest* requests, int64_t num_requests, int64_t vocab_size,
                    int32_t* candidate_ids, float* candidate_logits, cudaStream_t stream) {
  if (num_requests == 0) return;
  top_candidates_kernel<<<unsigned(num_requests), kThreads, 0, stream>>>(logits, requests, vocab_size, candidate_ids,
                                                                         candidate_logits);
  JAMBO_CUDA_CHECK_LAUNCH(top_candidates_kernel);
}

void sample_tokens(const float* logits, const SampleRequest* requests, int64_t num_requests, int64_t vocab_size,
                   const VectorStats* stats, const TopRequest* top_requests, const int32_t* candidate_ids,
                   const float* candidate_logits, SampleResult* results, cudaStream_t stream) {
  if (num_requests == 0) return;
  sample_tokens_kernel<<<unsigned(num_requests), kThreads, 0, stream>>>(
      logits, requests, vocab_size, stats, top_requests, candidate_ids, candidate_logits, results);
  JAMBO_CUDA_CHECK_LAUNCH(sample_tokens_kernel);
}

}  // namespace jambo::backend::cuda
