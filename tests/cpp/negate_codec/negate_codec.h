// A test-only codec, "negate": it sends -x instead of x (the sign bit of
// every value flipped) and negates back on receipt, over the identity codec's
// plan, sums and rounding. So its results are mode none's, bit for bit, while
// every byte on the wire differs from them. Its one parameter, `mask` (default
// 0x80, the sign bit), is what it XORs into the top byte of every value: a
// parameter that changes every byte on the wire but no result, so ranks that
// disagree on it must be stopped by the fingerprint. It lives entirely in this
// folder and is registered with one line (negate_codec.cc), its CUDA codec with
// one more (cuda/negate_cuda_codec.cu): the worked example of
// docs/architecture.md "Adding a codec". Python reaches it as a mode when the
// extension is built with DYNAMIQ_TEST_CODECS=ON (scripts/setup.sh does).
#pragma once

#include <atomic>
#include <memory>

#include "kernels/identity/identity_codec.h"
#include "kernels/scheme.h"

namespace dynamiq {
namespace negate_test {

// Wire format of a block: the identity codec's (the block's values in the
// bucket dtype, little-endian) with every value's top byte XORed with mask.
class NegateCodec final : public Codec {
 public:
  explicit NegateCodec(uint8_t mask = 0x80) : mask_(mask) {}
  uint8_t mask() const { return mask_; }
  std::string name() const override { return "negate"; }
  size_t static_bytes(const Plan& plan, const Block& b) const override { return id_.static_bytes(plan, b); }
  size_t compress(const Local& x, const Plan& plan, const Block& b, const RngCtx& rng,
                  uint8_t* out) const override;
  void decompress(const uint8_t* in, size_t in_bytes, const Plan& plan, const Block& b,
                  const Output& y) const override;
  void decompress_accumulate(const uint8_t* in, size_t in_bytes, const Local& x, const Plan& plan,
                             const Block& b, float* acc) const override;
  size_t decompress_accumulate_recompress(const uint8_t* in, size_t in_bytes, const Local& x,
                                          const Plan& plan, const Block& b, const RngCtx& rng,
                                          uint8_t* out) const override;

  // Messages this process has encoded with a NegateCodec (compress and recompress).
  static int64_t messages_encoded() { return encoded_.load(); }

 private:
  IdentityCodec id_;
  uint8_t mask_;
  static std::atomic<int64_t> encoded_;
};

// Mode "negate"'s scheme: exact (its sums are the identity codec's), no
// statistics, the identity plan (IdentityPlanScheme), its codec made with the
// `mask` parameter. Rejects mask 0 (nothing would be changed on the wire) with
// its own message, to show a factory's validation reaching Config.
std::unique_ptr<Scheme> make_negate_scheme(const ParamSet& params);
// Its one parameter (kernels/params.h): mask, an integer in [0, 255], default 128.
std::vector<ParamDecl> negate_params();

}  // namespace negate_test
}  // namespace dynamiq
