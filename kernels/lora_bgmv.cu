// Batched gather matrix-vector products for LoRA with one adapter per row
// (Punica's BGMV, as vLLM and S-LoRA use it): row i of x uses adapter idx[i]
// of the stacked factors A [K, r, in] and B [K, out, r]:
//   y[i] += scale * B[idx[i]] (A[idx[i]] x[i])
// `shrink` computes v = A x (one block per (row, rank)); `expand` adds
// scale * B v into y (one thread per output). Accumulation is fp32.
#include "common.cuh"

#define BLOCK 256

__device__ __forceinline__ void add(float* p, float v) { *p += v; }
__device__ __forceinline__ void add(bf16* p, float v) { *p = to_bf16(load(p) + v); }

template <typename T>
__device__ void shrink(const T* x, const T* a, const long long* idx, float* v, int in, int r) {
  const int row = blockIdx.x, k = blockIdx.y;
  const T* xr = x + (long long)row * in;
  const T* ar = a + (idx[row] * r + k) * (long long)in;
  float acc = 0.f;
  for (int j = threadIdx.x; j < in; j += BLOCK) acc += load(xr + j) * load(ar + j);
  __shared__ float red[BLOCK];
  red[threadIdx.x] = acc;
  __syncthreads();
  for (int w = BLOCK / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) v[(long long)row * r + k] = red[0];
}

template <typename T>
__device__ void expand(const float* v, const T* b, const long long* idx, T* y, int out, int r,
                       float scale) {
  const int row = blockIdx.x;
  const int o = blockIdx.y * BLOCK + threadIdx.x;
  if (o >= out) return;
  const T* br = b + (idx[row] * out + o) * (long long)r;
  const float* vr = v + (long long)row * r;
  float acc = 0.f;
  for (int k = 0; k < r; ++k) acc += load(br + k) * vr[k];
  add(y + (long long)row * out + o, scale * acc);
}

extern "C" __global__ void shrink_f32(const float* x, const float* a, const long long* idx, float* v, int in, int r) {
  shrink<float>(x, a, idx, v, in, r);
}
extern "C" __global__ void shrink_bf16(const bf16* x, const bf16* a, const long long* idx, float* v, int in,
            int r) {
  shrink<bf16>(x, a, idx, v, in, r);
}
extern "C" __global__ void expand_f32(const float* v, const float* b, const long long* idx, float* y, int out, int r,
           float scale) {
  expand<float>(v, b, idx, y, out, r, scale);
}
extern "C" __global__ void expand_bf16(const float* v, const bf16* b, const long long* idx, bf16* y, int out,
            int r, float scale) {
  expand<bf16>(v, b, idx, y, out, r, scale);
}
