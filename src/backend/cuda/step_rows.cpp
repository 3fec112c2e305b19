#include "backend/cuda/step_rows.h"

#include "core/error.h"

#include <cstring>

namespace jambo::backend::cuda {

DeviceRows StepRowsUploader::upload(std::span<const BatchRow> rows, std::span<const int64_t> state_offsets,
                                    std::span<const int32_t> reads_state, std::span<const int64_t> checkpoint_offsets,
                                    cudaStream_t stream) {
  const int64_t num_rows = int64_t(rows.size());
  int64_t num_checkpoints = 0, num_all_checkpoints = 0;
  for (const BatchRow& row : rows)
    for (const StateCheckpoint& saved : row.checkpoints) {
      num_checkpoints += is_inside_row(row, saved);
      ++num_all_checkpoints;
    }
  JAMBO_ASSERT(int64_t(checkpoint_offsets.size()) == num_all_checkpoints);
  int64_t num_tokens = 0, num_table_entries = 0, num_vectors = 0, num_chunks = 0, num_chunked_rows = 0, num_splits = 0;
  const auto chunks_of = [](const BatchRow& row) {
    const int64_t length = int64_t(row.tokens.size());
    return length > 1 ? (length + kScanChunkTokens - 1) / kScanChunkTokens : 0;
  };
  const auto splits_of = [](const BatchRow& row) {
    return row.tokens.size() == 1 ? num_key_splits(row.start_position) : 0;
  };
  for (const BatchRow& row : rows) {
    num_splits += splits_of(row);
    num_tokens += int64_t(row.tokens.size());
    num_table_entries += int64_t(row.block_table.size());
    num_vectors += computes_all_vectors(row) ? int64_t(row.tokens.size()) : 1;
    num_chunks += chunks_of(row);
    num_chunked_rows += row.tokens.size() > 1;
  }
  // Sections, each a whole number of 8-byte words; 32-bit arrays are packed two to a word.
  const auto words_for_int32 = [](int64_t count) { return (count + 1) / 2; };
  const int64_t section_first_token = 0;
  const int64_t section_row_tokens = section_first_token + num_rows;
  const int64_t section_start = section_row_tokens + num_rows;
  const int64_t section_state = section_start + num_rows;
  const int64_t section_table_offset = section_state + num_rows;
  const int64_t section_selected = section_table_offset + num_rows;
  const int64_t section_chunk_first = section_selected + num_vectors;
  const int64_t section_row_first_split = section_chunk_first + num_chunks;
  const int64_t section_row_first_checkpoint = section_row_first_split + num_rows;
  const int64_t section_checkpoint_tokens = section_row_first_checkpoint + num_rows + 1;
  const int64_t section_checkpoint_offset = section_checkpoint_tokens + num_checkpoints;
  const int64_t section_reads = section_checkpoint_offset + num_checkpoints;
  const int64_t section_token_row = section_reads + words_for_int32(num_rows);
  const int64_t section_tokens = section_token_row + words_for_int32(num_tokens);
  const int64_t section_tables = section_tokens + words_for_int32(num_tokens);
  const int64_t section_chunk_row = section_tables + words_for_int32(num_table_entries);
  const int64_t num_words = section_chunk_row + words_for_int32(num_chunks);

  host_.assign(size_t(num_words), 0);
  int64_t* words = host_.data();
  auto int32_at = [&](int64_t section) { return reinterpret_cast<int32_t*>(words + section); };
  int64_t token = 0, table_entry = 0, vector = 0, chunk = 0, split = 0, checkpoint = 0, given = 0;
  for (int64_t r = 0; r < num_rows; ++r) {
    const BatchRow& row = rows[r];
    const int64_t row_tokens = int64_t(row.tokens.size());
    words[section_first_token + r] = token;
    words[section_row_tokens + r] = row_tokens;
    words[section_start + r] = row.start_position;
    words[section_state + r] = state_offsets[r];
    words[section_table_offset + r] = table_entry;
    int32_at(section_reads)[r] = reads_state[r];
    words[section_row_first_split + r] = split;
    split += splits_of(row);
    words[section_row_first_checkpoint + r] = checkpoint;
    for (const StateCheckpoint& saved : row.checkpoints) {
      const int64_t offset = checkpoint_offsets[size_t(given++)];
      if (!is_inside_row(row, saved)) continue;
      words[section_checkpoint_tokens + checkpoint] = saved.num_tokens;
      words[section_checkpoint_offset + checkpoint] = offset;
      ++checkpoint;
    }
    for (int64_t c = 0; c < chunks_of(row); ++c, ++chunk) {
      words[section_chunk_first + chunk] = token + c * kScanChunkTokens;
      int32_at(section_chunk_row)[chunk] = int32_t(r);
    }
    for (int64_t t = computes_all_vectors(row) ? 0 : row_tokens - 1; t < row_tokens; ++t)
      words[section_selected + vector++] = token + t;
    for (int64_t t = 0; t < row_tokens; ++t) {
      int32_at(section_token_row)[token + t] = int32_t(r);
      int32_at(section_tokens)[token + t] = row.tokens[t];
    }
    std::memcpy(int32_at(section_tables) + table_entry, row.block_table.data(), row.block_table.size() * 4);
    token += row_tokens;
    table_entry += int64_t(row.block_table.size());
  }
  words[section_row_first_checkpoint + num_rows] = checkpoint;

  int64_t* pinned = pinned_.reserve(num_words);
  // The last step's transfer from the pinned buffer must be done before it is overwritten.
  JAMBO_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::memcpy(pinned, words, size_t(device_offset(num_words, 8)));
  int64_t* device = device_.reserve(num_words);
  JAMBO_CUDA_CHECK(
      cudaMemcpyAsync(device, pinned, size_t(device_offset(num_words, 8)), cudaMemcpyHostToDevice, stream));

  DeviceRows out;
  out.num_rows = num_rows;
  out.num_tokens = num_tokens;
  out.num_vectors = num_vectors;
  out.first_token = device + section_first_token;
  out.row_tokens = device + section_row_tokens;
  out.start_position = device + section_start;
  out.state_offset = device + section_state;
  out.block_table_offset = device + section_table_offset;
  out.selected = device + section_selected;
  out.reads_state = reinterpret_cast<const int32_t*>(device + section_reads);
  out.token_row = reinterpret_cast<const int32_t*>(device + section_token_row);
  out.tokens = reinterpret_cast<const int32_t*>(device + section_tokens);
  out.block_tables = reinterpret_cast<const int32_t*>(device + section_tables);
  out.num_chunked_rows = num_chunked_rows;
  out.num_chunks = num_chunks;
  out.chunk_first_token = device + section_chunk_first;
  out.chunk_row = reinterpret_cast<const int32_t*>(device + section_chunk_row);
  out.num_splits = num_splits;
  out.row_first_split = device + section_row_first_split;
  out.num_checkpoints = num_checkpoints;
  out.row_first_checkpoint = device + section_row_first_checkpoint;
  out.checkpoint_tokens = device + section_checkpoint_tokens;
  out.checkpoint_offset = device + section_checkpoint_offset;
  return out;
}

}  // namespace jambo::backend::cuda
