#include "engine/backend_factory.h"

#include "backend/cpu/cpu_backend.h"
#ifdef JAMBO_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

#include <fmt/ranges.h>

#include <fstream>
#include <sstream>

namespace jambo {

std::vector<std::string> available_backends() {
#ifdef JAMBO_WITH_CUDA
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

namespace {

[[noreturn]] void fail_unknown_backend(const std::string& name) {
  fail("backend '{}' is not in this build (it has: {}){}", name, fmt::join(available_backends(), ", "),
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

std::unique_ptr<Backend> make_backend(const std::string& name, const Model& model, const CacheConfig& cache,
                                      [[maybe_unused]] const std::string& cuda_weights) {
  if (name == "cpu") {
    require_host_data(model, "the CPU backend");
    return make_cpu_backend(model, cache);
  }
#ifdef JAMBO_WITH_CUDA
  if (name == "cuda") return make_cuda_backend(model, cache, cuda_weights);
#endif
  fail_unknown_backend(name);
}

int64_t backend_weight_bytes(const std::string& name, const Model& model,
                             [[maybe_unused]] const std::string& cuda_weights) {
  if (name == "cpu") return model.weights.bytes_total;
#ifdef JAMBO_WITH_CUDA
  if (name == "cuda") return cuda_weight_bytes(model, cuda_weights);
#endif
  fail_unknown_backend(name);
}

DType state_dtype_named(const std::string& name) {
  if (name == "f32") return DType::F32;
  if (name == "bf16") return DType::BF16;
  fail("state dtype '{}' is not one of f32, bf16", name);
}

int64_t available_memory_bytes(const std::string& backend_name) {
  if (backend_name == "cpu") return host_available_memory_bytes();
#ifdef JAMBO_WITH_CUDA
  if (backend_name == "cuda") return cuda_available_memory_bytes();
#endif
  fail_unknown_backend(backend_name);
}

}  // namespace jambo
