// Mode "none": the identity codec over the identity plan, no statistics. The
// driver runs it as its exact path (Scheme::identity).
#include "kernels/identity/identity_plan_scheme.h"

namespace dynamiq {
namespace {

class IdentityScheme final : public IdentityPlanScheme<IdentityCodec> {
 public:
  bool identity() const override { return true; }
};

}  // namespace

std::unique_ptr<Scheme> make_identity_scheme(const ParamSet&) { return std::make_unique<IdentityScheme>(); }

// Mode none has no parameters.
std::vector<ParamDecl> identity_params() { return {}; }

}  // namespace dynamiq
