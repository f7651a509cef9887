#include "kernels/dynamiq/dynamiq_stats.h"

#include "kernels/dynamiq/dynamiq_math.h"
#include "kernels/base/float_bits.h"

namespace dynamiq {
namespace {

template <DType T>
bool stats_t(const typename DTypeTraits<T>::storage* x, int64_t numel, int32_t S, float* out) {
  using Tr = DTypeTraits<T>;
  uint32_t bad = 0;
  const int64_t units = ceil_div<int64_t>(numel, S);
  for (int64_t u = 0; u < units; ++u) {
    const int64_t e0 = u * S;
    const int64_t c = numel - e0 < S ? numel - e0 : S;
    const auto* p = x + e0;
    // non-finite check: an integer OR-reduction (vectorises)
    for (int64_t i = 0; i < c; ++i) bad |= Tr::nonfinite(p[i]);
    // lane sums in double, lane l = elements l, l+8, ... in order
    double s[kStatLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
    double q[kStatLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
    const int64_t full = c - c % kStatLanes;
    {
      // GNU vector types: lanes 0-3 and 4-7 in two 4 x double registers (gcc
      // does not SLP-vectorise the scalar lane loop); same per-lane order.
      typedef double v4d __attribute__((vector_size(32)));
      typedef float v4f __attribute__((vector_size(16)));
      v4d s0 = {0, 0, 0, 0}, s1 = s0, q0 = s0, q1 = s0;
      for (int64_t i = 0; i < full; i += kStatLanes) {
        v4f a, b;
#if defined(DQ_HAVE_LANES8)
        if constexpr (T != DType::kF32) {  // 16-bit: one vector conversion (the same bits)
          const __m256 v = Lanes8<T>::load(p + i);
          a = v4f(_mm256_castps256_ps128(v));
          b = v4f(_mm256_extractf128_ps(v, 1));
        } else
#endif
        {
          for (int l = 0; l < 4; ++l) {
            a[l] = Tr::load(p, i + l);
            b[l] = Tr::load(p, i + 4 + l);
          }
        }
        const v4d da = __builtin_convertvector(a, v4d), db = __builtin_convertvector(b, v4d);
        s0 += da;
        s1 += db;
        q0 += da * da;
        q1 += db * db;
      }
      for (int l = 0; l < 4; ++l) {
        s[l] = s0[l];
        s[4 + l] = s1[l];
        q[l] = q0[l];
        q[4 + l] = q1[l];
      }
    }
    for (int64_t i = full; i < c; ++i) {
      const int l = int(i - full);
      const double v = double(Tr::load(p, i));
      s[l] += v;
      q[l] += v * v;
    }
    out[2 * u] = dq_saturate(dq_combine_lanes(s) / double(c));
    out[2 * u + 1] = dq_saturate(dq_combine_lanes(q));
  }
  return bad != 0;
}

}  // namespace

bool dynamiq_local_stats(const void* data, DType dtype, int64_t numel, int32_t S, float* out) {
  DQ_CHECK(S >= 1, "dynamiq_local_stats: super-group size must be >= 1");
  DQ_CHECK(numel >= 0, "dynamiq_local_stats: negative numel");
  if (numel == 0) return false;
  DQ_CHECK(data != nullptr && out != nullptr, "dynamiq_local_stats: null pointer");
  return DQ_DISPATCH_DTYPE(dtype, T, [&] {
    return stats_t<T>(static_cast<const typename DTypeTraits<T>::storage*>(data), numel, S, out);
  });
}

}  // namespace dynamiq
