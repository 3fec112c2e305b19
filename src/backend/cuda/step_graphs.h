// Decode steps as CUDA graphs. A decode step of B rows launches the same ~700 kernels every time, from the
// same buffers, with only the uploaded row data changing: launching them one by one costs the host more than
// the GPU takes to run them at small B. StepGraphs records a step's launches once per shape and replays them.
//
// Per shape (the caller's key, e.g. the number of rows of a decode step): the first step runs eagerly, which
// sizes every buffer it touches; the second is captured into a graph and launched; later ones launch it. A
// graph holds raw device pointers, so every graph is dropped when any DeviceBuffer has been (re)allocated
// since it was captured (device_allocation_count), and the shapes warm up again.
#pragma once

#include "backend/cuda/device_memory.h"

#include <cstdint>
#include <functional>
#include <map>

namespace jambo::backend::cuda {

class StepGraphs {
 public:
  struct Counts {
    int64_t num_eager = 0;     // steps run launch by launch (the warm-ups)
    int64_t num_captures = 0;  // graphs recorded
    int64_t num_replays = 0;   // steps run as a graph launch (the capturing step included)
  };

  explicit StepGraphs(cudaStream_t stream) : stream_(stream) {}
  ~StepGraphs() { clear(); }
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  // Enqueues one step of shape `key` on the stream: `launches` (which must enqueue the same work on the same
  // buffers for the same key, and never synchronize) runs eagerly or is captured, or its graph is replayed.
  void run(int64_t key, const std::function<void()>& launches);

  const Counts& counts() const { return counts_; }

 private:
  struct Shape {
    bool warmed_up = false;
    cudaGraphExec_t graph = nullptr;
  };

  void clear();
  cudaGraphExec_t capture(const std::function<void()>& launches);

  cudaStream_t stream_;
  std::map<int64_t, Shape> shapes_;
  int64_t allocation_count_ = -1;  // device_allocation_count() when the graphs in shapes_ were valid
  Counts counts_;
};

}  // namespace jambo::backend::cuda
