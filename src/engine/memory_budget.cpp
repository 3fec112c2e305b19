#include "engine/memory_budget.h"

#include "engine/backend_factory.h"
#include "backend/row_validation.h"
#include "backend/state_layout.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <string_view>

#include "core/error.h"

namespace jambo::engine {

namespace {

constexpr const char* kBudgetForms =
    "expected bytes (8000000000, 8e9, 512MiB, 2GiB) or a fraction in (0, 1] of available memory";

// Block ids are int32_t in block tables.
constexpr int64_t kMaxKvBlocks = std::numeric_limits<int32_t>::max();

int64_t bytes_per_unit(std::string_view suffix, const std::string& text) {
  if (suffix.empty()) return 1;
  if (suffix == "KiB") return int64_t(1) << 10;
  if (suffix == "MiB") return int64_t(1) << 20;
  if (suffix == "GiB") return int64_t(1) << 30;
  if (suffix == "TiB") return int64_t(1) << 40;
  fail("memory budget '{}' has an unknown unit '{}' (KiB, MiB, GiB or TiB): {}", text, suffix, kBudgetForms);
}

std::string format_bytes(int64_t bytes) { return fmt::format("{} bytes ({:.1f} MiB)", bytes, bytes / 1048576.0); }

int64_t state_bytes_per_slot(const model::JambaConfig& config, DType state_dtype) {
  return backend::StateSlotLayout(config).pool_bytes(1, state_dtype);
}

// Keys and values [2, kv_block_size, nkv, hd] of every attention layer, fp32.
int64_t kv_bytes_per_block(const model::JambaConfig& config, int64_t kv_block_size) {
  const int64_t elements_per_layer = 2 * kv_block_size * config.num_key_value_heads * config.head_dim;
  return config.num_attention_layers() * elements_per_layer * int64_t(sizeof(float));
}

}  // namespace

int64_t state_elements_per_slot(const model::JambaConfig& config) {
  return backend::StateSlotLayout(config).slot_stride;
}

MemoryBudget parse_memory_budget(const std::string& text) {
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [suffix_begin, error] = std::from_chars(text.data(), end, value);
  JAMBO_REQUIRE(error == std::errc() && std::isfinite(value) && value > 0, "memory budget '{}' is not valid: {}", text,
                kBudgetForms);
  const std::string_view suffix(suffix_begin, end - suffix_begin);
  if (suffix.empty() && value <= 1) return {.fraction = value};

  const double bytes = value * double(bytes_per_unit(suffix, text));
  JAMBO_REQUIRE(bytes < 0x1p63, "memory budget '{}' is too large", text);
  JAMBO_REQUIRE(!suffix.empty() || bytes == std::floor(bytes), "memory budget '{}' is not valid: {}", text,
                kBudgetForms);
  return {.bytes = int64_t(bytes)};
}

int64_t MemoryBudget::resolve(BackendKind backend) const {
  return bytes > 0 ? bytes : int64_t(fraction * double(available_memory_bytes(backend)));
}

std::string to_string(const MemoryBudget& budget) {
  return budget.bytes > 0 ? std::to_string(budget.bytes) : fmt::format("{:g}", budget.fraction);
}

int64_t exact_memory_budget(const model::JambaConfig& config, int64_t weight_bytes, int64_t num_slots,
                            int64_t num_kv_blocks, int64_t kv_block_size, DType state_dtype) {
  return weight_bytes + num_slots * state_bytes_per_slot(config, state_dtype) +
         num_kv_blocks * kv_bytes_per_block(config, kv_block_size);
}

CachePlan plan_cache(const model::JambaConfig& config, int64_t weight_bytes, int64_t budget_bytes, int64_t max_num_seqs,
                     int64_t kv_block_size, int64_t max_model_len, DType state_dtype, CheckpointWish checkpoints) {
  JAMBO_REQUIRE(max_num_seqs > 0, "max_num_seqs must be positive, got {}", max_num_seqs);
  JAMBO_REQUIRE(kv_block_size > 0, "kv_block_size must be positive, got {}", kv_block_size);
  JAMBO_REQUIRE(max_model_len > 0, "max_model_len must be positive, got {}", max_model_len);
  JAMBO_REQUIRE(weight_bytes >= 0, "weight bytes must not be negative, got {}", weight_bytes);

  CachePlan plan;
  plan.weight_bytes = weight_bytes;
  backend::require_state_dtype(state_dtype);
  plan.bytes_per_slot = state_bytes_per_slot(config, state_dtype);
  plan.cache.state_dtype = state_dtype;
  plan.bytes_per_kv_block = kv_bytes_per_block(config, kv_block_size);
  plan.cache.kv_block_size = kv_block_size;

  const bool has_attention = plan.bytes_per_kv_block > 0;
  const int64_t blocks_per_request = has_attention ? backend::kv_blocks_for(max_model_len, kv_block_size) : 0;
  JAMBO_REQUIRE(blocks_per_request <= kMaxKvBlocks,
                "max_model_len {} needs {} KV blocks of {} tokens, more than the 2^31-1 a block table can address",
                max_model_len, blocks_per_request, kv_block_size);
  const int64_t kv_bytes_per_request = blocks_per_request * plan.bytes_per_kv_block;
  const int64_t bytes_per_request = plan.bytes_per_slot + kv_bytes_per_request;
  const int64_t cache_bytes = budget_bytes - weight_bytes;
  JAMBO_REQUIRE(cache_bytes >= bytes_per_request,
                "memory budget of {} cannot hold one request of max_model_len {} tokens: that needs {} (weights {}, "
                "one state slot {}, {} KV blocks of {} bytes); raise the memory budget or lower max_model_len",
                format_bytes(budget_bytes), max_model_len, format_bytes(weight_bytes + bytes_per_request),
                format_bytes(weight_bytes), format_bytes(plan.bytes_per_slot), blocks_per_request,
                plan.bytes_per_kv_block);

  // Slots first (each running sequence needs one), keeping blocks for one full-length request.
  const int64_t slots_that_fit =
      plan.bytes_per_slot > 0 ? (cache_bytes - kv_bytes_per_request) / plan.bytes_per_slot : max_num_seqs;
  plan.cache.num_state_slots = std::min(max_num_seqs, slots_that_fit);
  const int64_t slot_bytes = plan.cache.num_state_slots * plan.bytes_per_slot;
  const auto checkpoints_within = [&](int64_t bytes) {
    return plan.bytes_per_slot > 0 ? std::clamp<int64_t>(bytes / plan.bytes_per_slot, 0, checkpoints.max_count) : 0;
  };
  if (checkpoints.reserved) plan.cache.num_checkpoints = checkpoints_within(cache_bytes - slot_bytes - kv_bytes_per_request);
  const int64_t checkpoint_bytes = plan.cache.num_checkpoints * plan.bytes_per_slot;
  if (!has_attention) {
    plan.cache.num_kv_blocks = 0;
    if (!checkpoints.reserved) plan.cache.num_checkpoints = checkpoints_within(cache_bytes - slot_bytes);
    return plan;
  }
  // The rest as KV blocks, but no more than the running sequences could fill at max_model_len.
  const int64_t blocks_that_fit = (cache_bytes - slot_bytes - checkpoint_bytes) / plan.bytes_per_kv_block;
  const int64_t max_useful_blocks =
      std::min(kMaxKvBlocks, blocks_per_request * std::min(plan.cache.num_state_slots, kMaxKvBlocks));
  plan.cache.num_kv_blocks = std::clamp(blocks_that_fit, blocks_per_request, max_useful_blocks);
  if (!checkpoints.reserved)
    plan.cache.num_checkpoints =
        checkpoints_within(cache_bytes - slot_bytes - plan.cache.num_kv_blocks * plan.bytes_per_kv_block);
  return plan;
}

}  // namespace jambo::engine
