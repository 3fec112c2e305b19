// The engine: many requests at once over one backend, by continuous batching. Each step() the
// scheduler picks rows (chunked prefills and decodes under a token budget), the runner checks and
// runs them, and finished samples come back. The offline batch mode, stress runs and (later) the
// server all drive this one class.
#pragma once

#include "backend/backend.h"
#include "engine/backend_factory.h"
#include "engine/memory_budget.h"
#include "engine/prefix_cache.h"
#include "engine/request_spec.h"
#include "engine/slot_pool.h"
#include "tokenizer/tokenizer.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace jambo::engine {

// Test-only (`--inject`): reproduce the two historical state-cache bugs so that stress and compare can be
// shown to catch them.
struct EngineFaults {
  bool decode_before_prefill = false;  // a one-token step without state reads the slot's leftover state
  bool wrap_state_offsets = false;     // state offsets wrap at half the pool, as a 32-bit offset wraps at 2^32
  bool serve_stale_checkpoint = false;  // a prefix hit resumes from another prefix's checkpoint (prefix_cache.h)
};

inline constexpr int64_t kDefaultMaxModelLen = 4096;

struct EngineOptions {
  BackendChoice backend;                 // CUDA weights F32 by default: within 1e-4 of the CPU, as stress expects
  int64_t max_num_batched_tokens = 512;  // tokens of all rows of one step
  int64_t max_num_seqs = 64;             // sequences (samples) running at once
  int64_t kv_block_size = 16;
  MemoryBudget memory_budget{.fraction = 0.25};  // resolved on the backend when the engine starts
  // Prompt + generated tokens of one sequence, at most the model's max_position_embeddings; unset: the smaller of
  // that and kDefaultMaxModelLen.
  std::optional<int64_t> max_model_len;
  SlotPolicy slot_policy = SlotPolicy::Lowest;
  uint64_t slot_seed = 0;  // for SlotPolicy::Random
  bool checked = false;    // law 2: verify owner and generation of every row; poison freed slots
  std::string trace_path;  // law 6: JSONL trace of every step and lifecycle event ("" = none)
  EngineFaults faults;     // none outside fault-injection tests
  std::string weight_version = "default";  // the weights' name in outputs (SGLang's default), until set anew
  // Automatic prefix caching (prefix_cache.h).
  bool enable_prefix_caching = true;
  // Recurrent-state checkpoints of cached prefixes, taken from the memory budget before the KV blocks; unset: up to
  // 2 * max_num_seqs from what the KV blocks leave over.
  std::optional<int64_t> max_num_checkpoints;
};

// Generated tokens [start, end) of a sample, all sampled from the weights named version.
struct WeightVersionSpan {
  std::string version;
  int64_t start = 0, end = 0;
  bool operator==(const WeightVersionSpan&) const = default;
};

// The top-k experts each MoE layer routed one token to, in increasing order.
using TokenRouting = std::vector<std::vector<int32_t>>;  // [num_moe_layers][k]

// One finished sample.
struct SampleOutput {
  std::string id;
  int64_t sample = 0;  // 0 .. n-1
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> ids;
  std::string text;
  std::vector<double> logprobs;                         // [ids]
  std::vector<std::vector<backend::TokenLogprob>> top_logprobs;  // [ids][K]
  std::vector<std::optional<double>> prompt_logprobs;   // [prompt] (first is null) when asked
  std::vector<std::vector<backend::TokenLogprob>> prompt_top_logprobs;
  std::string finish_reason;  // "stop" or "length" (or "abort", or "error")
  std::string error;          // why the sample failed (finish_reason "error"): its logits were not finite
  std::vector<WeightVersionSpan> weight_versions;  // which weights sampled which of ids, in order, covering them
  // Where return_routed_experts was asked: the routing of every token the model read, so that a trainer can replay
  // it: the prompt's, and each generated token's but the last one's (never read). No layers without MoE.
  std::vector<TokenRouting> prompt_routed_experts;  // [prompt]
  std::vector<TokenRouting> routed_experts;         // [ids - 1]
};

// One sample's progress, reported to a listener (the server's streams) after every new token and once
// when the sample ends. The references are valid during the call only.
struct SampleProgress {
  const SampleOutput& output;  // ids and logprobs so far; text and finish_reason final once finished
  const std::string& text;     // the text so far, stop strings cut (a stop string may still cut its tail)
  bool finished = false;       // finished or aborted: no more progress of this sample
};
using ProgressListener = std::function<void(const SampleProgress&)>;

