// The current CUDA device as a Device (../device.h): its memory, the
// statistics and non-finite passes on its data, and the four CUDA codecs.
// Everything runs on the calling thread's current_stream() (cuda_memory.h):
// the passes, their copies and scratch memory, and the codecs, which take the
// stream current when they are made. Codecs are made per collective
// (DynamiqCudaCodec uploads its tables then; a cache would avoid that). A
// single static instance. Status: compiled with
// nvcc in CI and run there on the CPU emulation of CUDA
// (tests/cpp/cuda_collective.cu runs the whole collective driver on it);
// never on a GPU.
#pragma once

#include "kernels/device.h"

namespace dynamiq {
namespace cuda {

const Device& device();

}  // namespace cuda
}  // namespace dynamiq
