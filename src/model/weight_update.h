// A weight update read from a checkpoint folder of the serving model's architecture (POST
// /update_weights_from_disk): all of the model's tensors, or any subset the folder holds, under their per-expert or
// their fused expert names. Everything is checked before anything is copied, so that a bad folder changes nothing:
// every tensor in the folder must be one the model reads, with the model's shape and dtype and finite values, and
// the folder's config.json, where it has one, must describe the same architecture. Errors name the tensor (or the
// config field) and what was wrong.
#pragma once

#include "core/tensor.h"
#include "model/safetensors.h"
#include "model/weights.h"

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace jambo::model {

struct WeightUpdate {
  // One weight of the model and its new values.
  struct Piece {
    std::string name;   // the weight's per-expert checkpoint name (spec §2.1), whatever name the folder used
    TensorView source;  // [the weight's shape], in the folder's memory maps: the new values
    TensorView target;  // the model's view of the weight it replaces
  };
  std::vector<Piece> pieces;          // in the model's order of weights
  std::vector<std::string> tensors;   // the folder's tensors, sorted
  int64_t num_bytes = 0;              // of the pieces' sources
  std::shared_ptr<void> storage;      // keeps the folder's memory maps (or the shared GPU memory) alive
  bool on_device = false;             // the sources lie in GPU memory: the backend checks them finite
};

// Reads and checks the update in `folder` against `model` (loaded with load_model or made with make_random_model).
// Throws jambo::Error, naming the folder and the tensor, when anything is wrong; the model is never touched.
WeightUpdate read_weight_update(const std::filesystem::path& folder, const Model& model);

// The same for tensors given otherwise (Checkpoint::on_device: POST /update_weights_from_ipc): names, shapes and
// dtypes checked against the model, and the values too where they are readable on the host.
WeightUpdate match_weight_update(const Checkpoint& tensors, const Model& model);

}  // namespace jambo::model
