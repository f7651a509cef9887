// A test-only codec, "negate": it sends -x instead of x (the sign bit of
// every value flipped) and negates back on receipt, over the identity codec's
// plan, sums and rounding. So its results are mode none's, bit for bit, while
// every byte on the wire differs from them. It lives entirely in this folder
// and is registered with one line (test_negate_codec.cc): the worked example
// of docs/architecture.md "Adding a codec".
#pragma once

#include <atomic>
#include <memory>

#include "kernels/identity/identity_codec.h"
#include "kernels/scheme.h"

namespace dynamiq {
namespace negate_test {

// Wire format of a block: the identity codec's (the block's values in the
// bucket dtype, little-endian) with every value's sign bit flipped.
class NegateCodec final : public Codec {
 public:
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
  static std::atomic<int64_t> encoded_;
};

// Mode "negate"'s scheme: exact (its sums are the identity codec's), no
// statistics, the identity plan (IdentityPlanScheme). Rejects a config with a group size (it has
// no groups), to show a factory's validation reaching Config.
std::unique_ptr<Scheme> make_negate_scheme(const CollectiveConfig& cfg);

}  // namespace negate_test
}  // namespace dynamiq
