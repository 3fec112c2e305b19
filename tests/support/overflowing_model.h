// A model whose weights are all finite but whose logits are not, past a sequence's first token: the first Mamba
// layer's conv taps on earlier tokens are 3e38, so a token with a predecessor overflows the conv. A sequence's first
// token multiplies those taps by the zero conv tail and computes normally. tests/support/checkpoint_edits.sh makes
// the same edit of the demo checkpoint for the CLI and server tests.
#pragma once

#include "model/weights.h"
#include "support/test_models.h"

#include <gtest/gtest.h>

namespace jambo::testing {

inline model::Model overflowing_model() {
  model::Model model = make_random_model(small_config(), DType::F32, /*seed=*/11);
  const int64_t num_channels = model.config.mamba_d_inner, kernel = model.config.mamba_d_conv;
  for (const model::LayerWeights& layer : model.weights.layers) {
    if (layer.mixer != model::MixerKind::Mamba) continue;
    float* taps = const_cast<float*>(static_cast<const float*>(layer.mamba.conv_weight.data));  // [Di, 1, K]
    for (int64_t channel = 0; channel < num_channels; ++channel)
      for (int64_t k = 0; k + 1 < kernel; ++k) taps[channel * kernel + k] = 3e38f;  // the last tap is the token's own
    return model;
  }
  ADD_FAILURE() << "the model has no Mamba layer";
  return model;
}

}  // namespace jambo::testing
