// has_nonfinite: see nonfinite.h.
#include "kernels/base/nonfinite.h"

#include "kernels/base/float_bits.h"

namespace dynamiq {

bool has_nonfinite(const void* data, DType dtype, int64_t numel) {
  if (numel <= 0) return false;
  return DQ_DISPATCH_DTYPE(dtype, T, [&] {
    using Tr = DTypeTraits<T>;
    const auto* p = static_cast<const typename Tr::storage*>(data);
    uint32_t bad = 0;  // OR-reduce without an early exit, so the loop vectorises
    for (int64_t i = 0; i < numel; ++i) bad |= Tr::nonfinite(p[i]);
    return bad != 0;
  });
}

}  // namespace dynamiq
