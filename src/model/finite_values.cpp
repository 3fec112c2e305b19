#include "model/finite_values.h"

#include <algorithm>

namespace jambo::model {
namespace {

constexpr int64_t kChunkElements = int64_t(1) << 16;  // one thread's unit of work

// A value is NaN or infinite exactly when every exponent bit is set, in all three formats. The masked bits never
// exceed the mask, so the largest of them equals it when some value is not finite: a reduction without a branch,
// which the compiler turns into vector maxima.
template <typename Bits>
bool any_nonfinite(const Bits* bits, int64_t count, Bits exponent_mask) {
  Bits largest = 0;
  for (int64_t i = 0; i < count; ++i) largest = std::max<Bits>(largest, Bits(bits[i] & exponent_mask));
  return largest == exponent_mask;
}

template <typename Bits>
std::optional<int64_t> first_nonfinite(const Bits* bits, int64_t count, Bits exponent_mask) {
  const int64_t num_chunks = (count + kChunkElements - 1) / kChunkElements;
  int64_t first_chunk = num_chunks;
#pragma omp parallel for schedule(static) reduction(min : first_chunk) if (num_chunks > 1)
  for (int64_t chunk = 0; chunk < num_chunks; ++chunk) {
    const int64_t begin = chunk * kChunkElements;
    if (any_nonfinite(bits + begin, std::min(kChunkElements, count - begin), exponent_mask))
      first_chunk = std::min(first_chunk, chunk);
  }
  if (first_chunk == num_chunks) return std::nullopt;
  int64_t index = first_chunk * kChunkElements;
  while ((bits[index] & exponent_mask) != exponent_mask) ++index;
  return index;
}

}  // namespace

std::optional<NonFiniteValue> find_nonfinite(const TensorView& view) {
  const int64_t count = view.numel();
  const std::optional<int64_t> index =
      view.dtype == DType::F32    ? first_nonfinite(static_cast<const uint32_t*>(view.data), count, 0x7f800000u)
      : view.dtype == DType::BF16 ? first_nonfinite(static_cast<const uint16_t*>(view.data), count, uint16_t(0x7f80))
                                  : first_nonfinite(static_cast<const uint16_t*>(view.data), count, uint16_t(0x7c00));
  if (!index) return std::nullopt;
  return NonFiniteValue{*index, view.at(*index)};
}

}  // namespace jambo::model
