// The header exchange before each collective (step 2 in collective.h): one
// int64 all-reduce that carries the fingerprint of everything the ranks must
// agree on (config, dtype, numel, op, sequence number, slice, allocator
// state), the count of ranks holding a non-finite value, and each rank's
// input-error reports, so that every rank takes the same decision and raises
// the same error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hook/collective/collective.h"

namespace dynamiq {

// One value every rank must hold alike; `name` says what differs when not.
struct HeaderField {
  const char* name;
  uint64_t value;
};

// The fields of one collective (one slice of a bucket).
std::vector<HeaderField> collective_header_fields(const CollectiveConfig& cfg, const CallArgs& a, uint32_t slice);

// What this rank reports besides its fields.
struct HeaderReport {
  bool nonfinite = false;                      // its bucket holds an inf or NaN
  InputError input_error = InputError::kNone;  // its input was rejected
  bool config_error = false;                   // make_scheme rejected its config (InputError::kConfig)
  bool local_pass_error = false;               // its local pass threw (InputError::kLocalPass)
  Collective kind = Collective::kAllReduce;     // named in the error message
  // Mode auto (auto_mode.h): at most kHeaderSums numbers summed over the ranks
  // (not compared), in the header's block of sums; null for every other mode
  // (the block is then zero).
  const std::vector<int64_t>* sums = nullptr;
};

// The header's block of mode auto's numbers (auto_mode.cc's slots), zero in every
// other mode: the header has the same length on every rank whatever its mode, so
// ranks that disagree on mode auto get the "ranks disagree on mode" error instead
// of an all-reduce of different lengths (a hang or an abort in the backend).
constexpr size_t kHeaderSums = 20;

// What every rank learns, identically.
struct HeaderVerdict {
  int64_t nonfinite_ranks = 0;
  std::string error;  // non-empty: every rank raises this
  std::vector<int64_t> sums;  // HeaderReport::sums summed over the ranks
};

// Header: [count, nonfinite, errors[kNumInputErrors], then per field and per
// 16-bit piece the pair (v, v*v), then kHeaderSums sums]. Ranks agree on a field iff for every piece
// n * sum(v^2) == (sum v)^2 (equality in Cauchy-Schwarz). Integer sums are
// exact, so every rank evaluates the same verdict.
HeaderVerdict exchange_header(Transport& tr, const std::vector<HeaderField>& fields, const HeaderReport& report);

}  // namespace dynamiq
