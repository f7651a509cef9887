// The host's non-finite scan: the local pass of a lossy scheme without
// statistics (bitsplit) and of the test codecs. A device's scan is
// Device::has_nonfinite (kernels/device.h); both, and the dynamiq statistics
// passes, use the one test DTypeTraits<T>::nonfinite (float_bits.h).
#pragma once

#include "kernels/base/common.h"

namespace dynamiq {

// True if any of the `numel` values at `data` is inf or nan.
bool has_nonfinite(const void* data, DType dtype, int64_t numel);

}  // namespace dynamiq
