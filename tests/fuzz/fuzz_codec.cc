// libFuzzer target: every registered codec's receiving roles on a fuzzed block message (the
// built-in ones and, in this build, the test-only ones of tests/cpp/*_codec). The input's first
// byte picks the mode (mode_of: the codec registry's modes by id), the rest is the harness's
// input: parameter prefix and message (fuzz_codec.h, which lists the roles and properties).
#include "fuzz_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  return dqfuzz::run_codec_case(dqfuzz::mode_of(data[0]), data + 1, size - 1);
}
