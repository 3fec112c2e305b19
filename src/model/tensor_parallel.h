// Megatron-style tensor parallelism: one rank's shard of a model. The backend of each rank runs the shard and
// all-reduces the partial sums of its row-parallel matrices (backend/communicator.h).
//   - Attention by query heads: q_proj, k_proj and v_proj column-parallel (their rows); where there are fewer KV heads
//     than ranks, each rank keeps the one KV head its query heads read (replicated across the ranks of that group);
//     o_proj row-parallel (its columns), one all-reduce.
//   - The Mamba mixer by inner channels: in_proj's u and z rows, the conv, dt_proj, A_log and D by channel, so the conv,
//     scan and gate are local. x_proj contracts over the channels (its columns): its partial sums need an all-reduce
//     of their own before dt_proj and the B/C norms. out_proj row-parallel, one all-reduce.
//   - Dense MLPs and every expert by intermediate rows: gate and up column-parallel, down row-parallel. The experts are
//     tensor-parallel, not expert-parallel: the router is replicated, every rank routes every token alike and computes
//     its share of each chosen expert, so no token moves between ranks and the load stays even whatever the routing;
//     the MoE layer's partial sums take one all-reduce, as a dense MLP's.
//   - The embedding, the norms and lm_head replicated.
// A row-parallel matrix's bias goes to rank 0 only, so that the all-reduce adds it once.
#pragma once

#include "model/weights.h"

#include <string>

namespace jambo::model {

// Why the model cannot be split over `size` ranks ("" where it can): a size that does not divide the Mamba channels,
// the intermediate size or the query heads, or KV heads that neither divide nor are divided by it.
std::string tensor_parallel_obstacle(const JambaConfig& config, int64_t size);

// What a shard's views hold: the slices' values, or only their names, shapes and dtypes (for counting the bytes a
// rank takes: its views' addresses stand for the slices, and nothing is copied).
enum class ShardContents { Values, ShapesOnly };

// Rank `rank` of `size`'s shard: a config with the local sizes (mamba_d_inner, num_attention_heads,
// num_key_value_heads, intermediate_size) and the weights' slices, row slices as views into the model's storage and
// column slices as copies the shard owns. A model without host data (random weights described for the GPU) gives a
// shard whose recipe describes its slices. Throws jambo::Error where tensor_parallel_obstacle is not empty.
Model shard_model(const Model& model, int64_t rank, int64_t size, ShardContents contents = ShardContents::Values);

}  // namespace jambo::model
