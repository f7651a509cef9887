// The CUDA side of the codec registry (registry.h): each built-in mode's CUDA
// codec, one line each: the mode's name and the factory its folder's
// cuda/<codec>_cuda_codec.cu defines. cuda::device() registers them the first
// time it is called (base/cuda/cuda_device.h), so the torch-free core, which
// holds the registry, needs no CUDA.
#include "kernels/base/cuda/cuda_device.h"
#include "kernels/registry.h"

#include <mutex>
#include <string>
#include <utility>
#include <vector>

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

namespace {

struct Queued {
  std::mutex mu;
  bool done = false;  // register_codecs has run: add_codec queues nothing more
  std::vector<std::pair<std::string, DeviceCodecFactory>> codecs;
};
Queued& queued() {
  static Queued* q = new Queued;  // (static initialisers of other files may call add_codec first)
  return *q;
}

}  // namespace

void add_codec(const char* mode, DeviceCodecFactory f) {
  Queued& q = queued();
  {
    std::lock_guard<std::mutex> lock(q.mu);
    if (!q.done) {
      q.codecs.emplace_back(mode, std::move(f));
      return;
    }
  }
  register_device_codec(mode, "cuda", std::move(f));  // the device is in use already: now
}

void register_codecs() {
#define DQ_REGISTER(mode, factory) register_device_codec(mode, "cuda", factory());
  DQ_CUDA_CODECS(DQ_REGISTER)
#undef DQ_REGISTER
  Queued& q = queued();
  std::lock_guard<std::mutex> lock(q.mu);
  q.done = true;
  for (auto& [mode, f] : q.codecs) register_device_codec(mode, "cuda", std::move(f));
  q.codecs.clear();
}

}  // namespace cuda
}  // namespace dynamiq
