// DynamiQ super-group statistics (paper section 3.1): the local pass whose
// output is all-reduced before planning.
#pragma once

#include "kernels/base/common.h"

namespace dynamiq {

// For each super-group j of S elements (the last may be partial, of c < S
// elements): out[2j] = mean of its raw values (sum / c), out[2j+1] = sum of
// squares of its raw values. Sums are taken in double (fixed order, see
// dynamiq_math.h) and the results saturated to finite floats. Returns true if
// any element is inf or nan (the stats are then meaningless: the driver takes
// the exact path). `out` has 2 * ceil(numel / S) floats. fp32, bf16, fp16.
bool dynamiq_local_stats(const void* data, DType dtype, int64_t numel, int32_t S, float* out);

}  // namespace dynamiq
