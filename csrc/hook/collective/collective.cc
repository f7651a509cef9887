#include "hook/collective/collective.h"

#include <chrono>
#include <cstring>
#include <exception>
#include <sstream>
#include <vector>

#include "kernels/identity/identity_codec.h"
#include "hook/collective/executor.h"

namespace dynamiq {
namespace {

using Clock = std::chrono::steady_clock;
double secs(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

const char* input_error_name(int e) {
  switch (InputError(e)) {
    case InputError::kDType: return "unsupported dtype";
    case InputError::kLayout: return "unsupported layout (sparse or non-contiguous)";
    case InputError::kDevice: return "tensor on an unsupported device";
    case InputError::kOther: return "invalid input";
    case InputError::kConfig: return "an invalid config";
    case InputError::kLocalPass: return "a failure in its local pass (statistics of the bucket)";
    default: return "?";
  }
}

// Header: [count, nonfinite, errors[kNumInputErrors], then per field and per
// 16-bit piece the pair (v, v*v)]. Ranks agree on a field iff for every piece
// n * sum(v^2) == (sum v)^2 (equality in Cauchy-Schwarz). Integer sums are
// exact, so every rank evaluates the same verdict.
struct Field {
  const char* name;
  uint64_t value;
};
constexpr int kPieces = 4;
constexpr size_t kHeaderFixed = 2 + kNumInputErrors;

struct Header {
  int64_t nonfinite = 0;
  std::string error;  // non-empty: every rank raises this
};

// `local_error`: this rank's input report; `config_error`: make_scheme
// rejected this rank's config (reported as InputError::kConfig, also next to
// an input error); `pass_error`: its local pass threw (InputError::kLocalPass).
Header exchange_header(Transport& tr, const std::vector<Field>& fields, bool nonfinite,
                       InputError local_error, bool config_error, bool pass_error) {
  const int n = tr.size();
  std::vector<int64_t> h(kHeaderFixed + fields.size() * kPieces * 2, 0);
  h[0] = 1;
  h[1] = nonfinite ? 1 : 0;
  if (local_error != InputError::kNone) {
    // a code this build does not know (from the caller) still aborts every rank
    const int e = int(local_error);
    h[2 + size_t(e > 0 && e < kNumInputErrors ? e : int(InputError::kOther))] = 1;
  }
  if (config_error) h[2 + size_t(InputError::kConfig)] = 1;
  if (pass_error) h[2 + size_t(InputError::kLocalPass)] = 1;
  for (size_t f = 0; f < fields.size(); ++f)
    for (int p = 0; p < kPieces; ++p) {
      int64_t v = int64_t((fields[f].value >> (16 * p)) & 0xffffu);
      h[kHeaderFixed + (f * kPieces + size_t(p)) * 2] = v;
      h[kHeaderFixed + (f * kPieces + size_t(p)) * 2 + 1] = v * v;
    }
  tr.allreduce_sum_i64(h.data(), h.size());

  Header out;
  out.nonfinite = h[1];
  if (h[0] != n) {
    out.error = "header exchange counted " + std::to_string(h[0]) + " ranks, expected " +
                std::to_string(n);
    return out;
  }
  std::ostringstream errs;
  for (int e = 1; e < kNumInputErrors; ++e)
    if (h[2 + size_t(e)] > 0)
      errs << (errs.tellp() > 0 ? "; " : "") << h[2 + size_t(e)] << " rank(s) reported "
           << input_error_name(e);
  if (errs.tellp() > 0) {
    out.error = "dynamiq all-reduce aborted on every rank: " + errs.str() +
                " (the offending rank raises the detailed error)";
    return out;
  }
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
  if (bad.tellp() > 0)
    out.error = "ranks disagree on " + bad.str() +
                ": every rank must pass the same Config (mode, topology, bits, seed, ...) and "
                "issue the same collectives in the same order with tensors of the same dtype and "
                "size";
  return out;
}

ExecStats run_exact(Transport& tr, Topology topo, void* data, DType dtype, int64_t numel,
                    ReduceOp op, int64_t block_bytes, int64_t window_bytes, CallStats* cs,
                    const Device* device = nullptr) {
  const int n = tr.size();
  IdentityCodec host_codec;
  const std::unique_ptr<Codec> device_codec = device ? device->identity_codec() : nullptr;
  const Codec& codec = device ? *device_codec : host_codec;
  Plan plan = make_identity_plan(dtype, numel, topology_chunks(topo, n));
  BlockTable bt = make_blocks(plan, block_bytes);
  Program prog = make_program(topo, tr.rank(), n, bt);
  ExecArgs ea;
  ea.bucket = data;
  ea.out.bucket = data;
  ea.out.divisor = op == ReduceOp::kMean ? float(n) : 1.0f;
  ea.window_bytes = window_bytes;
  ea.memory = device ? &device->memory() : nullptr;
  ExecStats es;
  execute(tr, codec, plan, bt, prog, ea, es);
  if (cs) {
    cs->bits_per_coord = 8.0 * dtype_size(dtype);
    cs->blocks = int64_t(bt.blocks.size());
  }
  return es;
}

}  // namespace

void all_reduce_exact_f32(Transport& tr, Topology topo, float* data, int64_t count,
                          int64_t block_bytes, int64_t window_bytes, int64_t* bytes_sent,
                          const Device* device) {
  if (!device) {
    ExecStats es = run_exact(tr, topo, data, DType::kF32, count, ReduceOp::kSum, block_bytes,
                             window_bytes, nullptr);
    if (bytes_sent) *bytes_sent += es.bytes_sent;
    return;
  }
  // staged through the device's memory (a GPU transport sends device buffers)
  const Memory& mem = device->memory();
  const size_t bytes = size_t(count) * sizeof(float);
  auto release = [&mem](void* p) { mem.release(p); };
  std::unique_ptr<void, decltype(release)> d(mem.allocate(bytes), release);
  mem.from_host(d.get(), data, bytes);
  ExecStats es;
  try {
    es = run_exact(tr, topo, d.get(), DType::kF32, count, ReduceOp::kSum, block_bytes, window_bytes,
                   nullptr, device);
  } catch (...) {
    keep_forever(d.release());  // receives may still write there: never freed
    throw;
  }
  mem.to_host(data, d.get(), bytes);
  if (bytes_sent) *bytes_sent += es.bytes_sent;
}

Topology metadata_topology(Topology data_topology, int world) {
  return data_topology == Topology::kRing && world >= 4 ? Topology::kTwoStep : data_topology;
}

namespace {

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

// The path a bucket takes as far as the config and numel decide it (both in
// the header fingerprint, so every rank agrees): kCompressed may still become
// kExactNonfinite once the header has told whether some rank holds an inf/NaN.
Path path_before_header(const CollectiveConfig& cfg, const Scheme& scheme, int world, int64_t numel) {
  if (cfg.mode == Mode::kNone || world == 1) return Path::kExactMode;
  if (numel < std::max<int64_t>(cfg.min_compress_numel, cfg.supergroup_size)) return Path::kExactTiny;
  if (!scheme.fits_budget(numel)) return Path::kExactBudget;
  return Path::kCompressed;
}

// Parks the statistics vector and the bucket's owner (keep_forever) when the
// collective unwinds with an exception: receives of the metadata all-reduce
// and the exact paths' final receives point into them, and the backend may
// still write there (a peer that had not seen the failure yet sends on).
class ParkOnFailure {
 public:
  ParkOnFailure(std::vector<float>& stats, const std::shared_ptr<void>& owner)
      : stats_(stats), owner_(owner), exceptions_(std::uncaught_exceptions()) {}
  ParkOnFailure(const ParkOnFailure&) = delete;
  ParkOnFailure& operator=(const ParkOnFailure&) = delete;
  ~ParkOnFailure() {
    if (std::uncaught_exceptions() <= exceptions_) return;
    try {
      // moving a vector keeps its heap buffer: the parked vector owns the same memory
      keep_forever(std::make_shared<std::vector<float>>(std::move(stats_)));
      keep_forever(owner_);
    } catch (...) {  // out of memory while unwinding: leak instead
      new std::vector<float>(std::move(stats_));
    }
  }

