#include "model/finite_values.h"

#include <algorithm>
#include <vector>

namespace jambo::model {
namespace {

constexpr int64_t kChunkElements = int64_t(1) << 16;  // one thread's unit of work

// A value is NaN or infinite exactly when every exponent bit is set, in all three formats. The masked bits never
// exceed the mask, so their largest equals it when some value is not finite: a reduction without a branch, which
// the compiler turns into vector maxima.
template <typename Bits>
bool any_nonfinite(const Bits* bits, int64_t count, Bits exponent_mask) {
  Bits largest = 0;
  for (int64_t i = 0; i < count; ++i) largest = std::max<Bits>(largest, Bits(bits[i] & exponent_mask));
  return largest == exponent_mask;
}

template <typename Bits>
std::optional<int64_t> first_nonfinite(const Bits* bits, int64_t begin, int64_t end, Bits exponent_mask) {
  if (!any_nonfinite(bits + begin, end - begin, exponent_mask)) return std::nullopt;
  while ((bits[begin] & exponent_mask) != exponent_mask) ++begin;
  return begin;
}

// The first non-finite element of view elements [begin, end).
std::optional<int64_t> first_nonfinite(const TensorView& view, int64_t begin, int64_t end) {
  switch (view.dtype) {
    case DType::F32: return first_nonfinite(static_cast<const uint32_t*>(view.data), begin, end, 0x7f800000u);
    case DType::BF16: return first_nonfinite(static_cast<const uint16_t*>(view.data), begin, end, uint16_t(0x7f80));
    case DType::F16: return first_nonfinite(static_cast<const uint16_t*>(view.data), begin, end, uint16_t(0x7c00));
  }
  return std::nullopt;
}

struct Chunk {
  size_t view;
  int64_t begin, end;
};

}  // namespace

std::optional<NonFiniteValue> find_nonfinite(std::span<const TensorView> views) {
  std::vector<Chunk> chunks;
  for (size_t v = 0; v < views.size(); ++v)
    for (int64_t begin = 0; begin < views[v].numel(); begin += kChunkElements)
      chunks.push_back({v, begin, std::min(begin + kChunkElements, views[v].numel())});
  const int64_t num_chunks = int64_t(chunks.size());
  int64_t first_bad = num_chunks;
#pragma omp parallel for schedule(dynamic, 16) reduction(min : first_bad) if (num_chunks > 1)
  for (int64_t c = 0; c < num_chunks; ++c)
    if (first_nonfinite(views[chunks[c].view], chunks[c].begin, chunks[c].end)) first_bad = std::min(first_bad, c);
  if (first_bad == num_chunks) return std::nullopt;
  const Chunk& chunk = chunks[size_t(first_bad)];
  const int64_t index = *first_nonfinite(views[chunk.view], chunk.begin, chunk.end);
  return NonFiniteValue{chunk.view, index, views[chunk.view].at(index)};
}

}  // namespace jambo::model
