// Shared pieces of the libFuzzer targets (tests/fuzz/fuzz_*.cc) and of the seed corpus
// generator (corpus/make_corpus.cc).
//
// Every target reads its input as a fixed-size parameter prefix (zero-padded when the input
// is shorter) followed by the bytes that play the received message(s). The parameters pick
// the mode's config, the dtype, numel, the world and the block deterministically, so that a
// crashing input reproduces alone, and so that the corpus generator can write inputs whose
// message part is a real message of that very plan.
//
// What a target accepts as the end of a decode: a clean return, or dynamiq::MalformedMessage
// (the collective target: any dynamiq::Error, which is what a rank raises for a corrupt peer,
// a closed connection or a disagreeing header). Anything else (another exception, a crash, a
// sanitizer report, a hang past libFuzzer's -timeout) is a finding: fail() prints what and
// aborts, which libFuzzer records as a crash with the input that caused it.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/base/common.h"
#include "kernels/base/float_bits.h"
#include "kernels/base/philox.h"

namespace dqfuzz {

using namespace dynamiq;

[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "FUZZ FINDING: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}
#define FUZZ_CHECK(cond, what)                                              \
  do {                                                                      \
    if (!(cond)) ::dqfuzz::fail(std::string(#cond) + ": " + (what));        \
  } while (0)

// The input split into its parameter prefix (zero-padded) and the rest.
template <size_t N>
struct Input {
  uint8_t p[N] = {};
  const uint8_t* rest = nullptr;
  size_t rest_bytes = 0;
  Input(const uint8_t* data, size_t size) {
    const size_t k = size < N ? size : N;
    if (k) std::memcpy(p, data, k);
    rest = data + k;
    rest_bytes = size - k;
  }
  uint16_t u16(size_t i) const { return uint16_t(p[i] | (p[i + 1] << 8)); }
  uint32_t u32(size_t i) const { return uint32_t(u16(i)) | (uint32_t(u16(i + 2)) << 16); }
  uint64_t u64(size_t i) const { return uint64_t(u32(i)) | (uint64_t(u32(i + 4)) << 32); }
};

// A heap copy of exactly `n` bytes, so that AddressSanitizer reports any read past the
// message (a std::vector may have capacity beyond its size).
class ExactBuffer {
 public:
  ExactBuffer(const uint8_t* src, size_t n) : n_(n), p_(new uint8_t[n ? n : 1]) {
    if (n) std::memcpy(p_.get(), src, n);
  }
  explicit ExactBuffer(size_t n) : n_(n), p_(new uint8_t[n ? n : 1]) { std::memset(p_.get(), 0, n ? n : 1); }
  uint8_t* data() { return p_.get(); }
  const uint8_t* data() const { return p_.get(); }
  size_t size() const { return n_; }

 private:
  size_t n_;
  std::unique_ptr<uint8_t[]> p_;
};

// Deterministic values for a rank's own bucket (not fuzzed bytes: the fuzzed part of an
// input is what arrives from a peer). Styles: 0 standard-normal-like; 1 a different
// magnitude per 256-value run (1e-30 .. 1e30), which gives the allocator several widths;
// 2 like 1 with exact zeros, subnormals and values near the dtype's largest finite value, so
// that sums overflow to inf inside the codecs; 3 only zeros. `finite` = false lets style 2
// also place inf and NaN (exact modes carry them).
inline void fill_values(void* out, DType t, int64_t numel, uint64_t seed, int style, bool finite = true) {
  // one Philox call per element (4 words) and one per 256-value run
  auto words = [&](uint64_t i) {
    return philox4x32_10(uint32_t(i), uint32_t(i >> 32), 7, 0, uint32_t(seed), uint32_t(seed >> 32));
  };
  auto unit = [](uint32_t w) { return (double(w) + 0.5) / 4294967296.0; };
  int e = 0;
  for (int64_t i = 0; i < numel; ++i) {
    const Philox4x32 w = words(uint64_t(i));
    // sum of 3 uniforms, centred: a cheap bell shape
    double v = (unit(w.v[0]) + unit(w.v[1]) + unit(w.v[2]) - 1.5) * 2.0;
    if (i % 256 == 0)  // 1e-30 .. 1e30 in powers of 2, per run
      e = int(unit(words(uint64_t(i / 256) + (uint64_t(1) << 40)).v[0]) * 200.0) - 100;
    if (style >= 1) v = std::ldexp(v, e);
    if (style == 2) {
      const double pick = unit(w.v[3]);
      const double big = t == DType::kF16 ? 65504.0 : 3.0e38;
      if (pick < 0.03) v = 0.0;
      else if (pick < 0.06) v = (pick < 0.045 ? 1.0 : -1.0) * (t == DType::kF16 ? 3e-8 : 1e-40);
      else if (pick < 0.09) v = (pick < 0.075 ? 1.0 : -1.0) * big;
      else if (!finite && pick < 0.10) v = pick < 0.095 ? INFINITY : NAN;
    }
    if (style == 3) v = 0.0;
    const float f = float(v);
    switch (t) {
      case DType::kF32: static_cast<float*>(out)[i] = f; break;
      case DType::kBF16: static_cast<uint16_t*>(out)[i] = f32_to_bf16(f); break;
      case DType::kF16: static_cast<uint16_t*>(out)[i] = f32_to_f16(f); break;
    }
  }
}

}  // namespace dqfuzz
