// lossless_decode_cuda and lossless_encode_cuda (csrc/kernels/lossless/lossless_cuda.h)
// with scratch of their own, for the CUDA tests.
#pragma once

#include <cuda_runtime.h>

#include "kernels/lossless/lossless_cuda.h"

namespace dynamiq {
namespace dqtest {

// Decodes the device message dmsg (bytes long) of n t values into the device
// buffer dy and returns the refusal it recorded (kind kNone: decoded).
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

// Encodes the n t values at the device pointer dx into the device buffer dmsg
// (room for static + plain bytes) with the given formats; returns the message's size.
inline size_t encode_on_device(DType t, const void* dx, int64_t n, uint8_t* dmsg, uint32_t formats) {
  const lossless::Layout L = lossless::make_layout(t, n);
  LosslessEncodeScratch sc;
  void* p = nullptr;
  auto alloc = [&](size_t b) {
    p = nullptr;
    if (cudaMalloc(&p, b ? b : 1) != cudaSuccess) throw Error("test: cudaMalloc failed");
    return p;
  };
  sc.state = static_cast<LosslessEncodeState*>(alloc(lossless_encode_state_bytes()));
  sc.exps = static_cast<uint8_t*>(alloc(size_t(L.body)));
  sc.sizes = static_cast<uint32_t*>(alloc(size_t(L.segments + 1) * 4));
  sc.start = static_cast<uint32_t*>(alloc(size_t(L.segments + 1) * 4));
  sc.dynamic = static_cast<uint32_t*>(alloc(4));
  if (cudaMemset(sc.state, 0, lossless_encode_state_bytes()) != cudaSuccess) throw Error("test: cudaMemset failed");
  lossless_encode_cuda(t, dx, n, dmsg, formats, sc, nullptr);
  uint32_t dyn = 0;
  if (cudaMemcpy(&dyn, sc.dynamic, 4, cudaMemcpyDeviceToHost) != cudaSuccess) throw Error("test: copy failed");
  for (void* q : {static_cast<void*>(sc.state), static_cast<void*>(sc.exps), static_cast<void*>(sc.sizes),
                  static_cast<void*>(sc.start), static_cast<void*>(sc.dynamic)})
    cudaFree(q);
  if (int64_t(dyn) > L.plain_bytes) throw Error("test: the GPU encode reports a section past its bound");
  return size_t(L.static_bytes) + dyn;
}

}  // namespace dqtest
}  // namespace dynamiq
