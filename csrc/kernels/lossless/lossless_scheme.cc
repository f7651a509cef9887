// Mode "lossless": exponent-coded exact all-reduce (lossless_codec.h). Exact,
// so it needs no statistics and no non-finite scan (inf and nan travel
// bit-exactly); the plan is the identity plan, so its blocks are exactly mode
// "none"'s and each block is the same arithmetic on fewer bytes. Its wire
// size is data-dependent: the plan reports the raw width as the upper bound
// (a block is never more than raw + 16 header bytes).
#include "kernels/identity/identity_plan_scheme.h"
#include "kernels/lossless/lossless_codec.h"

namespace dynamiq {

std::unique_ptr<Scheme> make_lossless_scheme(const ParamSet&) {
  return std::make_unique<IdentityPlanScheme<LosslessCodec>>();
}

// Mode lossless has no parameters.
std::vector<ParamDecl> lossless_params() { return {}; }

}  // namespace dynamiq
