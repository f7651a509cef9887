// The current CUDA device as a Device (../../device.h): its memory, the
// calling thread's current_stream() (cuda_memory.h) and the non-finite scan
// on its data. The CUDA codecs and the dynamiq statistics pass are the
// registry's (../../registry_cuda.cu registers them when device() is first
// called); they run on the stream current when they are made. A single static
// instance. Status: compiled with nvcc in CI and run there on the CPU
// emulation of CUDA (tests/cpp/cuda_collective.cu runs the whole collective
// driver on it); never on a GPU.
#pragma once

#include "kernels/device.h"
#include "kernels/registry.h"

namespace dynamiq {
namespace cuda {

const Device& device();

// Registers the CUDA codec of every built-in mode with the codec registry
// (registry_cuda.cu), then those that add_codec queued; device() calls it once.
void register_codecs();

// The CUDA codec of a mode registered from outside csrc/kernels (a codec folder of its own, such as
// the test-only tests/cpp/negate_codec): queued, and registered with the built-in ones when the
// CUDA device is first used, so the mode's own registration (register_codec, another static
// initialiser in no particular order) has run by then. One line in the codec's folder:
//   const bool kCuda = (cuda::add_codec("negate", negate_cuda_codec_factory()), true);
// Once the device is in use it registers at once (register_device_codec: Error for an unknown
// mode or a second codec); a queued one's errors are raised by the device's first use.
void add_codec(const char* mode, DeviceCodecFactory f);

}  // namespace cuda
}  // namespace dynamiq
