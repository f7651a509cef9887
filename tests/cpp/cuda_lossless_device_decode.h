// lossless_decode_cuda (csrc/kernels/lossless/lossless_cuda.h) with scratch of
// its own, for the CUDA tests: decodes the device message dmsg (bytes long) of
// n t values into the device buffer dy and returns the refusal it recorded
// (kind kNone: decoded).
#pragma once

#include <cuda_runtime.h>

#include "kernels/lossless/lossless_cuda.h"

namespace dynamiq {
namespace dqtest {

inline lossless::Fault decode_on_device(DType t, const uint8_t* dmsg, size_t bytes, int64_t n,
                                                 void* dy) {
  const lossless::Layout L = lossless::make_layout(t, n);
  LosslessDecodeScratch sc;
  void* p = nullptr;
  auto alloc = [&](size_t b) {
    p = nullptr;
    if (cudaMalloc(&p, b ? b : 1) != cudaSuccess) throw Error("test: cudaMalloc failed");
    return p;
  };
  sc.plan = static_cast<LosslessDevicePlan*>(alloc(sizeof(LosslessDevicePlan)));
  sc.seg_start = static_cast<uint32_t*>(alloc(size_t(L.segments + 1) * 4));
  sc.table = static_cast<uint16_t*>(alloc(lossless::kDecodeTableSize * 2));
  sc.exps = static_cast<uint8_t*>(alloc(size_t(L.body)));
  sc.fault = static_cast<lossless::Fault*>(alloc(sizeof(lossless::Fault)));
  if (cudaMemset(sc.fault, 0, sizeof(lossless::Fault)) != cudaSuccess) throw Error("test: cudaMemset failed");
  lossless_decode_cuda(t, dmsg, bytes, n, dy, sc, nullptr);
  lossless::Fault f{};
  if (cudaMemcpy(&f, sc.fault, sizeof(f), cudaMemcpyDeviceToHost) != cudaSuccess) throw Error("test: copy failed");
  for (void* q : {static_cast<void*>(sc.plan), static_cast<void*>(sc.seg_start), static_cast<void*>(sc.table),
                  static_cast<void*>(sc.exps), static_cast<void*>(sc.fault)})
    cudaFree(q);
  return f;
}

}  // namespace dqtest
}  // namespace dynamiq