// Counters the server exposes on /metrics.
struct EngineCounters {
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  int64_t kv_blocks_used = 0;  // held by sequences (blocks only the prefix cache holds are evicted when needed)
  int64_t kv_blocks_total = 0;
  int64_t slots_used = 0;
  int64_t slots_total = 0;
  int64_t slot_reuses = 0;
  int64_t highest_slot_used = -1;  // the highest state slot a sequence has held (-1: none yet)
  int64_t preemptions = 0;
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;
  int64_t law_violations = 0;
  int64_t steps = 0;
  double forward_seconds = 0.0;  // wall time inside the backend's forward calls; the rest of a step is the host's
  // Rows whose logits held NaN or infinity. Each failed its request (step()); the checked mode refuses the first as a
  // law 2 violation instead, a read of a poisoned slot.
  int64_t nonfinite_rows = 0;
  bool prefix_caching = false;
  PrefixCacheCounters prefix_cache;
};

class Engine {
 public:
  // The engine sizes the caches from options.memory_budget and creates its backend.
  Engine(const model::Model& model, const tokenizer::Tokenizer* tokenizer, const EngineOptions& options);
  ~Engine();

  // Validates the request (request_spec.h's validate, under the engine's limits, and whether its KV blocks fit) and
  // queues it; throws jambo::Error naming the request and the bad field. Other requests are not affected.
  void add_request(const RequestSpec& spec);
  void abort_request(const std::string& id);
  bool has_unfinished() const;
  // Called from step() and abort_request(), on their thread.
  void set_progress_listener(ProgressListener listener);
  // Runs one step; returns the samples that finished (or were aborted) since the last step. A row whose logits are
  // not finite fails its request: every sample of it ends with finish_reason "error" and the error naming the
  // request, sample, sequence and step (the listener sees it), its memory is freed, and, once the rest of the step
  // is done, step() throws backend::NonFiniteLogits with that message. The engine stays usable: the samples that
  // finished in that step come back from the next step().
  std::vector<SampleOutput> step();
  const EngineCounters& counters() const;
  // The name of the weights that sample the next tokens (options.weight_version until set): between steps, a
  // caller that changed the weights names them here, and every sample's weight_versions says which tokens came
  // from which.
  const std::string& weight_version() const;
  void set_weight_version(std::string version);
  // Between steps: the backend takes the update's weights (model/weight_update.h, read against this engine's model)
  // and they are named `version`. Samples under way go on with the new weights; their weight_versions say which
  // tokens came from which. Throws jambo::Error, the weights unchanged, where the backend takes no updates.
  void update_weights(const model::WeightUpdate& update, std::string version);
  // The same from tensors in another process's GPU memory (backend.h: IpcTensor), read device to device: their
  // names, shapes and dtypes checked against the model, their values on the GPU, before anything is written.
  void update_weights_from_ipc(std::span<const backend::IpcTensor> tensors, std::string version);

  // Sleep and wake (vLLM's names; backend.h says what each level lets go of), between steps, with no request
  // unfinished: a caller pauses first. Throws jambo::Error, nothing changed, where a request is unfinished, or an
  // update comes while the weights sleep. While anything sleeps, requests are taken but no step runs (step()
  // throws where there is work): the weights and the caches must both be woken.
  void sleep(backend::SleepLevel level);
  void wake_up(const backend::WakeTags& tags);
  struct Sleep {
    bool weights = false, caches = false;  // asleep
  };
  Sleep sleeping() const;
  // The context of one sequence: options.max_model_len, or its default for this model.
  int64_t max_model_len() const;

  // Whether prefix caching runs, and its checkpoint pool, or why it does not: "on (64 checkpoints of 1.2 MiB)".
  const std::string& prefix_caching_status() const;
  // Empties the prefix cache (POST /reset_prefix_cache); sequences running keep the blocks they hold.
  void reset_prefix_cache();

  // Test-only fault injection (law 2): the running request `id` keeps a stale lease of its slot (a
  // generation it does not hold), as a scheduler bug would. In checked mode the next step must fail.
  void corrupt_lease_for_testing(const std::string& id);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace jambo::engine
