// A minimal safetensors writer for tests, written from the format description (not with jambo's
// reader): 8-byte little-endian header length, JSON header, raw data. Tests can edit the header
// JSON or the length before writing to craft broken files.
#pragma once

#include "core/dtype.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace jambo::model_test {

struct TestTensor {
  std::string name;
  std::string dtype;            // "F32", "BF16", "F16" or anything else for error tests
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;   // raw little-endian data
};

// Half-precision bits of a float that f16 holds exactly (the tests only use such values).
inline uint16_t exact_f16_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  const uint16_t sign = uint16_t((bits >> 16) & 0x8000);
  if ((bits & 0x7fffffffu) == 0) return sign;
  const int32_t exponent = int32_t((bits >> 23) & 0xff) - 127 + 15;
  const uint32_t mantissa = bits & 0x7fffffu;
  EXPECT_TRUE(exponent >= 1 && exponent <= 30 && (mantissa & 0x1fffu) == 0)
      << value << " is not an exact normal f16 value";
  return uint16_t(sign | (uint32_t(exponent) << 10) | (mantissa >> 13));
}

// Encodes values (exactly representable in the dtype) as a tensor of that dtype.
inline TestTensor make_tensor(std::string name, DType dtype, std::vector<int64_t> shape,
                              const std::vector<float>& values) {
  TestTensor tensor{std::move(name), std::string(dtype_name(dtype)), std::move(shape), {}};
  for (float value : values) {
    uint32_t word = 0;
    int num_bytes = int(dtype_size(dtype));
    if (dtype == DType::F32) std::memcpy(&word, &value, 4);
    if (dtype == DType::BF16) word = to_bf16(value).bits;
    if (dtype == DType::F16) word = exact_f16_bits(value);
    for (int i = 0; i < num_bytes; ++i) tensor.bytes.push_back(uint8_t(word >> (8 * i)));
  }
  return tensor;
}

// The header of tensors laid out back to back in the given order.
inline nlohmann::json header_for(const std::vector<TestTensor>& tensors) {
  nlohmann::json header = {{"__metadata__", {{"format", "pt"}}}};
  int64_t offset = 0;
  for (const TestTensor& tensor : tensors) {
    const int64_t end = offset + int64_t(tensor.bytes.size());
    header[tensor.name] = {{"dtype", tensor.dtype}, {"shape", tensor.shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  return header;
}

inline std::vector<uint8_t> data_for(const std::vector<TestTensor>& tensors) {
  std::vector<uint8_t> data;
  for (const TestTensor& tensor : tensors) data.insert(data.end(), tensor.bytes.begin(), tensor.bytes.end());
  return data;
}

// Writes a file from raw parts; `header_length` overrides the true length of `header_text`.
inline void write_file(const std::filesystem::path& path, const std::string& header_text,
                       const std::vector<uint8_t>& data, std::optional<uint64_t> header_length = {}) {
  const uint64_t length = header_length.value_or(header_text.size());
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < 8; ++i) out.put(char(uint8_t(length >> (8 * i))));
  out << header_text;
  out.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
}

inline void write_safetensors(const std::filesystem::path& path, const std::vector<TestTensor>& tensors) {
  write_file(path, header_for(tensors).dump(), data_for(tensors));
}

}  // namespace jambo::model_test
