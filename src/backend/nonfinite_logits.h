// Logits that hold NaN or infinity carry no distribution: a token chosen from them, and every logprob taken from
// them, would be noise. The backends flag such a row (RowOutput::finite); whoever drives a backend refuses it with
// NonFiniteLogits, naming the row's owner and step, so that every command fails loudly: the CLI exits 5, the server
// answers that request 500 and goes on with the others.
#pragma once

#include "backend/backend.h"
#include "core/error.h"

#include <functional>
#include <string>
#include <string_view>

namespace jambo::backend {

class NonFiniteLogits : public Error {
 public:
  using Error::Error;
};

// "{where}: the logits are not finite (NaN or infinity), ..."; `where` names the row's owner and its step.
std::string nonfinite_logits_message(std::string_view where);

// Throws NonFiniteLogits for the first row of the step whose logits were not finite; where(r) names row r and the
// step.
void require_finite_logits(const StepOutput& output, const std::function<std::string(size_t row)>& where);

}  // namespace jambo::backend
