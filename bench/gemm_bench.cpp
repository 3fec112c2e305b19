// The GEMMs of the Jamba-Reasoning-3B shape, our invariant GEMM (tensor_gemm.h, one summation order for every row
// count) beside cuBLAS with its own heuristic (the kernels it picks differ by row count): bf16 weights against
// cublasGemmEx, or fp32 weights against the pedantic SGEMM of the f32 mode. Microseconds per GEMM, weight GB/s,
// TFLOP/s. Each figure is the mean of 16 launches in a CUDA graph, replayed 10 times, cycling through 4 copies of
// the weight so that L2 holds none of it. With `launches`, every launch that can run each GEMM instead (tensor_gemm.h:
// gemm_launches), the one tensor_gemm chooses marked, each checked bit for bit against it. Prints figures; never
// fails on time. `only=NAME,...` keeps those GEMMs alone (for a profiler: `ncu -k regex:gemm -c 1`).
//   build-gpu/jambo_gemm_bench [rows,...] [bf16|f32] [launches] [only=NAME,...]   (default 1,8,32,64,256,2048 bf16)
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/tensor_gemm.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace jambo;
using namespace jambo::backend::cuda;

namespace {

struct Shape {
  const char* name;
  int64_t n, k;
};

constexpr Shape kShapes[] = {{"q_proj", 2560, 2560},   {"k_proj", 128, 2560},     {"in_proj", 10240, 2560},
                             {"x_proj", 192, 5120},    {"dt_proj", 5120, 160},    {"out_proj", 2560, 5120},
                             {"gate_up", 16384, 2560}, {"down_proj", 2560, 8192}, {"lm_head", 65536, 2560}};
constexpr int kCopies = 4, kLaunches = 16, kReplays = 10;

// count values uniform in [-1, 1) as bf16 or fp32.
DeviceBuffer<std::byte> random_values(int64_t count, DType dtype, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const size_t bytes = size_t(count) * dtype_size(dtype);
  std::vector<std::byte> host(bytes);
  for (int64_t i = 0; i < count; ++i) {
    const float value = uniform(random);
    if (dtype == DType::F32)
      std::memcpy(&host[size_t(i) * 4], &value, 4);
    else
      reinterpret_cast<uint16_t*>(host.data())[i] = __bfloat16_as_ushort(__float2bfloat16(value));
  }
  DeviceBuffer<std::byte> device{int64_t(bytes)};
  JAMBO_CUDA_CHECK(cudaMemcpy(device.data(), host.data(), bytes, cudaMemcpyHostToDevice));
  return device;
}

// Mean microseconds of one of the launches `enqueue(i)` issues, captured in a graph.
template <typename Enqueue>
double time_launches(cudaStream_t stream, const Enqueue& enqueue) {
  for (int i = 0; i < kCopies; ++i) enqueue(i);  // eager first: scratch is sized outside the capture
  JAMBO_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  JAMBO_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kLaunches; ++i) enqueue(i % kCopies);
  JAMBO_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  JAMBO_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  JAMBO_CUDA_CHECK(cudaGraphLaunch(exec, stream));  // warm
  cudaEvent_t start, stop;
  JAMBO_CUDA_CHECK(cudaEventCreate(&start));
  JAMBO_CUDA_CHECK(cudaEventCreate(&stop));
  JAMBO_CUDA_CHECK(cudaEventRecord(start, stream));
  for (int r = 0; r < kReplays; ++r) JAMBO_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  JAMBO_CUDA_CHECK(cudaEventRecord(stop, stream));
  JAMBO_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0.0f;
  JAMBO_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start), cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec), cudaGraphDestroy(graph);
  return 1000.0 * ms / (kReplays * kLaunches);
}

DType parse_dtype(int argc, char** argv) {
  if (argc < 3 || std::string(argv[2]) == "bf16") return DType::BF16;
  if (std::string(argv[2]) == "f32") return DType::F32;
  std::fprintf(stderr, "jambo_gemm_bench: weights '%s' are neither bf16 nor f32\n", argv[2]);
  std::exit(2);
}

std::vector<int64_t> parse_rows(int argc, char** argv) {
  std::vector<int64_t> rows = {1, 8, 32, 64, 256, 2048};
  if (argc < 2) return rows;
  rows.clear();
  std::stringstream list(argv[1]);
  for (std::string item; std::getline(list, item, ',');) rows.push_back(std::stoll(item));
  return rows;
}

// The GEMMs named by an `only=` argument, or all of them.
std::vector<Shape> parse_shapes(int argc, char** argv) {
  std::vector<Shape> shapes;
  for (int i = 3; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("only=", 0) != 0) continue;
    std::stringstream list(arg.substr(5));
    for (std::string name; std::getline(list, name, ',');) {
      const Shape* found = std::find_if(std::begin(kShapes), std::end(kShapes),
                                        [&](const Shape& s) { return name == s.name; });
      if (found == std::end(kShapes)) {
        std::fprintf(stderr, "jambo_gemm_bench: no GEMM named '%s' (q_proj ... lm_head)\n", name.c_str());
        std::exit(2);
      }
      shapes.push_back(*found);
    }
  }
  if (shapes.empty()) shapes.assign(std::begin(kShapes), std::end(kShapes));
  return shapes;
}

