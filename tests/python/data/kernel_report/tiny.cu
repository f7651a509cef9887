// Input of tests/python/test_kernel_report.py: small kernels with known properties, compiled once
// (the recorded compiler output lies beside this file; README.md says how it was made).

// A grid-stride loop over float4, one float4 (4 values) per thread per pass, not unrolled.
__global__ void scale4(const float4* __restrict__ x, float4* __restrict__ y, float a, long n4) {
#pragma unroll 1
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n4; i += long(gridDim.x) * blockDim.x) {
    float4 v = x[i];
    v.x *= a;
    v.y *= a;
    v.z *= a;
    v.w *= a;
    y[i] = v;
  }
}

// A per-thread array written and read at run-time indices: it lives in local memory (a stack frame
// of 64 floats, no spill).
__global__ void local_array(const int* idx, float* out) {
  float t[64];
  for (int i = 0; i < 64; ++i) t[i] = out[i];
  for (int j = 0; j < 4; ++j) t[idx[j] & 63] += 1.0f;
  out[threadIdx.x] = t[idx[threadIdx.x] & 63];
}

// 24 values live across a reduction, with at most 24 registers (__maxnreg__): ptxas spills (y may
// alias x, so the values cannot be loaded again).
__global__ void __maxnreg__(24) spill(const float* x, float* y) {
  float v[24];
#pragma unroll
  for (int i = 0; i < 24; ++i) v[i] = x[threadIdx.x + i * 1024];
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 24; ++i) s += v[i] * v[i];
#pragma unroll
  for (int i = 0; i < 24; ++i) y[threadIdx.x + i * 1024] = v[i] * s;
}

// Static shared memory (1 KiB) and a barrier.
__global__ void reverse256(float* x) {
  __shared__ float buf[256];
  buf[threadIdx.x] = x[blockIdx.x * 256 + threadIdx.x];
  __syncthreads();
  x[blockIdx.x * 256 + threadIdx.x] = buf[255 - threadIdx.x];
}

// Nested loops, neither unrolled: the inner one (one value per pass) is the innermost loop.
__global__ void nested(const float* __restrict__ x, float* __restrict__ y, long n) {
#pragma unroll 1
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x) {
    float s = 0.0f;
#pragma unroll 1
    for (int k = 0; k < 8; ++k) s += x[i * 8 + k];
    y[i] = s;
  }
}
