// Reading Hugging Face safetensors checkpoints: one memory-mapped file (model.safetensors) or a
// sharded set (model.safetensors.index.json). Every header is validated before any data is used:
// dtypes, shapes, data ranges inside the file, no overlaps; a tensor's values are checked to be finite when the
// loader first reads it. Errors name the file and the tensor.
#pragma once

#include "core/tensor.h"

#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace jambo::model {

// Throws jambo::Error unless `folder` is a folder; the message says whether it is missing or a file (a
// checkpoint's config.json given for its folder, say).
void require_model_folder(const std::filesystem::path& folder);

class Checkpoint {
 public:
  // Opens folder/model.safetensors.index.json (sharded) or else folder/model.safetensors.
  static Checkpoint open(const std::filesystem::path& folder);
  // Tensors of another process's GPU memory (shared by CUDA IPC), named `source` in messages: their bytes are not
  // readable on the host, so require_finite is the caller's to do on the GPU. `storage` keeps them mapped.
  static Checkpoint on_device(std::vector<TensorView> views, std::string source, std::shared_ptr<void> storage);
  bool on_device() const { return on_device_; }

  // The tensor, or nullptr when the checkpoint has no tensor of that name.
  const TensorView* find(const std::string& name) const;

  // The tensor, which must exist and have the expected shape.
  TensorView get(const std::string& name, const std::vector<int64_t>& expected_shape) const;

  // Throws jambo::Error naming the file, the first of these tensors that holds NaN or infinity, and its first such
  // element. The loader calls it once, with every tensor the model reads: the one pass over their bytes at load.
  void require_finite(std::span<const std::string> names) const;

  std::vector<std::string> names() const;  // sorted
  // The file an error about a missing tensor should name (the index when sharded).
  const std::string& source() const { return source_; }
  // Keeps the memory maps alive; views stay valid while a copy of it exists.
  std::shared_ptr<void> storage() const { return files_; }

 private:
  struct Entry {
    TensorView view;
    std::string file;  // the file holding it, for messages
  };
  std::map<std::string, Entry> tensors_;
  std::string source_;
  std::shared_ptr<void> files_;
  bool on_device_ = false;
};

}  // namespace jambo::model
