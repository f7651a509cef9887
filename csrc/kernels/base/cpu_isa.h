// The process-wide choice of vector ISA for the CPU kernels of every codec.
//
// A build compiles its kernels for one baseline ISA (CMake's DYNAMIQ_CPU_ARCH:
// x86-64-v3 = AVX2 + FMA by default; "generic" where the compiler has no AVX2,
// e.g. aarch64 or DYNAMIQ_CPU_ARCH empty) and, in the x86-64 AVX2 build with
// gcc or clang, AVX-512 (F/BW/DQ/VL) variants in separate files (*_avx512.cc,
// the only files compiled with -mavx512*; CMake then defines
// DYNAMIQ_AVX512_KERNELS). There are none at present (DynamiQ's were withdrawn
// until an AVX-512 machine runs them), so every x86 build runs its AVX2
// kernels, on AVX-512 CPUs too. Which of the two runs is decided here at run time,
// once per process, from the CPU and the environment (DYNAMIQ_CPU_ISA=avx2
// forces the baseline); tests and benchmarks may switch it. Outputs are
// bit-identical under every ISA.
#pragma once

#include <string>

// DQ_HAVE_AVX512: this translation unit may call AVX-512 kernel variants
// (they are compiled into the build) -- decide at run time with cpu_isa().
#if defined(DYNAMIQ_AVX512_KERNELS) && defined(__AVX2__) && defined(__x86_64__)
#define DQ_HAVE_AVX512 1
#endif

namespace dynamiq {

enum class CpuIsa : int {
  kGeneric = 0,  // the portable scalar kernels (a build without AVX2)
  kAvx2 = 1,     // the AVX2 kernels (with the scalar ones for shapes they skip)
  kAvx512 = 2,   // the AVX-512 kernels where they exist, else as kAvx2
};

// The ISA the kernels use now: detected on first use, then a relaxed atomic
// load. Codecs read it once per call.
CpuIsa cpu_isa();

// Which vector ISA the CPU kernels use: "avx512" when the CPU has AVX-512
// F/BW/DQ/VL (and DYNAMIQ_CPU_ISA is not "avx2"), else "avx2" in a build
// with AVX2 (x86-64-v3 or native on such a CPU), "generic" in the portable
// build (DYNAMIQ_CPU_ARCH empty, or not x86-64), whose scalar kernels run.
// Outputs are bit-identical either way.
std::string dynamiq_cpu_isa();
// Force the build's baseline ("avx2", or "generic" in a build without AVX2;
// the other one throws) or "avx512" (throws when unavailable), or go back to
// "auto"; for tests and A/B benchmarks. Returns the previous ISA, which it
// always accepts back. Not for use while kernels run.
std::string dynamiq_set_cpu_isa(const std::string& isa);

}  // namespace dynamiq
