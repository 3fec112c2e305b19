#include "engine/backend_factory.h"

#include "backend/cpu/cpu_backend.h"
#include "core/names.h"
#include "model/tensor_parallel.h"
#ifdef JAMBO_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

#include <fmt/ranges.h>

#include <fstream>
#include <sstream>

namespace jambo::engine {

namespace {

constexpr Names<BackendKind, 2> kBackendNames{{{"cpu", BackendKind::Cpu}, {"cuda", BackendKind::Cuda}}};
constexpr Names<CudaWeights, 3> kCudaWeightNames{
    {{"f32", CudaWeights::F32}, {"bf16", CudaWeights::Bf16}, {"f16", CudaWeights::F16}}};
constexpr Names<CudaGemm, 2> kCudaGemmNames{{{"cublas", CudaGemm::Cublas}, {"invariant", CudaGemm::Invariant}}};
constexpr Names<DType, 2> kStateDTypeNames{{{"f32", DType::F32}, {"bf16", DType::BF16}}};

[[noreturn]] void fail_unknown_backend(std::string_view name) {
  fail("backend '{}' is not in this build (it has: {}){}", name, fmt::join(backend_names(), ", "),
       name == "cuda" ? "; build with nvcc present to get the CUDA backend" : "");
}

// MemAvailable of /proc/meminfo: what the kernel estimates can be allocated without swapping.
int64_t host_available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    std::istringstream fields(line);
    std::string key;
    int64_t kibibytes = 0;
    if (fields >> key >> kibibytes && key == "MemAvailable:") return kibibytes * 1024;
  }
  fail("cannot read MemAvailable from /proc/meminfo, needed for a memory budget given as a fraction");
}

}  // namespace

std::string_view name(BackendKind kind) { return name_of(kBackendNames, kind); }
std::string_view name(CudaWeights weights) { return name_of(kCudaWeightNames, weights); }
std::string_view name(CudaGemm gemm) { return name_of(kCudaGemmNames, gemm); }
std::string_view state_dtype_name(DType dtype) { return name_of(kStateDTypeNames, dtype); }

std::string describe(const BackendChoice& choice) {
  const std::string state = fmt::format("{} state", state_dtype_name(choice.state_dtype));
  const std::string ranks =
      choice.tensor_parallel_size > 1 ? fmt::format(", {} tensor-parallel ranks", choice.tensor_parallel_size) : "";
  if (choice.kind == BackendKind::Cpu) return fmt::format("{} ({}{})", name(choice.kind), state, ranks);
  return fmt::format("{} ({} weights, {} GEMMs, {}{})", name(choice.kind), name(choice.cuda_weights),
                     name(choice.cuda_gemm), state, ranks);
}

std::optional<std::string> why_not_bitwise(const BackendChoice& choice) {
  if (choice.state_dtype != DType::F32)
    return fmt::format("a {} state is rounded at every chunk boundary, which a one-shot prefill does not have",
                       state_dtype_name(choice.state_dtype));
  if (choice.kind == BackendKind::Cpu) return std::nullopt;
  if (choice.cuda_gemm == CudaGemm::Cublas)
    return std::string(
        "--cuda-gemm cublas orders its sums by the step's row count (--cuda-gemm invariant does not)");
  return std::nullopt;
}

std::vector<BackendKind> available_backends() {
#ifdef JAMBO_WITH_CUDA
  return {BackendKind::Cpu, BackendKind::Cuda};
#else
  return {BackendKind::Cpu};
#endif
}

std::vector<std::string_view> backend_names() {
  std::vector<std::string_view> names;
  for (const BackendKind kind : available_backends()) names.push_back(name(kind));
  return names;
}

std::vector<std::string_view> cuda_weights_names() { return all_names(kCudaWeightNames); }
std::vector<std::string_view> cuda_gemm_names() { return all_names(kCudaGemmNames); }
std::vector<std::string_view> state_dtype_names() { return all_names(kStateDTypeNames); }

BackendKind parse_backend_kind(const std::string& text) {
  for (const BackendKind kind : available_backends())
    if (name(kind) == text) return kind;
  fail_unknown_backend(text);
}

CudaWeights parse_cuda_weights(const std::string& text) {
  return parse_named(kCudaWeightNames, "CUDA weight mode", text);
}

CudaGemm parse_cuda_gemm(const std::string& text) { return parse_named(kCudaGemmNames, "CUDA GEMM", text); }

DType parse_state_dtype(const std::string& text) { return parse_named(kStateDTypeNames, "state dtype", text); }

// make_cuda_backend and cuda_weight_bytes keep their weight-mode strings (the CUDA library and its tests use them):
// the typed mode becomes its name here, and only here.
std::unique_ptr<backend::Backend> make_backend(const BackendChoice& choice, const model::Model& model,
                                               const backend::CacheConfig& cache) {
  const std::string obstacle = model::tensor_parallel_obstacle(model.config, choice.tensor_parallel_size);
  JAMBO_REQUIRE(obstacle.empty(), "--tensor-parallel-size {}: {}", choice.tensor_parallel_size, obstacle);
  if (choice.kind == BackendKind::Cpu) {
    require_host_data(model, "the CPU backend");
    if (choice.tensor_parallel_size > 1)
      return backend::cpu::make_tensor_parallel_cpu_backend(model, cache, choice.tensor_parallel_size);
    return backend::cpu::make_cpu_backend(model, cache);
  }
#ifdef JAMBO_WITH_CUDA
  const std::string weights(name(choice.cuda_weights));
  const bool invariant_gemm = choice.cuda_gemm == CudaGemm::Invariant;
  if (choice.tensor_parallel_size > 1) {
    return backend::cuda::make_tensor_parallel_cuda_backend(
        model, cache, backend::cuda::make_nccl_group(choice.tensor_parallel_size), weights, /*decode_graphs=*/true,
        invariant_gemm);
  }
  return backend::cuda::make_cuda_backend(model, cache, weights, /*decode_graphs=*/true, invariant_gemm);
#else
  fail_unknown_backend(name(choice.kind));
#endif
}

int64_t backend_weight_bytes(BackendKind kind, const model::Model& model, [[maybe_unused]] CudaWeights cuda_weights) {
  if (kind == BackendKind::Cpu) return model.weights.bytes_total;
#ifdef JAMBO_WITH_CUDA
  return backend::cuda::cuda_weight_bytes(model, std::string(name(cuda_weights)));
#else
  fail_unknown_backend(name(kind));
#endif
}

MemoryShare memory_share(const BackendChoice& choice, const model::Model& model) {
  if (choice.kind == BackendKind::Cuda && choice.tensor_parallel_size > 1) {
    const model::Model shard =
        model::shard_model(model, 0, choice.tensor_parallel_size, model::ShardContents::ShapesOnly);
    return {shard.config, backend_weight_bytes(choice.kind, shard, choice.cuda_weights)};
  }
  return {model.config, backend_weight_bytes(choice.kind, model, choice.cuda_weights)};
}

int64_t available_memory_bytes(BackendKind kind) {
  if (kind == BackendKind::Cpu) return host_available_memory_bytes();
#ifdef JAMBO_WITH_CUDA
  return backend::cuda::cuda_available_memory_bytes();
#else
  fail_unknown_backend(name(kind));
#endif
}

}  // namespace jambo::engine
