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
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <tuple>
#endif

#if defined(DYNAMIQ_CUDA_EMULATION)
// (on the emulation a launch can also be recorded: record_launch below)
#define DQ_LAUNCH(kernel, grid, block, smem, stream) \
  ::dynamiq::cuda::record_launch(#kernel, __FILE__, ::dynamiq_cuda_emu::launcher(kernel, grid, block, smem, stream))
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

#if defined(DYNAMIQ_CUDA_EMULATION)
// The launch configurations the launchers make, for scripts/kernel_report.sh (occupancy needs the
// threads per block and the dynamic shared bytes as launched, not as copied into a table by hand):
// with DYNAMIQ_CUDA_EMU_LAUNCH_LOG=<file>, each distinct (kernel, source file, grid, block, dynamic
// shared bytes) launched is appended to <file> as one line "kernel\tfile\tGxGxG\tBxBxB\tbytes". The
// kernel is DQ_LAUNCH's first argument as written (e.g. "compress_kernel<T>").
inline void record_launch_config(const char* kernel, const char* file, dim3 g, dim3 b, size_t smem) {
  static const char* const path = std::getenv("DYNAMIQ_CUDA_EMU_LAUNCH_LOG");
  if (!path || !*path) return;
  static std::mutex mu;
  static std::set<std::tuple<std::string, std::string, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, size_t>>
      seen;
  const std::lock_guard<std::mutex> held(mu);
  if (!seen.emplace(kernel, file, g.x, g.y, g.z, b.x, b.y, b.z, smem).second) return;
  if (std::FILE* f = std::fopen(path, "a")) {
    std::fprintf(f, "%s\t%s\t%ux%ux%u\t%ux%ux%u\t%zu\n", kernel, file, g.x, g.y, g.z, b.x, b.y, b.z, smem);
    std::fclose(f);
  }
}
template <class L>
L record_launch(const char* kernel, const char* file, L launch) {
  record_launch_config(kernel, file, launch.grid, launch.block, launch.smem);
  return launch;
}
#endif

}  // namespace cuda
}  // namespace dynamiq
