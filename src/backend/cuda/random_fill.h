// Seeded random weights generated on the GPU, bitwise equal to the host fill (model/random_weights.cpp): both
// compute each element with the one definition of model/random_values.h.
#pragma once

#include "model/random_values.h"

#include <cuda_runtime_api.h>

namespace jambo::backend::cuda {

// out[i] = tensor's element i in tensor.dtype (fp32, or bf16 / IEEE half bits rounded to nearest even), for
// i < tensor.numel. Only for arithmetic initializers (tensor.init.is_arithmetic()).
void fill_random(const model::RandomTensor& tensor,
                 void* out,  // [tensor.numel] of tensor.dtype
                 cudaStream_t stream);

}  // namespace jambo::backend::cuda
