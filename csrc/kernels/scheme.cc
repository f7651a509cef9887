// Scheme's device dispatch and default local pass: see scheme.h.
#include "kernels/scheme.h"

#include "kernels/registry.h"

namespace dynamiq {

bool Scheme::local_pass(const void* data, DType dtype, int64_t numel, float* stats) const {
  (void)stats;
  DQ_CHECK(stats_count(dtype, numel) == 0, "a scheme with statistics must define its local pass");
  return !exact() && has_nonfinite(data, dtype, numel);
}

bool Scheme::device_local_pass(const Device& d, const void* data, DType dtype, int64_t numel, float* stats) const {
  if (stats_count(dtype, numel) > 0) return dynamiq::device_local_pass(mode_, codec(), d, data, dtype, numel, stats);
  return !exact() && d.has_nonfinite(data, dtype, numel);
}

std::unique_ptr<Codec> Scheme::device_codec(const Device& d) const { return make_device_codec(mode_, codec(), d); }

}  // namespace dynamiq
