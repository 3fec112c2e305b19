#include "backend/nonfinite_logits.h"

#include <fmt/format.h>

namespace jambo::backend {

std::string nonfinite_logits_message(std::string_view where) {
  return fmt::format(
      "{}: the logits are not finite (NaN or infinity), so no token or logprob can be taken from them: an activation "
      "overflowed (half precision, --cuda-weights f16, overflows first) or a state went bad (--check names a stale "
      "state read)",
      where);
}

void require_finite_logits(const StepOutput& output, const std::function<std::string(size_t row)>& where) {
  for (size_t r = 0; r < output.rows.size(); ++r)
    if (!output.rows[r].finite) throw NonFiniteLogits(nonfinite_logits_message(where(r)));
}

}  // namespace jambo::backend
