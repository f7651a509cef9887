#include "hook/collective/header_exchange.h"

#include <cstring>
#include <sstream>

namespace dynamiq {
namespace {

constexpr int kPieces = 4;
constexpr size_t kHeaderFixed = 2 + kNumInputErrors;

const char* input_error_name(int e) {
  switch (InputError(e)) {
    case InputError::kDType: return "unsupported dtype";
    case InputError::kLayout: return "unsupported layout (sparse or non-contiguous)";
    case InputError::kDevice: return "tensor on an unsupported device";
    case InputError::kOther: return "invalid input";
    case InputError::kConfig: return "an invalid config";
    case InputError::kLocalPass: return "a failure in its local pass (statistics of the bucket)";
    case InputError::kShape: return "output and input that do not fit the collective (sizes or dtypes)";
    default: return "?";
  }
}

uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// 0 for no state (the first step, modes without one); else a hash of u and step.
uint64_t plan_state_fingerprint(const PlanState* ps) {
  if (ps == nullptr || !ps->has_u) return 0;
  uint64_t u = 0, step = 0;
  std::memcpy(&u, &ps->u, sizeof u);
  std::memcpy(&step, &ps->step, sizeof step);
  return mix64(mix64(u) ^ step) | 1u;
}

std::vector<int64_t> encode(const std::vector<HeaderField>& fields, const HeaderReport& report) {
  const size_t nsums = report.sums ? report.sums->size() : 0;
  DQ_CHECK(nsums <= kHeaderSums, "exchange_header: " + std::to_string(nsums) + " sums, at most " +
                                     std::to_string(kHeaderSums));
  std::vector<int64_t> h(kHeaderFixed + fields.size() * kPieces * 2 + kHeaderSums, 0);
  for (size_t i = 0; i < nsums; ++i) h[h.size() - kHeaderSums + i] = (*report.sums)[i];
  h[0] = 1;
  h[1] = report.nonfinite ? 1 : 0;
  if (report.input_error != InputError::kNone) {
    // a code this build does not know (from the caller) still aborts every rank
    const int e = int(report.input_error);
    h[2 + size_t(e > 0 && e < kNumInputErrors ? e : int(InputError::kOther))] = 1;
  }
  if (report.config_error) h[2 + size_t(InputError::kConfig)] = 1;
  if (report.local_pass_error) h[2 + size_t(InputError::kLocalPass)] = 1;
  for (size_t f = 0; f < fields.size(); ++f)
    for (int p = 0; p < kPieces; ++p) {
      const int64_t v = int64_t((fields[f].value >> (16 * p)) & 0xffffu);
      h[kHeaderFixed + (f * kPieces + size_t(p)) * 2] = v;
      h[kHeaderFixed + (f * kPieces + size_t(p)) * 2 + 1] = v * v;
    }
  return h;
}

// "" when no rank reported an input error, else what every rank raises.
std::string reported_errors(const std::vector<int64_t>& h, Collective kind) {
  std::ostringstream errs;
  for (int e = 1; e < kNumInputErrors; ++e)
    if (h[2 + size_t(e)] > 0)
      errs << (errs.tellp() > 0 ? "; " : "") << h[2 + size_t(e)] << " rank(s) reported " << input_error_name(e);
  if (errs.tellp() == 0) return "";
  return std::string("dynamiq ") + collective_name(kind) + " aborted on every rank: " + errs.str() +
         " (the offending rank raises the detailed error)";
}

// "" when every rank holds every field alike, else what every rank raises.
std::string disagreements(const std::vector<int64_t>& h, const std::vector<HeaderField>& fields, int n) {
  std::ostringstream bad;
  for (size_t f = 0; f < fields.size(); ++f) {
    bool same = true;
    for (int p = 0; p < kPieces; ++p) {
      const int64_t s = h[kHeaderFixed + (f * kPieces + size_t(p)) * 2];
      const int64_t q = h[kHeaderFixed + (f * kPieces + size_t(p)) * 2 + 1];
      // s <= n * 65535 < 2^31 for n < 2^15, so s*s fits; q*n fits likewise. Sums outside
      // those ranges come from a corrupted contribution: a disagreement, tested before any
      // product that could overflow.
      const int64_t smax = int64_t(n) * 65535;
      if (s < 0 || s > smax || q < 0 || q > smax * 65535 || int64_t(n) * q != s * s) same = false;
    }
    if (!same) bad << (bad.tellp() > 0 ? ", " : "") << fields[f].name;
  }
  if (bad.tellp() == 0) return "";
  return "ranks disagree on " + bad.str() +
         ": every rank must pass the same Config (mode, topology, bits, seed, ...) and "
         "issue the same collectives in the same order with tensors of the same dtype and "
         "size";
}

}  // namespace

std::vector<HeaderField> collective_header_fields(const CollectiveConfig& cfg, const CallArgs& a, uint32_t slice) {
  // hierarchical: the ranks per node ride in the topology's field (the other
  // topologies send the topology alone, as before)
  const bool hier = cfg.topology == kTopologyHierarchical;
  return {
      {"mode", uint64_t(cfg.mode)},
      {hier ? "topology or ranks per node (local_size; torchrun's LOCAL_WORLD_SIZE)" : "topology",
       uint64_t(cfg.topology) | (hier ? uint64_t(uint32_t(cfg.local_size)) << 8 : 0)},
      {"reduce op", uint64_t(a.op)},
      {"dtype", uint64_t(a.dtype)},
      {"numel", uint64_t(a.caller_numel >= 0 ? a.caller_numel : a.numel)},
      {"collective sequence number", a.seq},
      {"slice of the bucket", uint64_t(slice)},
      {"config fingerprint (bits, seed, widths, rounding, group sizes, block size)", cfg.fingerprint()},
      // every rank plans from its own copy: a copy restored on some ranks only
      // would give other widths, so other message sizes, on those ranks
      {"allocator state (the fast rule's carried offset u)", plan_state_fingerprint(a.plan_state)},
      {"collective (all-reduce, reduce-scatter or all-gather)", uint64_t(a.kind)},
      // 0 outside mode auto: present in every mode, so every header has one length
      {"mode auto's config (auto_lossy, auto_bandwidth, auto_latency)",
       a.auto_exchange ? a.auto_exchange->fingerprint : 0},
  };
}

HeaderVerdict exchange_header(Transport& tr, const std::vector<HeaderField>& fields, const HeaderReport& report) {
  const int n = tr.size();
  std::vector<int64_t> h = encode(fields, report);
  tr.allreduce_sum_i64(h.data(), h.size());
  HeaderVerdict out;
  out.nonfinite_ranks = h[1];
  if (h[0] != n) {
    out.error = "header exchange counted " + std::to_string(h[0]) + " ranks, expected " + std::to_string(n);
    return out;
  }
  out.error = reported_errors(h, report.kind);
  if (out.error.empty()) out.error = disagreements(h, fields, n);
  if (report.sums) {
    const auto first = h.end() - std::ptrdiff_t(kHeaderSums);
    out.sums.assign(first, first + std::ptrdiff_t(report.sums->size()));
  }
  return out;
}

}  // namespace dynamiq
