// The test-only "negate" codec on CUDA: the same bytes as NegateCodec (../negate_codec.h), the
// identity codec's sums with every value's top byte XORed with the mask on the wire. One
// elementwise kernel in a grid-stride loop does each of the codec's calls, the reduce-scatter
// sink's (decompress_accumulate_output) included. It lives in this folder
// and is registered by the one line at the bottom (cuda::add_codec: with the built-in CUDA
// codecs, when the CUDA device is first used), so mode "negate" runs on CUDA tensors with nothing
// outside the folder edited (docs/architecture.md "Adding a codec").
#include <algorithm>
#include <memory>

#include "../negate_codec.h"
#include "kernels/base/cuda/cuda_codec.h"
#include "kernels/base/cuda/cuda_device.h"
#include "kernels/base/cuda/launch.h"
#include "kernels/base/float_bits.h"
#include "kernels/registry.h"

namespace dynamiq {
namespace negate_test {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t n) { return unsigned(std::min<int64_t>((n + kThreads - 1) / kThreads, 4096)); }

// A stored value with `mask` XORed into its top byte (its own inverse).
DQ_HD float flip(float v, uint8_t mask) { return bits_f32(f32_bits(v) ^ (uint32_t(mask) << 24)); }
DQ_HD uint16_t flip(uint16_t v, uint8_t mask) { return uint16_t(v ^ uint16_t(mask << 8)); }

// One kernel for every call, element i of the block. Decompress (x null): y[i] = unflip(in[i]),
// divided by `divisor` unless it is 1 (then the stored bits as they came, NaN payloads included,
// as the identity codec copies them). Otherwise v = x[i] (a float accumulator or the bucket's
// dtype) + unflip(in[i]) when in is given; wire[i] = flip(store(v)), acc[i] = v, and for the
// reduce-scatter sink (x, in and y) y[i] = store(v / divisor), as the host's default
// decompress_accumulate_output writes it (decompress_accumulate, then store_unit). A first-touch
// compress (the bucket, no in) flips the stored bits themselves (the identity codec copies them).
template <DType T>
__global__ void negate_kernel(const void* x, bool x_is_f32, const void* in, void* wire, float* acc, void* y,
                              float divisor, uint8_t mask, int64_t n) {
  using Tr = DTypeTraits<T>;
  using S = typename Tr::storage;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    if (!x) {
      const S r = flip(static_cast<const S*>(in)[i], mask);
      if (divisor == 1.0f) static_cast<S*>(y)[i] = r;
      else Tr::store(static_cast<S*>(y), i, Tr::load(&r, 0) / divisor);
      continue;
    }
    if (!x_is_f32 && !in) {
      static_cast<S*>(wire)[i] = flip(static_cast<const S*>(x)[i], mask);
      continue;
    }
    float v = x_is_f32 ? static_cast<const float*>(x)[i] : Tr::load(static_cast<const S*>(x), i);
    if (in) {
      const S r = flip(static_cast<const S*>(in)[i], mask);
      v = v + Tr::load(&r, 0);
    }
    if (wire) {
      S s;
      Tr::store(&s, 0, v);
      static_cast<S*>(wire)[i] = flip(s, mask);
    }
    if (acc) acc[i] = v;
    if (y) Tr::store(static_cast<S*>(y), i, divisor != 1.0f ? v / divisor : v);
  }
}

class NegateCudaCodec final : public cuda::CudaCodec<NegateCodec> {
 public:
  NegateCudaCodec(uint8_t mask, void* stream)
      : CudaCodec(static_cast<cudaStream_t>(stream), false, cuda::MessageSize::kFixed, mask) {}

 private:
  cudaError_t run(cuda::CodecCall& c) const override {
    const Plan& plan = c.plan;
    const int64_t e1 = std::min(c.b.w1 * plan.unit, plan.numel);
    const int64_t e0 = std::min(c.b.w0 * plan.unit, e1);
    const int64_t n = e1 - e0;
    if (n == 0) return cudaSuccess;
    const int es = dtype_size(plan.dtype);
    const void* x = nullptr;
    bool x_is_f32 = false;
    if (c.x) {
      x_is_f32 = c.x->acc != nullptr;
      x = x_is_f32 ? static_cast<const void*>(c.x->acc - c.x->acc_w0 * plan.unit + e0)
                   : static_cast<const void*>(static_cast<const uint8_t*>(c.x->bucket) + e0 * es);
    }
    void* y = c.y ? static_cast<uint8_t*>(c.y->bucket) + e0 * es : nullptr;
    const float divisor = c.y ? c.y->divisor : 1.0f;
    DQ_DISPATCH_DTYPE(plan.dtype, T, [&] {
      DQ_LAUNCH(negate_kernel<T>, grid_for(n), kThreads, 0, stream_)(x, x_is_f32, c.in, c.out, c.acc, y, divisor,
                                                                     host_.mask(), n);
    });
    return cudaGetLastError();
  }
};

DeviceCodecFactory negate_cuda_codec_factory() {
  DeviceCodecFactory f;
  f.make_codec = [](const Codec& host, const Device& d) -> std::unique_ptr<Codec> {
    return std::make_unique<NegateCudaCodec>(host_codec_as<NegateCodec>(host).mask(), d.stream());
  };
  return f;
}

}  // namespace

// The CUDA registration line.
const bool kCudaRegistered = (cuda::add_codec("negate", negate_cuda_codec_factory()), true);

}  // namespace negate_test
}  // namespace dynamiq
