// The current CUDA device's memory as a Memory (../codec.h): what the executor
// allocates its message buffers and accumulator in when it runs the CUDA
// codecs, and how an in-process transport stages their messages. A single
// static instance (buffer pools are keyed by its address). Status: compiled
// with nvcc in CI and run there on the CPU emulation of CUDA; never on a GPU.
#pragma once

#include "../codec.h"

namespace dynamiq {
namespace cuda {

const Memory& device_memory();

}  // namespace cuda
}  // namespace dynamiq
