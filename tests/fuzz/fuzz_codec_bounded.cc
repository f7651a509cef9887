// libFuzzer target: the bounded codec's receiving roles on a fuzzed block message
// (header, anchors, code lengths, packed residuals, raw blocks). Input layout and properties: fuzz_codec.h.
#include "kernels/registry.h"
#include "fuzz_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return dqfuzz::run_codec_case(dynamiq::mode_id("bounded"), data, size);
}
