// The test-only "negate" codec and scheme: see negate_codec.h.
#include "negate_codec.h"

#include <vector>

#include "kernels/identity/identity_plan_scheme.h"

namespace dynamiq {
namespace negate_test {
namespace {

// Flips the sign bit of each little-endian value (exact negation, NaN included).
void negate(uint8_t* p, size_t bytes, DType dtype) {
  const size_t es = size_t(dtype_size(dtype));
  for (size_t i = es - 1; i < bytes; i += es) p[i] ^= 0x80u;
}

std::vector<uint8_t> negated(const uint8_t* in, size_t bytes, DType dtype) {
  std::vector<uint8_t> v(in, in + bytes);
  negate(v.data(), v.size(), dtype);
  return v;
}

}  // namespace

std::atomic<int64_t> NegateCodec::encoded_{0};

size_t NegateCodec::compress(const Local& x, const Plan& plan, const Block& b, const RngCtx& rng,
                             uint8_t* out) const {
  const size_t n = id_.compress(x, plan, b, rng, out);
  negate(out, n, plan.dtype);
  encoded_ += 1;
  return n;
}

void NegateCodec::decompress(const uint8_t* in, size_t in_bytes, const Plan& plan, const Block& b,
                             const Output& y) const {
  const std::vector<uint8_t> v = negated(in, in_bytes, plan.dtype);
  id_.decompress(v.data(), v.size(), plan, b, y);
}

void NegateCodec::decompress_accumulate(const uint8_t* in, size_t in_bytes, const Local& x, const Plan& plan,
                                        const Block& b, float* acc) const {
  const std::vector<uint8_t> v = negated(in, in_bytes, plan.dtype);
  id_.decompress_accumulate(v.data(), v.size(), x, plan, b, acc);
}

size_t NegateCodec::decompress_accumulate_recompress(const uint8_t* in, size_t in_bytes, const Local& x,
                                                     const Plan& plan, const Block& b, const RngCtx& rng,
                                                     uint8_t* out) const {
  const std::vector<uint8_t> v = negated(in, in_bytes, plan.dtype);
  const size_t n = id_.decompress_accumulate_recompress(v.data(), v.size(), x, plan, b, rng, out);
  negate(out, n, plan.dtype);
  encoded_ += 1;
  return n;
}

std::unique_ptr<Scheme> make_negate_scheme(const CollectiveConfig& cfg) {
  DQ_CHECK(cfg.group_size == 0, "negate: group_size must be 0 (the codec has no groups)");
  return std::make_unique<IdentityPlanScheme<NegateCodec>>();
}

}  // namespace negate_test
}  // namespace dynamiq
