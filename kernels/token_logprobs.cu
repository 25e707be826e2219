// Row statistics of a chunk of vocabulary logits, for the fused log-prob of
// sampled tokens (src/kernels/fused.rs). One block per row of `z` [n, V]:
//   lp[i]  = z[i, y_i] - logsumexp(z[i])        (log-prob of the sampled token)
//   ent[i] = logsumexp(z[i]) - sum_v p_iv z_iv   (entropy of the row's softmax)
// and the row is overwritten in place by its softmax p (same dtype), which the
// caller multiplies by the output projection for the gradient w.r.t. the
// hidden state. Everything is accumulated in fp32 whatever the logits' dtype,
// so no fp32 copy of the chunk is ever allocated.
#include "common.cuh"

#define BLOCK 512
#define NEG_INF __int_as_float(0xff800000)

struct Stat {
  float m;  // running max
  float s;  // sum exp(z - m)
  float t;  // sum exp(z - m) * z
};

__device__ __forceinline__ Stat merge(Stat a, Stat b) {
  float m = fmaxf(a.m, b.m);
  if (m == NEG_INF) return a;
  float ea = a.m == NEG_INF ? 0.f : __expf(a.m - m);
  float eb = b.m == NEG_INF ? 0.f : __expf(b.m - m);
  Stat r;
  r.m = m;
  r.s = a.s * ea + b.s * eb;
  r.t = a.t * ea + b.t * eb;
  return r;
}

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(bf16* p, float v) { *p = to_bf16(v); }

template <typename T>
__device__ void row_stats(T* z, const long long* y, float* lp, float* ent, long long v) {
  const long long row = blockIdx.x;
  T* zr = z + row * v;
  Stat st = {NEG_INF, 0.f, 0.f};
  for (long long j = threadIdx.x; j < v; j += BLOCK) {
    float x = load(zr + j);
    Stat one = {x, 1.f, x};
    st = merge(st, one);
  }
  __shared__ float sm[BLOCK], ss[BLOCK], st_[BLOCK];
  sm[threadIdx.x] = st.m;
  ss[threadIdx.x] = st.s;
  st_[threadIdx.x] = st.t;
  __syncthreads();
  for (int w = BLOCK / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) {
      Stat a = {sm[threadIdx.x], ss[threadIdx.x], st_[threadIdx.x]};
      Stat b = {sm[threadIdx.x + w], ss[threadIdx.x + w], st_[threadIdx.x + w]};
      Stat r = merge(a, b);
      sm[threadIdx.x] = r.m;
      ss[threadIdx.x] = r.s;
      st_[threadIdx.x] = r.t;
    }
    __syncthreads();
  }
  const float m = sm[0], s = ss[0], t = st_[0];
  const float lse = m + __logf(s);
  if (threadIdx.x == 0) {
    long long target = y[row];
    lp[row] = load(zr + target) - lse;
    ent[row] = lse - t / s;
  }
  // Every thread has read the target logit above only after the reduction's
  // last barrier; one more barrier before the row is overwritten.
  __syncthreads();
  for (long long j = threadIdx.x; j < v; j += BLOCK) {
    store(zr + j, __expf(load(zr + j) - lse));
  }
}

extern "C" __global__ void row_stats_f32(float* z, const long long* y, float* lp, float* ent, long long v) {
  row_stats<float>(z, y, lp, ent, v);
}

extern "C" __global__ void row_stats_bf16(bf16* z, const long long* y, float* lp, float* ent, long long v) {
  row_stats<bf16>(z, y, lp, ent, v);
}