// y's values on the host.
std::vector<float> download(const DeviceBuffer<float>& y) {
  std::vector<float> host(size_t(y.size()));
  JAMBO_CUDA_CHECK(cudaMemcpy(host.data(), y.data(), host.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return host;
}

// Every launch of one GEMM: microseconds, TFLOP/s, and whether its bits are the chosen launch's.
void sweep_launches(cudaStream_t stream, TensorGemmScratch& scratch, const Shape& shape, int64_t rows, DType dtype,
                    const std::vector<DeviceBuffer<std::byte>>& weights, const DeviceBuffer<std::byte>& x,
                    DeviceBuffer<float>& y) {
  const auto operands = [&](int c) {
    return TensorGemm{weights[c].data(), dtype, x.data(), y.data(), rows, shape.n, shape.k, shape.k};
  };
  const GemmLaunch chosen = choose_gemm_launch(operands(0));
  tensor_gemm(operands(0), chosen, scratch, stream);
  const std::vector<float> expected = download(y);
  for (const GemmLaunch& launch : gemm_launches(operands(0))) {
    const double us = time_launches(stream, [&](int c) { tensor_gemm(operands(c), launch, scratch, stream); });
    tensor_gemm(operands(0), launch, scratch, stream);
    const bool same = download(y) == expected;
    std::printf("  %-10s %6lld %-36s %9.1f us %7.1f TFLOP/s%s%s\n", shape.name, (long long)rows,
                describe(launch).c_str(), us, 2.0 * shape.n * shape.k * rows / us / 1e6, launch == chosen ? "  <- chosen" : "",
                same ? "" : "  DIFFERENT BITS");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<int64_t> row_counts = parse_rows(argc, argv);
  const DType dtype = parse_dtype(argc, argv);
  const bool every_launch = argc > 3 && std::string(argv[3]) == "launches";
  const std::vector<Shape> shapes = parse_shapes(argc, argv);
  std::printf("%s weights\n", std::string(dtype_name(dtype)).c_str());
  cudaStream_t stream;
  JAMBO_CUDA_CHECK(cudaStreamCreate(&stream));
  cublasHandle_t cublas;
  JAMBO_CUBLAS_CHECK(cublasCreate(&cublas));
  JAMBO_CUBLAS_CHECK(cublasSetStream(cublas, stream));
  JAMBO_CUBLAS_CHECK(cublasSetMathMode(cublas, dtype == DType::F32 ? CUBLAS_PEDANTIC_MATH : CUBLAS_DEFAULT_MATH));
  const cudaDataType_t type = dtype == DType::F32 ? CUDA_R_32F : CUDA_R_16BF;
  DeviceBuffer<std::byte> workspace(int64_t(32) << 20);
  JAMBO_CUBLAS_CHECK(cublasSetWorkspace(cublas, workspace.data(), size_t(32) << 20));
  TensorGemmScratch scratch;
  std::printf("%-10s %6s %6s %6s | %9s %8s %7s | %9s %8s %7s | %6s\n", "gemm", "N", "K", "rows", "ours us", "GB/s",
              "TFLOP/s", "cuBLAS us", "GB/s", "TFLOP/s", "ratio");
  double total_ours = 0.0, total_cublas = 0.0;
  for (const int64_t rows : row_counts) {
    double step_ours = 0.0, step_cublas = 0.0;
    for (const Shape& shape : shapes) {
      std::vector<DeviceBuffer<std::byte>> weights;
      for (int c = 0; c < kCopies; ++c) weights.push_back(random_values(shape.n * shape.k, dtype, 100 + c));
      const DeviceBuffer<std::byte> x = random_values(rows * shape.k, dtype, 7);
      DeviceBuffer<float> y(rows * shape.n);
      if (every_launch) sweep_launches(stream, scratch, shape, rows, dtype, weights, x, y);
      const double ours = time_launches(stream, [&](int c) {
        tensor_gemm({weights[c].data(), dtype, x.data(), y.data(), rows, shape.n, shape.k, shape.k}, scratch, stream);
      });
      const double theirs = time_launches(stream, [&](int c) {
        const float one = 1.0f, zero = 0.0f;
        JAMBO_CUBLAS_CHECK(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, int(shape.n), int(rows), int(shape.k), &one,
                                        weights[c].data(), type, int(shape.k), x.data(), type, int(shape.k), &zero,
                                        y.data(), CUDA_R_32F, int(shape.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      });
      const double bytes = double(shape.n) * double(shape.k) * dtype_size(dtype),
                   flops = 2.0 * shape.n * shape.k * rows;
      std::printf("%-10s %6lld %6lld %6lld | %9.1f %8.0f %7.1f | %9.1f %8.0f %7.1f | %6.2f\n", shape.name,
                  (long long)shape.n, (long long)shape.k, (long long)rows, ours, bytes / ours / 1e3,
                  flops / ours / 1e6, theirs, bytes / theirs / 1e3, flops / theirs / 1e6, ours / theirs);
      step_ours += ours, step_cublas += theirs;
    }
    std::printf("%-10s %20lld | %9.1f %26s | %6.2f\n", "all", (long long)rows, step_ours, "", step_ours / step_cublas);
    std::printf("           (cuBLAS %.1f us for the same)\n", step_cublas);
    total_ours += step_ours, total_cublas += step_cublas;
  }
  std::printf("every row count: ours %.1f us, cuBLAS %.1f us, ratio %.3f\n", total_ours, total_cublas,
              total_ours / total_cublas);
  cublasDestroy(cublas);
  cudaStreamDestroy(stream);
  return 0;
}