 private:
  std::vector<float>& stats_;
  std::shared_ptr<void> owner_;
  const int exceptions_;
};

CallStats all_reduce_one(Transport& tr, const CollectiveConfig& cfg, const CallArgs& a, uint32_t slice) {
  const auto t_start = Clock::now();
  CallStats cs;
  cs.numel = a.numel;
  const int n = tr.size();
  // A null bucket is reported like any bad input: in the header exchange, so
  // that the peers raise with this rank instead of waiting for it.
  const bool null_data = a.local_error == InputError::kNone && a.numel > 0 && a.data == nullptr;
  const InputError local_error = null_data ? InputError::kOther : a.local_error;
  const bool ok_input = local_error == InputError::kNone;

  // A config this rank cannot run is reported in the header exchange, like an
  // input error, so that peers with another config raise at once rather than
  // wait in the exchange for the process group's timeout.
  std::unique_ptr<Scheme> scheme;
  std::unique_ptr<Codec> device_codec;
  std::string config_error;
  Path path = Path::kCompressed;
  try {
    scheme = make_scheme(cfg);
    path = path_before_header(cfg, *scheme, n, a.numel);
    // A device's codec is made now when the bucket may take the compressed
    // path, so that a config its kernels cannot run (on a GPU: super-groups
    // over the shared memory of a block) is reported here too.
    if (a.device && ok_input && path == Path::kCompressed) device_codec = scheme->device_codec(*a.device);
  } catch (const Error& e) {
    config_error = e.what();
    if (config_error.empty()) config_error = "dynamiq: invalid config";
  }
  const bool ok_config = config_error.empty();

  // 1. local pass. A failure here (a device allocation or kernel error, an
  // exhausted host) is reported in the header exchange too, so that the peers
  // raise with this rank instead of waiting for it in the exchange.
  auto t0 = Clock::now();
  std::vector<float> stats;
  bool nonfinite = false;
  std::exception_ptr pass_error;
  if (ok_input && ok_config && cfg.mode != Mode::kNone) {
    try {
      stats.resize(size_t(scheme->stats_count(a.dtype, a.numel)));
      nonfinite = a.device ? scheme->device_local_pass(*a.device, a.data, a.dtype, a.numel, stats.data())
                           : scheme->local_pass(a.data, a.dtype, a.numel, stats.data());
    } catch (...) {
      pass_error = std::current_exception();
    }
  }
  cs.t_local = secs(t0, Clock::now());

  // 2. header
  t0 = Clock::now();
  const std::vector<Field> fields = {
      {"mode", uint64_t(cfg.mode)},
      {"topology", uint64_t(cfg.topology)},
      {"reduce op", uint64_t(a.op)},
      {"dtype", uint64_t(a.dtype)},
      {"numel", uint64_t(a.numel)},
      {"collective sequence number", a.seq},
      {"slice of the bucket", uint64_t(slice)},
      {"config fingerprint (bits, seed, widths, rounding, group sizes, block size)",
       cfg.fingerprint()},
      // every rank plans from its own copy: a copy restored on some ranks only
      // would give other widths, so other message sizes, on those ranks
      {"allocator state (the fast rule's carried offset u)", plan_state_fingerprint(a.plan_state)},
  };
  Header hdr = exchange_header(tr, fields, nonfinite, local_error, !ok_config, pass_error != nullptr);
  cs.t_header = secs(t0, Clock::now());
  if (!ok_config) throw Error(config_error);  // the detailed error; peers raise hdr.error
  if (pass_error) std::rethrow_exception(pass_error);
  if (null_data) throw Error("dynamiq all-reduce: null data pointer for a bucket of " + std::to_string(a.numel) +
                              " elements");
  if (!hdr.error.empty()) throw Error(hdr.error);
  if (!ok_input) throw Error("dynamiq all-reduce: local input rejected");
  // From here on receives may be posted into `stats` and the bucket.
  const ParkOnFailure park(stats, a.keep_alive);

  if (path == Path::kCompressed && hdr.nonfinite > 0 && !scheme->exact()) path = Path::kExactNonfinite;
  cs.path = path;

  if (path != Path::kCompressed) {
    ExecStats es = run_exact(tr, cfg.topology, a.data, a.dtype, a.numel, a.op, cfg.exact_block_bytes(),
                             cfg.window_bytes, &cs, a.device);
    cs.bytes_sent = es.bytes_sent;
    cs.bytes_received = es.bytes_received;
    cs.messages_sent = es.messages_sent;
    cs.t_kernel = es.t_kernel;
    cs.t_wait = es.t_wait;
    cs.t_post = es.t_post;
    cs.t_total = secs(t_start, Clock::now());
    cs.pool_bytes = int64_t(executor_pool_bytes(a.device ? &a.device->memory() : nullptr));
    return cs;
  }

  // 3. metadata all-reduce: small, so its rounds are its cost; never around a
  // ring of 4+ ranks (2(n-1) rounds) but two-step (2 rounds).
  t0 = Clock::now();
  if (!stats.empty())
    all_reduce_exact_f32(tr, metadata_topology(cfg.topology, n), stats.data(), int64_t(stats.size()), cfg.exact_block_bytes(),
                         cfg.window_bytes, &cs.meta_bytes_sent, a.device);
  cs.t_meta = secs(t0, Clock::now());

  // 4. plan, blocks, schedule
  t0 = Clock::now();
  PlanState local_state;
  PlanState& ps = a.plan_state ? *a.plan_state : local_state;
  PlanInfo info;
  Plan plan = scheme->make_plan(a.dtype, a.numel, topology_chunks(cfg.topology, n), n,
                                stats.empty() ? nullptr : stats.data(), ps, info);
  BlockTable bt = make_blocks(plan, cfg.compressed_block_bytes());
  Program prog = make_program(cfg.topology, tr.rank(), n, bt);
  cs.t_plan = secs(t0, Clock::now());
  cs.bits_per_coord = info.bits_per_coord;
  for (int i = 0; i < 5; ++i) cs.width_units[i] = info.width_units[i];
  cs.alloc_passes = info.alloc_passes;
  cs.alloc_exact = info.alloc_exact ? 1 : 0;
  cs.alloc_fallbacks = info.alloc_fallback ? 1 : 0;
  cs.blocks = int64_t(bt.blocks.size());
  cs.has_u = ps.has_u;
  cs.u = ps.u;
  cs.u_step = ps.step;

  // 5-6. execute; decompress writes the finished values
  ExecArgs ea;
  ea.bucket = a.data;
  ea.out.bucket = a.data;
  ea.out.bias_scale = float(n);
  ea.out.divisor = a.op == ReduceOp::kMean ? float(n) : 1.0f;
  ea.window_bytes = cfg.window_bytes;
  ea.rng.key = make_rng_key(cfg.seed, a.seq, slice);
  ea.rng.rank = tr.rank();
  ea.rng.world = n;
  ea.rng.correlated = cfg.correlated;
  ea.rng.stochastic = cfg.stochastic;
  ea.memory = a.device ? &a.device->memory() : nullptr;
  if (a.device && !device_codec) device_codec = scheme->device_codec(*a.device);
  ExecStats es;
  execute(tr, a.device ? *device_codec : scheme->codec(), plan, bt, prog, ea, es);
  cs.bytes_sent = es.bytes_sent;
  cs.bytes_received = es.bytes_received;
  cs.messages_sent = es.messages_sent;
  cs.t_kernel = es.t_kernel;
  cs.t_wait = es.t_wait;
  cs.t_post = es.t_post;
  cs.t_total = secs(t_start, Clock::now());
  cs.pool_bytes = int64_t(executor_pool_bytes(ea.memory));
  return cs;
}

}  // namespace

CallStats all_reduce(Transport& tr, const CollectiveConfig& cfg, const CallArgs& a) {
  const int64_t es = dtype_size(a.dtype);
  const int64_t max_numel =
      cfg.max_collective_bytes > 0 ? std::max<int64_t>(cfg.max_collective_bytes / es, 4096) : INT64_MAX;
  if (a.local_error != InputError::kNone || a.numel <= max_numel || a.data == nullptr)
    return all_reduce_one(tr, cfg, a, 0);  // (a null bucket is reported there, unsliced)
  const int64_t k = ceil_div<int64_t>(a.numel, max_numel);
  const int64_t len = std::min(max_numel, ceil_div<int64_t>(ceil_div<int64_t>(a.numel, k), 4096) * 4096);
  CallStats total;
  total.numel = a.numel;
  total.slices = 0;
  double bits = 0.0;
  bool nonfinite = false;
  for (int64_t start = 0; start < a.numel; start += len) {
    CallArgs s = a;
    s.data = static_cast<uint8_t*>(a.data) + start * es;
    s.numel = std::min(len, a.numel - start);
    const CallStats c = all_reduce_one(tr, cfg, s, uint32_t(total.slices));
    if (total.slices == 0)
      total.path = c.path;
    else if (c.path != total.path)
      total.path = Path::kMixed;
    nonfinite = nonfinite || c.path == Path::kExactNonfinite;
    total.slices += 1;
    total.bytes_sent += c.bytes_sent;
    total.bytes_received += c.bytes_received;
    total.messages_sent += c.messages_sent;
    total.meta_bytes_sent += c.meta_bytes_sent;
    bits += c.bits_per_coord * double(s.numel);
    for (int i = 0; i < 5; ++i) total.width_units[i] += c.width_units[i];
    total.blocks += c.blocks;
    total.alloc_passes += c.alloc_passes;
    total.alloc_exact += c.alloc_exact;
    total.alloc_fallbacks += c.alloc_fallbacks;
    total.t_local += c.t_local;
    total.t_header += c.t_header;
    total.t_meta += c.t_meta;
    total.t_plan += c.t_plan;
    total.t_kernel += c.t_kernel;
    total.t_wait += c.t_wait;
    total.t_post += c.t_post;
    total.t_total += c.t_total;
    total.pool_bytes = c.pool_bytes;
    if (c.has_u) {  // (an exact-path slice leaves the allocator state as it was)
      total.has_u = true;
      total.u = c.u;
      total.u_step = c.u_step;
    }
  }
  if (nonfinite) total.path = Path::kExactNonfinite;
  total.bits_per_coord = bits / double(a.numel);
  return total;
}

}  // namespace dynamiq
