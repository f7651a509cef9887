// IdentityCudaCodec: see identity_cuda_codec.h. Elementwise kernels, one
// element per thread in a grid-stride loop, over the DTypeTraits conversions
// the CPU codec uses.
#include "kernels/identity/cuda/identity_cuda_codec.h"

#include <algorithm>
#include <string>

#include "kernels/base/float_bits.h"
#include "kernels/base/cuda/launch.h"
#include "kernels/registry.h"

namespace dynamiq {
namespace cuda {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t n) { return unsigned(std::min<int64_t>((n + kThreads - 1) / kThreads, 4096)); }

// The block's element range, as the CPU codec computes it (static_bytes has
// already validated the plan).
struct Span {
  int64_t e0, e1;
};
Span span_of(const Plan& plan, const Block& b) {
  const int64_t e1 = std::min(b.w1 * plan.unit, plan.numel);
  return {std::min(b.w0 * plan.unit, e1), e1};
}

// out[i] = store(x[i] (+ in[i])): x is float (an accumulator) or the dtype;
// in (may be null) the received dtype values.
template <DType T>
__global__ void sum_store_kernel(const void* x, bool x_is_f32, const void* in, void* out, int64_t n) {
  using Tr = DTypeTraits<T>;
  using S = typename Tr::storage;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float v = x_is_f32 ? static_cast<const float*>(x)[i] : Tr::load(static_cast<const S*>(x), i);
    if (in) v = v + Tr::load(static_cast<const S*>(in), i);
    Tr::store(static_cast<S*>(out), i, v);
  }
}

// acc[i] = x[i] + in[i] in float.
template <DType T>
__global__ void sum_acc_kernel(const void* x, bool x_is_f32, const void* in, float* acc, int64_t n) {
  using Tr = DTypeTraits<T>;
  using S = typename Tr::storage;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x_is_f32 ? static_cast<const float*>(x)[i] : Tr::load(static_cast<const S*>(x), i);
    acc[i] = v + Tr::load(static_cast<const S*>(in), i);
  }
}

// y[i] = store((x[i] + in[i]) / d): the reduce-scatter sink (a division only for d != 1).
template <DType T>
__global__ void sum_out_kernel(const void* x, bool x_is_f32, const void* in, void* y, float d, int64_t n) {
  using Tr = DTypeTraits<T>;
  using S = typename Tr::storage;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x_is_f32 ? static_cast<const float*>(x)[i] : Tr::load(static_cast<const S*>(x), i);
    const float sum = v + Tr::load(static_cast<const S*>(in), i);
    Tr::store(static_cast<S*>(y), i, d != 1.0f ? sum / d : sum);
  }
}

// y[i] = store(load(in[i]) / d).
template <DType T>
__global__ void divide_kernel(const void* in, void* y, float d, int64_t n) {
  using Tr = DTypeTraits<T>;
  using S = typename Tr::storage;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    Tr::store(static_cast<S*>(y), i, Tr::load(static_cast<const S*>(in), i) / d);
}

// The block's local values: the bucket at e0, or the wire-order accumulator.
const void* local_at(const Local& x, const Plan& plan, int64_t e0, bool& is_f32) {
  is_f32 = x.acc != nullptr;
  if (is_f32) return x.acc - x.acc_w0 * plan.unit + e0;
  return static_cast<const uint8_t*>(x.bucket) + e0 * dtype_size(plan.dtype);
}

}  // namespace

cudaError_t IdentityCudaCodec::run(CodecCall& c) const {
  const Plan& plan = c.plan;
  const Span s = span_of(plan, c.b);
  const int64_t n = s.e1 - s.e0;
  if (n == 0) return cudaSuccess;
  const size_t bytes = size_t(n) * size_t(dtype_size(plan.dtype));
  if (c.op == CodecCall::kDecompress) {
    uint8_t* dst = static_cast<uint8_t*>(c.y->bucket) + s.e0 * dtype_size(plan.dtype);
    if (c.y->divisor == 1.0f) return dst != c.in ? cudaMemcpyAsync(dst, c.in, bytes, cudaMemcpyDeviceToDevice, stream_)
                                                  : cudaSuccess;
    DQ_DISPATCH_DTYPE(plan.dtype, T, [&] {
      DQ_LAUNCH(divide_kernel<T>, grid_for(n), kThreads, 0, stream_)(c.in, dst, c.y->divisor, n);
    });
    return cudaGetLastError();
  }
  bool is_f32 = false;
  const void* xp = local_at(*c.x, plan, s.e0, is_f32);
  switch (c.op) {
    case CodecCall::kCompress:
      if (!is_f32) return xp != c.out ? cudaMemcpyAsync(c.out, xp, bytes, cudaMemcpyDeviceToDevice, stream_)
                                      : cudaSuccess;
      DQ_DISPATCH_DTYPE(plan.dtype, T, [&] {
        DQ_LAUNCH(sum_store_kernel<T>, grid_for(n), kThreads, 0, stream_)(xp, true, nullptr, c.out, n);
      });
      break;
    case CodecCall::kDecompressAccumulate:
      DQ_DISPATCH_DTYPE(plan.dtype, T, [&] {
        DQ_LAUNCH(sum_acc_kernel<T>, grid_for(n), kThreads, 0, stream_)(xp, is_f32, c.in, c.acc, n);
      });
      break;
    case CodecCall::kDecompressAccumulateOutput: {
      void* dst = static_cast<uint8_t*>(c.y->bucket) + s.e0 * dtype_size(plan.dtype);
      DQ_DISPATCH_DTYPE(plan.dtype, T, [&] {
        DQ_LAUNCH(sum_out_kernel<T>, grid_for(n), kThreads, 0, stream_)(xp, is_f32, c.in, dst, c.y->divisor, n);
      });
      break;
    }
    default:  // kDecompressAccumulateRecompress
      DQ_DISPATCH_DTYPE(plan.dtype, T, [&] {
        DQ_LAUNCH(sum_store_kernel<T>, grid_for(n), kThreads, 0, stream_)(xp, is_f32, c.in, c.out, n);
      });
      break;
  }
  return cudaGetLastError();
}

// Mode none's CUDA codec (registry_cuda.cu).
DeviceCodecFactory identity_cuda_codec_factory() {
  DeviceCodecFactory f;
  f.make_codec = [](const Codec&, const Device& d) -> std::unique_ptr<Codec> {
    return std::make_unique<IdentityCudaCodec>(static_cast<cudaStream_t>(d.stream()));
  };
  return f;
}

}  // namespace cuda
}  // namespace dynamiq
