// JAMBO_HOST_DEVICE marks a function that host code and CUDA kernels both call (nvcc compiles it for both;
// g++ sees a plain inline function), so a rule shared by the CPU and the GPU has one definition.
#pragma once

#ifdef __CUDACC__
#define JAMBO_HOST_DEVICE __host__ __device__
#else
#define JAMBO_HOST_DEVICE
#endif
