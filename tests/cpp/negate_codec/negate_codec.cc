// The test-only "negate" codec and scheme: see negate_codec.h.
#include "negate_codec.h"

#include <vector>

#include "kernels/identity/identity_plan_scheme.h"
#include "kernels/registry.h"

namespace dynamiq {
namespace negate_test {
namespace {

// XORs mask into the top byte of each little-endian value (mask 0x80: exact
// negation, NaN included). Its own inverse.
void negate(uint8_t* p, size_t bytes, DType dtype, uint8_t mask) {
  const size_t es = size_t(dtype_size(dtype));
  for (size_t i = es - 1; i < bytes; i += es) p[i] ^= mask;
}

std::vector<uint8_t> negated(const uint8_t* in, size_t bytes, DType dtype, uint8_t mask) {
  std::vector<uint8_t> v(in, in + bytes);
  negate(v.data(), v.size(), dtype, mask);
  return v;
}

}  // namespace

std::atomic<int64_t> NegateCodec::encoded_{0};

size_t NegateCodec::compress(const Local& x, const Plan& plan, const Block& b, const RngCtx& rng,
                             uint8_t* out) const {
  const size_t n = id_.compress(x, plan, b, rng, out);
  negate(out, n, plan.dtype, mask_);
  encoded_ += 1;
  return n;
}

void NegateCodec::decompress(const uint8_t* in, size_t in_bytes, const Plan& plan, const Block& b,
                             const Output& y) const {
  const std::vector<uint8_t> v = negated(in, in_bytes, plan.dtype, mask_);
  id_.decompress(v.data(), v.size(), plan, b, y);
}

void NegateCodec::decompress_accumulate(const uint8_t* in, size_t in_bytes, const Local& x, const Plan& plan,
                                        const Block& b, float* acc) const {
  const std::vector<uint8_t> v = negated(in, in_bytes, plan.dtype, mask_);
  id_.decompress_accumulate(v.data(), v.size(), x, plan, b, acc);
}

size_t NegateCodec::decompress_accumulate_recompress(const uint8_t* in, size_t in_bytes, const Local& x,
                                                     const Plan& plan, const Block& b, const RngCtx& rng,
                                                     uint8_t* out) const {
  const std::vector<uint8_t> v = negated(in, in_bytes, plan.dtype, mask_);
  const size_t n = id_.decompress_accumulate_recompress(v.data(), v.size(), x, plan, b, rng, out);
  negate(out, n, plan.dtype, mask_);
  encoded_ += 1;
  return n;
}

std::unique_ptr<Scheme> make_negate_scheme(const ParamSet& params) {
  const int mask = int(params.num("mask"));
  DQ_CHECK(mask != 0, "negate: mask=0 would send the values unchanged; give a nonzero mask");
  return std::make_unique<IdentityPlanScheme<NegateCodec>>(uint8_t(mask));
}

std::vector<ParamDecl> negate_params() {
  return {integer_param("mask", 128, 0, 255, "the bits XORed into the top byte of every value on the wire")};
}

// The registration line: mode "negate" with an id the built-in modes do not use. (Its CUDA codec
// registers with one line of cuda/negate_cuda_codec.cu.)
const bool kRegistered = (register_codec("negate", Mode(200), make_negate_scheme, negate_params()), true);

}  // namespace negate_test
}  // namespace dynamiq
