// The CPU emulation of the CUDA runtime (tests/cpp/cuda_emu) declares it all.
#pragma once
#include "cuda_runtime.h"
