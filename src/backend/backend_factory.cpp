#include "backend/backend_factory.h"

#include "backend/cpu/cpu_backend.h"
#ifdef JAMBO_WITH_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

#include <fmt/ranges.h>

namespace jambo {

std::vector<std::string> available_backends() {
#ifdef JAMBO_WITH_CUDA
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

std::unique_ptr<Backend> make_backend(const std::string& name, const Model& model, const CacheConfig& cache) {
  if (name == "cpu") return make_cpu_backend(model, cache);
#ifdef JAMBO_WITH_CUDA
  if (name == "cuda") return make_cuda_backend(model, cache);
#endif
  fail("backend '{}' is not in this build (it has: {}){}", name, fmt::join(available_backends(), ", "),
       name == "cuda" ? "; build with nvcc present to get the CUDA backend" : "");
}

}  // namespace jambo
