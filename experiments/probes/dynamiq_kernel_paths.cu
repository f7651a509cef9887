// The steady-state path of each DynamiQ warp-path kernel, for SASS counts
// (never run; compile and count):
//   nvcc -arch=sm_90 -cubin --fmad=false -std=c++20 -O3 -Icsrc -Xptxas -v -DDYNAMIQ_CURAND_DEVICE=1 -isystem=<curand include> experiments/probes/dynamiq_kernel_paths.cu -o /tmp/paths.cubin
//   cuobjdump -sass /tmp/paths.cubin | python3 experiments/probes/sass_counts.py -
// Each probe kernel runs the real kernel body (warp_sg of
// csrc/kernels/dynamiq/cuda/dynamiq_kernels.cu) with what varies at run time
// pinned to the default configuration, so the compiler drops every other
// path: S = 256, s = 16, hierarchical round-up scales, stochastic rounding
// (independent: kIndep, or correlated over 4 ranks with the table: kCorr),
// fp32 bucket and accumulator 16-byte aligned, a full SG (8 values per
// thread), width B, the SG at the start of a 16-byte aligned message (its code
// bytes 2-byte aligned, as every SG of the default format). One warp per SG,
// one octet per thread: SASS instructions / 8 = instructions per value.
#include "../../csrc/kernels/dynamiq/cuda/dynamiq_kernels.cu"

namespace dynamiq {
namespace cuda {
namespace {

template <class T>
__device__ T* align16(T* p) {
  return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t(15));
}

template <int Kind, int B, bool kCorr>
__global__ void __launch_bounds__(kThreads, kMinBlocks) probe(Args a) {
  a.f = DynamiqFormat{256, 16, true};
  a.stochastic_scales = false;
  a.rd.stochastic = true;
  a.rd.correlated = kCorr;
  if (kCorr) a.rd.perm.n = 4;
  a.p.dtype = DType::kF32;
  a.p.unit = 256;
  a.x.bucket = align16(a.x.bucket);
  a.x.acc = nullptr;
  a.acc = align16(a.acc);
  a.y.bucket = align16(a.y.bucket);
  a.in = align16(a.in);
  a.out = align16(a.out);
  SgPos g;
  g.t = int(threadIdx.x) & 31;
  g.w = a.w0 + (int64_t(blockIdx.x) * kThreads + int64_t(threadIdx.x)) / 32;
  g.src = g.w;
  g.B = B;
  g.n = 8;
  g.wire = 0;
  g.live = true;
  warp_sg<Kind>(a, g);
}

template __global__ void probe<kCompress, 4, false>(Args);
template __global__ void probe<kCompress, 4, true>(Args);
template __global__ void probe<kCompress, 8, false>(Args);
template __global__ void probe<kCompress, 2, false>(Args);
template __global__ void probe<kFused, 4, false>(Args);
template __global__ void probe<kFused, 4, true>(Args);
template __global__ void probe<kDecAcc, 4, false>(Args);
template __global__ void probe<kDecompress, 4, false>(Args);

}  // namespace
}  // namespace cuda
}  // namespace dynamiq
