// Shared by every kernel: included textually (src/kernels/toolchain.rs expands
// `#include "common.cuh"`, since the sources are compiled from memory).
#pragma once

// bf16 is the top half of an fp32; converted by hand so that the kernels
// need no CUDA header (NVRTC ships none for bf16 that is found everywhere).
typedef unsigned short bf16;
__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ float load(const bf16* p) { return __uint_as_float(((unsigned)*p) << 16); }
__device__ __forceinline__ bf16 to_bf16(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);                     // round to nearest even
  return (bf16)(u >> 16);
}
