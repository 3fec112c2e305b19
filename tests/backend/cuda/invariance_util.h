// Bitwise row invariance of a batched op: a probe row's result alone must be, bit for bit, its result among other
// rows, whatever their number and the probe's place among them. The batch sizes straddle the warp, block, tile and
// split thresholds a kernel might switch at; the fillers around the probe change from case to case.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace jambo::testing {

// Row counts a probe row is embedded among.
inline const std::vector<int64_t> kInvarianceBatchSizes = {1,  2,  3,  7,  8,  9,   16,  17, 31,
                                                           32, 33, 63, 64, 65, 255, 256, 257};

// The probe's places in a batch of num_rows rows: the first, the middle and the last (once each).
inline std::vector<int64_t> probe_positions(int64_t num_rows) {
  std::vector<int64_t> positions = {0};
  if (num_rows / 2 > 0) positions.push_back(num_rows / 2);
  if (num_rows - 1 > num_rows / 2) positions.push_back(num_rows - 1);
  return positions;
}

// An op over a batch: inputs [num_rows, input_width] in, outputs [num_rows, output_width] out, compared as bits.
template <typename Out>
using BatchOp = std::function<std::vector<Out>(const std::vector<float>& inputs, int64_t num_rows)>;

// A filler row of the op's input width.
using RowMaker = std::function<std::vector<float>(std::mt19937_64& random)>;

// Rows of uniform values in [-spread, spread].
inline RowMaker uniform_rows(int64_t width, float spread) {
  return [width, spread](std::mt19937_64& random) {
    std::uniform_real_distribution<float> uniform(-spread, spread);
    std::vector<float> row(static_cast<size_t>(width));
    for (float& value : row) value = uniform(random);
    return row;
  };
}

template <typename Out>
std::string describe_entry(Out value) {
  std::ostringstream out;
  out.precision(17);
  out << value << " (bits 0x" << std::hex;
  unsigned char bytes[sizeof(Out)];
  std::memcpy(bytes, &value, sizeof(Out));
  for (size_t i = sizeof(Out); i-- > 0;) out << (bytes[i] < 16 ? "0" : "") << int(bytes[i]);
  out << ")";
  return out.str();
}

// "entry i: alone A, embedded B" for the first entry whose bits differ, or empty when none does.
template <typename Out>
std::string first_difference(const Out* alone, const Out* embedded, int64_t width) {
  for (int64_t i = 0; i < width; ++i)
    if (std::memcmp(&alone[i], &embedded[i], sizeof(Out)) != 0)
      return "entry " + std::to_string(i) + ": alone " + describe_entry(alone[i]) + ", embedded " +
             describe_entry(embedded[i]);
  return {};
}

// The probe's outputs alone and at every probe position of every batch size, fillers drawn from make_filler.
// Fails naming the batch size, the position and the first entry that differs.
template <typename Out>
void expect_row_invariant(const BatchOp<Out>& op, const std::vector<float>& probe, int64_t output_width,
                          const RowMaker& make_filler, const std::vector<int64_t>& batch_sizes = kInvarianceBatchSizes,
                          uint64_t seed = 1) {
  const std::vector<Out> alone = op(probe, 1);
  ASSERT_EQ(int64_t(alone.size()), output_width);
  std::mt19937_64 random(seed);
  for (const int64_t num_rows : batch_sizes)
    for (const int64_t position : probe_positions(num_rows)) {
      std::vector<float> inputs;
      for (int64_t r = 0; r < num_rows; ++r) {
        const std::vector<float> row = r == position ? probe : make_filler(random);
        ASSERT_EQ(row.size(), probe.size());
        inputs.insert(inputs.end(), row.begin(), row.end());
      }
      const std::vector<Out> outputs = op(inputs, num_rows);
      ASSERT_EQ(int64_t(outputs.size()), num_rows * output_width);
      const std::string difference = first_difference(alone.data(), outputs.data() + position * output_width,
                                                      output_width);
      EXPECT_TRUE(difference.empty()) << "the probe at row " << position << " of " << num_rows << ", " << difference;
    }
}

}  // namespace jambo::testing
