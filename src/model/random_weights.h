// Seeded random weights as a description: which initializer and random stream each tensor of a model follows
// (random_values.h), so that whoever holds the weights can generate them where they live. make_random_model
// fills host memory from it; a model made by describe_random_model carries it instead of host data, and the
// CUDA backend generates its weights on the GPU.
#pragma once

#include "model/random_values.h"
#include "model/weights.h"

#include <string>
#include <unordered_map>

namespace jambo::model {

class RandomWeights {
 public:
  explicit RandomWeights(std::unordered_map<std::string, RandomTensor> tensors_by_name)
      : tensors_(std::move(tensors_by_name)) {}

  // The tensor a view of the described model stands for (found by its checkpoint name); throws jambo::Error
  // naming the view when the model has no such tensor.
  const RandomTensor& tensor(const TensorView& view) const;

  // This recipe with some of its tensors replaced, by name (a tensor-parallel shard's slices of them).
  RandomWeights with(const std::unordered_map<std::string, RandomTensor>& replacements) const;

  // Elements [begin, end) of `tensor`, written at out[begin..end) in tensor.dtype, on the host.
  static void fill_host(const RandomTensor& tensor, void* out, int64_t begin, int64_t end);

 private:
  std::unordered_map<std::string, RandomTensor> tensors_;
};

}  // namespace jambo::model
