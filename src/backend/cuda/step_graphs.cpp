#include "backend/cuda/step_graphs.h"

namespace jambo::backend::cuda {

void StepGraphs::clear() {
  for (auto& [key, shape] : shapes_)
    if (shape.graph != nullptr) cudaGraphExecDestroy(shape.graph);
  shapes_.clear();
}

void StepGraphs::run(int64_t key, const std::function<void()>& launches) {
  if (device_allocation_count() != allocation_count_) {
    clear();
    allocation_count_ = device_allocation_count();
  }
  Shape& shape = shapes_[key];
  if (!shape.warmed_up) {
    launches();
    shape.warmed_up = true;  // had it grown a buffer, the next step finds the count changed and starts afresh
    ++counts_.num_eager;
    return;
  }
  if (shape.graph == nullptr) shape.graph = capture(launches);
  JAMBO_CUDA_CHECK(cudaGraphLaunch(shape.graph, stream_));
  ++counts_.num_replays;
}

// The warm-up of the same shape sized every buffer the launches use, so nothing is allocated while capturing (an
// allocation would fail the capture with a CUDA error, thrown like any other).
cudaGraphExec_t StepGraphs::capture(const std::function<void()>& launches) {
  JAMBO_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  try {
    launches();
  } catch (...) {
    cudaStreamEndCapture(stream_, &graph);  // leaves the stream usable; the partial graph is dropped
    if (graph != nullptr) cudaGraphDestroy(graph);
    throw;
  }
  JAMBO_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  JAMBO_CUDA_CHECK(status);
  ++counts_.num_captures;
  return exec;
}

}  // namespace jambo::backend::cuda
