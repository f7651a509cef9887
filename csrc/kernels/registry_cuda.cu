// The CUDA side of the codec registry (registry.h): each built-in mode's CUDA
// codec, one line each: the mode's name and the factory its folder's
// cuda/<codec>_cuda_codec.cu defines. cuda::device() registers them the first
// time it is called (base/cuda/cuda_device.h), so the torch-free core, which
// holds the registry, needs no CUDA.
#include "kernels/base/cuda/cuda_device.h"
#include "kernels/registry.h"

namespace dynamiq {
namespace cuda {

#define DQ_CUDA_CODECS(X)                  \
  X("none", identity_cuda_codec_factory)   \
  X("dynamiq", dynamiq_cuda_codec_factory) \
  X("lossless", lossless_cuda_codec_factory) \
  X("bitsplit", bitsplit_cuda_codec_factory)

#define DQ_DECLARE_FACTORY(mode, factory) DeviceCodecFactory factory();
DQ_CUDA_CODECS(DQ_DECLARE_FACTORY)
#undef DQ_DECLARE_FACTORY

void register_codecs() {
#define DQ_REGISTER(mode, factory) register_device_codec(mode, "cuda", factory());
  DQ_CUDA_CODECS(DQ_REGISTER)
#undef DQ_REGISTER
}

}  // namespace cuda
}  // namespace dynamiq
