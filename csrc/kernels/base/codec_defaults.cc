// Codec's default reduce-scatter sink (codec.h). Here, in dynamiq_kernels
// with the codecs whose vtables name it: csrc/kernels/*.cc build into
// dynamiq_core, which the kernels library does not link (bench_bitsplit links
// the two in that order and found neither this function nor Codec's typeinfo).
#include "kernels/codec.h"

#include <vector>

#include "kernels/base/unit_io.h"

namespace dynamiq {

void Codec::decompress_accumulate_output(const uint8_t* in, size_t in_bytes, const Local& x, const Plan& plan,
                                         const Block& b, const Output& y) const {
  if (b.empty()) return;
  std::vector<float> acc(static_cast<size_t>(b.units() * plan.unit));
  decompress_accumulate(in, in_bytes, x, plan, b, acc.data());
  for (int64_t w = b.w0; w < b.w1; ++w) store_unit(y, plan, w, acc.data() + (w - b.w0) * plan.unit);
}

}  // namespace dynamiq
