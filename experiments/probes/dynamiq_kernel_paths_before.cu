// dynamiq_kernel_paths.cu for the kernel before the octet rewrite (commit
// cbfb350: one kernel for every operation, a block of 256 threads per super-
// group, one element per thread, two Philox calls per element). Compile it
// against that commit's sources:
//   git worktree add --detach /tmp/dq-before cbfb350
//   nvcc -arch=sm_90 -cubin --fmad=false -std=c++20 -O3 -I/tmp/dq-before/csrc -Xptxas -v -DDYNAMIQ_CURAND_DEVICE=1 -isystem=<curand include> experiments/probes/dynamiq_kernel_paths_before.cu -o /tmp/paths_before.cubin
// Same pinned configuration as dynamiq_kernel_paths.cu; one element per
// thread, so SASS instructions per thread = instructions per value.
#include "kernels/dynamiq/cuda/dynamiq_kernels.cu"

namespace dynamiq {
namespace cuda {
namespace {

template <class T>
__device__ T* align16(T* p) {
  return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t(15));
}

template <int Kind, int B, bool kCorr>
__global__ void probe_before(Args a) {
  DQ_DYNAMIC_SMEM(smem);
  a.f = DynamiqFormat{256, 16, true};
  a.stochastic_scales = false;
  a.rd.stochastic = true;
  a.rd.correlated = kCorr;
  if (kCorr) a.rd.perm.n = 4;
  a.p.dtype = DType::kF32;
  a.p.unit = 256;
  a.x.acc = nullptr;
  constexpr int S = 256, G = 16;
  float* tile = reinterpret_cast<float*>(smem);
  uint32_t* gm = reinterpret_cast<uint32_t*>(tile + S);
  float* inv = reinterpret_cast<float*>(gm + G);
  uint8_t* codes = reinterpret_cast<uint8_t*>(inv + G);
  const int64_t w = a.w0 + blockIdx.x;
  run_block<B>(a, Kind, w, w, tile, gm, inv, codes);
}

template __global__ void probe_before<kCompress, 4, false>(Args);
template __global__ void probe_before<kCompress, 4, true>(Args);
template __global__ void probe_before<kCompress, 8, false>(Args);
template __global__ void probe_before<kCompress, 2, false>(Args);
template __global__ void probe_before<kFused, 4, false>(Args);
template __global__ void probe_before<kFused, 4, true>(Args);
template __global__ void probe_before<kDecAcc, 4, false>(Args);
template __global__ void probe_before<kDecompress, 4, false>(Args);

}  // namespace
}  // namespace cuda
}  // namespace dynamiq
