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

namespace dynamiq {
namespace cuda {

const Device& device();

// Registers the CUDA codec of every built-in mode with the codec registry
// (registry_cuda.cu); device() calls it once.
void register_codecs();

}  // namespace cuda
}  // namespace dynamiq
