// libFuzzer target: the dynamiq codec's receiving roles on a fuzzed block message
// (DynamiQ super-groups: scales, codes, widths 1-16, reordered plans). Input layout and properties: fuzz_codec.h.
#include "kernels/registry.h"
#include "fuzz_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return dqfuzz::run_codec_case(dynamiq::mode_id("dynamiq"), data, size);
}
