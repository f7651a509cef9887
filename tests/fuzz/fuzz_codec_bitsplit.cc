// libFuzzer target: the bitsplit codec's receiving roles on a fuzzed block message
// (bit-split planes, spike values and spike indices, bf16 and log scales). Input layout and properties: fuzz_codec.h.
#include "kernels/registry.h"
#include "fuzz_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return dqfuzz::run_codec_case(dynamiq::mode_id("bitsplit"), data, size);
}
