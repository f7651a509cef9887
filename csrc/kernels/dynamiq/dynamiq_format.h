// Wire sizes of DynamiQ super-groups: the contract between the codec
// (csrc/kernels/dynamiq_codec.*) and the allocator (csrc/alloc), which must
// agree byte for byte so that the bit budget the allocator enforces is the
// one the wire carries.
//
// A super-group (SG) of S elements with width w in {1, 2, 4, 8} carries
//   hierarchical scales (default): a bf16 SG scale (2 bytes) + one uint8
//     group scale per group of s elements (S/s bytes);
//   flat scales (ablation):        one bf16 scale per group (2*S/s bytes);
// plus S*w/8 bytes of codes. Width 16 is the raw bf16 value: 2*S bytes and no
// scales. A partial last SG is padded to S on the wire.
#pragma once

#include "kernels/base/common.h"

namespace dynamiq {

struct DynamiqFormat {
  int32_t S = 256;            // super-group size (elements)
  int32_t s = 16;             // group size (elements); S % s == 0
  bool hierarchical = true;   // uint8 group scales under a bf16 SG scale
};

// Allowed widths, in the order of the index used by stats arrays (0..4).
constexpr int kDynamiqWidths[5] = {1, 2, 4, 8, 16};

DQ_HD int dynamiq_width_index(int w) {
  return w == 1 ? 0 : w == 2 ? 1 : w == 4 ? 2 : w == 8 ? 3 : w == 16 ? 4 : -1;
}

DQ_HD int64_t dynamiq_scale_bytes(int width, const DynamiqFormat& f) {
  if (width == 16) return 0;
  const int64_t groups = f.S / f.s;
  return f.hierarchical ? 2 + groups : 2 * groups;
}

DQ_HD int64_t dynamiq_code_bytes(int width, const DynamiqFormat& f) {
  return width == 16 ? 2 * int64_t(f.S) : (int64_t(f.S) * width + 7) / 8;
}

// Total wire bytes of one super-group of the given width.
DQ_HD int64_t dynamiq_sg_bytes(int width, const DynamiqFormat& f) {
  return dynamiq_scale_bytes(width, f) + dynamiq_code_bytes(width, f);
}

}  // namespace dynamiq
