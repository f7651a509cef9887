#include "kernels/base/cpu_isa.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "kernels/base/common.h"

namespace dynamiq {
namespace {

// -1: not decided yet; 0: the baseline kernels; 1: AVX-512.
std::atomic<int> g_isa{-1};

#if defined(__AVX2__)
constexpr CpuIsa kBaseline = CpuIsa::kAvx2;
constexpr const char* kBaselineName = "avx2";
#else
constexpr CpuIsa kBaseline = CpuIsa::kGeneric;
constexpr const char* kBaselineName = "generic";
#endif

int detect_isa() {
  // "avx2" forces the AVX2 kernels; unset, empty, "auto" and "avx512" pick the
  // best the CPU has. Anything else is ignored with a warning (not worth
  // failing a training job over).
  const char* e = std::getenv("DYNAMIQ_CPU_ISA");
  const std::string v = e ? e : "";
  if (!v.empty() && v != "avx2" && v != "avx512" && v != "auto")
    std::fprintf(stderr, "dynamiq: ignoring DYNAMIQ_CPU_ISA=%s (allowed: avx2, avx512, auto); choosing by CPU\n",
                 v.c_str());
#if defined(DQ_HAVE_AVX512)
  if (v == "avx2") return 0;
  __builtin_cpu_init();
  return (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
             ? 1
             : 0;
#else
  return 0;
#endif
}

}  // namespace

CpuIsa cpu_isa() {
  int v = g_isa.load(std::memory_order_relaxed);
  if (v < 0) {
    v = detect_isa();
    g_isa.store(v, std::memory_order_relaxed);
  }
  return v == 1 ? CpuIsa::kAvx512 : kBaseline;
}

std::string dynamiq_cpu_isa() { return cpu_isa() == CpuIsa::kAvx512 ? "avx512" : kBaselineName; }

std::string dynamiq_set_cpu_isa(const std::string& isa) {
  const std::string before = dynamiq_cpu_isa();
  if (isa == kBaselineName) {
    g_isa.store(0);
  } else if (isa == "avx2" || isa == "generic") {
    throw Error("dynamiq_set_cpu_isa: this build's baseline kernels are " + std::string(kBaselineName) +
                ", not " + isa);
  } else if (isa == "avx512") {
    g_isa.store(-1);
    DQ_CHECK(detect_isa() == 1, "dynamiq_set_cpu_isa: this CPU or build has no AVX-512 (F/BW/DQ/VL)");
    g_isa.store(1);
  } else if (isa == "auto") {
    g_isa.store(-1);
  } else {
    throw Error("dynamiq_set_cpu_isa: isa must be avx2, generic, avx512 or auto (got " + isa + ")");
  }
  return before;
}

}  // namespace dynamiq
