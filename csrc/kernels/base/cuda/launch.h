// CUDA error checks, kernel launches and dynamic shared memory, spelled so that the same sources
// build with nvcc and, for the GPU tests on machines without a GPU, with the
// host compiler against the CPU emulation of the runtime (tests/cpp/cuda_emu).
//   DQ_LAUNCH(kernel, grid, block, smem, stream)(args...)  ==  kernel<<<grid, block, smem, stream>>>(args...)
//   DQ_DYNAMIC_SMEM(name);  a pointer `unsigned char* name` to the block's dynamic shared memory
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "kernels/base/common.h"

#if defined(DYNAMIQ_CUDA_EMULATION)
#define DQ_LAUNCH(kernel, grid, block, smem, stream) \
  ::dynamiq_cuda_emu::launcher(kernel, grid, block, smem, stream)
#define DQ_DYNAMIC_SMEM(name) unsigned char* name = ::dynamiq_cuda_emu::dynamic_smem()
#else
#define DQ_LAUNCH(kernel, grid, block, smem, stream) kernel<<<grid, block, smem, stream>>>
#define DQ_DYNAMIC_SMEM(name)                         \
  extern __shared__ __align__(16) unsigned char smem_[]; \
  unsigned char* name = smem_
#endif

namespace dynamiq {
namespace cuda {

// Throws Error("<who>: <what>: <CUDA's message>") unless e is cudaSuccess.
inline void check(cudaError_t e, const char* who, const std::string& what) {
  if (e != cudaSuccess) throw Error(std::string(who) + ": " + what + ": " + cudaGetErrorString(e));
}

}  // namespace cuda
}  // namespace dynamiq
