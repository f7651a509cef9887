// libFuzzer target: the identity codec's receiving roles on a fuzzed block message
// (the identity codec (raw values in the bucket dtype)). Input layout and properties: fuzz_codec.h.
#include "kernels/registry.h"
#include "fuzz_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return dqfuzz::run_codec_case(dynamiq::kModeNone, data, size);
}
