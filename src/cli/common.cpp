#include "cli/common.h"

#include "backend/cpu/cpu_backend.h"

#include <filesystem>

namespace jambo::cli {

void ModelOptions::add_to(CLI::App& command, bool allow_random_weights) {
  command.add_option("--model", folder, "model folder (config.json, *.safetensors, tokenizer.json)")->required();
  if (!allow_random_weights) return;
  command.add_flag("--random-weights", random_weights,
                   "ignore the folder's weights: random weights with the shape of its config.json");
  command.add_option("--random-dtype", random_dtype, "dtype of random weights")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  command.add_option("--random-seed", random_seed, "seed of random weights")->capture_default_str();
}

Model ModelOptions::load() const {
  if (!random_weights) return load_model(folder);
  const DType dtype = random_dtype == "f32" ? DType::F32 : random_dtype == "f16" ? DType::F16 : DType::BF16;
  return make_random_model(load_config(std::filesystem::path(folder) / "config.json"), dtype, random_seed);
}

std::optional<Tokenizer> ModelOptions::load_tokenizer() const {
  if (!std::filesystem::exists(std::filesystem::path(folder) / "tokenizer.json")) return std::nullopt;
  return Tokenizer::load(folder);
}

SingleSequenceBackend make_single_sequence_backend(const Model& model, int64_t max_tokens) {
  CacheConfig cache;
  cache.num_state_slots = 1;
  cache.kv_block_size = 16;
  cache.num_kv_blocks = std::max<int64_t>(1, (max_tokens + cache.kv_block_size - 1) / cache.kv_block_size);
  return {make_cpu_backend(model, cache), cache};
}

nlohmann::json top_logprobs_json(const std::vector<TokenLogprob>& entries) {
  nlohmann::json out = nlohmann::json::array();
  for (const TokenLogprob& entry : entries) out.push_back({entry.token, entry.logprob});
  return out;
}

}  // namespace jambo::cli
