#include "hook/collective/collective.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <numeric>
#include <string>
#include <vector>

#include "hook/collective/executor.h"
#include "hook/collective/header_exchange.h"
#include "hook/collective/auto_mode.h"
#include "hook/collective/topology.h"
#include "kernels/identity/identity_codec.h"

namespace dynamiq {
namespace {

using Clock = std::chrono::steady_clock;
double secs(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A driver phase [t0, t1] of slice `slice`, when the call records a timeline.
void phase(Timeline* tl, const char* name, uint32_t slice, Clock::time_point t0, Clock::time_point t1) {
  if (!tl) return;
  TimelineEvent e;
  e.name = name;
  e.slice = int32_t(slice);
  e.t_post = e.t_start = std::chrono::duration<double>(t0.time_since_epoch()).count();
  e.t_end = std::chrono::duration<double>(t1.time_since_epoch()).count();
  tl->events.push_back(e);
}

// Device codecs, made once per (config, mode, device, stream) and kept: their
// tables (dynamiq's levels and permutation columns, its plan buffers, the
// lossless scratch, bitsplit's flag) are allocated and uploaded once, not at
// every collective. A codec made for a stream runs only there (CudaCodec), so
// the stream is part of the key. At most kMaxDeviceCodecs are kept (the
// least recently used one is dropped). The cache is never destroyed: at exit
// the device may be gone before static destructors run.
using CodecKey = std::tuple<uint64_t, int, std::string, int, void*>;
struct CodecCache {
  std::mutex mu;
  std::map<CodecKey, std::pair<std::shared_ptr<Codec>, uint64_t>> codecs;  // -> (codec, last use)
  uint64_t clock = 0;
};
constexpr size_t kMaxDeviceCodecs = 16;
CodecCache& codec_cache() {
  static auto* c = new CodecCache();
  return *c;
}

std::shared_ptr<Codec> device_codec_for(uint64_t config_fp, Mode mode, const Device& d,
                                        const std::function<std::unique_ptr<Codec>()>& make) {
  const CodecKey key(config_fp, int(mode), d.name(), d.memory().domain(), d.stream());
  CodecCache& c = codec_cache();
  std::lock_guard<std::mutex> lk(c.mu);
  auto it = c.codecs.find(key);
  if (it != c.codecs.end()) {
    it->second.second = ++c.clock;
    return it->second.first;
  }
  std::shared_ptr<Codec> codec = make();
  if (c.codecs.size() >= kMaxDeviceCodecs) {
    auto oldest = c.codecs.begin();
    for (auto j = c.codecs.begin(); j != c.codecs.end(); ++j)
      if (j->second.second < oldest->second.second) oldest = j;
    c.codecs.erase(oldest);  // (a collective still using it holds its own reference)
  }
  c.codecs.emplace(key, std::make_pair(codec, ++c.clock));
  return codec;
}

// Where a collective's decompressed results go (Output::bucket: element e of
// the bucket at bucket + e). A reduce-scatter's output holds only this rank's
// shard, chunk `rank`: the base is set back by that many elements (the codecs
// only write this rank's chunk there).
void* output_base(Collective kind, void* data, void* output, int64_t numel, DType dtype, int rank, int world) {
  if (kind != Collective::kReduceScatter) return data;
  return static_cast<uint8_t*>(output) - int64_t(rank) * (numel / world) * dtype_size(dtype);
}

// The exact collective of `data` over the identity codec (for a
// reduce-scatter or all-gather: chunk c = shard c, the identity unit chosen
// per shard); adds its executor counts and times to `st` and returns the
// number of blocks.
int64_t run_exact(Transport& tr, Topology topo, void* data, DType dtype, int64_t numel, ReduceOp op,
                  int64_t block_bytes, int64_t window_bytes, ExecStats& st, const Device* device = nullptr,
                  Collective kind = Collective::kAllReduce, void* output = nullptr, int mean_world = 0,
                  Timeline* tl = nullptr, int32_t slice = 0, const char* part = "data") {
  const int n = tr.size();
  IdentityCodec host_codec;
  const std::shared_ptr<Codec> device_codec =
      device ? device_codec_for(0, kModeNone, *device, [&] { return make_device_codec(kModeNone, host_codec, *device); })
             : nullptr;
  const Codec& codec = device ? *device_codec : host_codec;
  int64_t unit = 256;
  if (kind != Collective::kAllReduce) {
    unit = identity_shard_unit(numel / n);
    DQ_CHECK(unit > 0, std::string("dynamiq ") + collective_name(kind) + ": shards of " +
                           std::to_string(numel / n) + " elements must be padded first (padded_shard)");
  }
  Plan plan = make_identity_plan(dtype, numel, topology_chunks(topo, n, kind), int32_t(unit));
  BlockTable bt = make_blocks(plan, block_bytes);
  Program prog = make_program(topo, tr.rank(), n, bt, kind);
  ExecArgs ea;
  ea.bucket = data;
  ea.out.bucket = output_base(kind, data, output, numel, dtype, tr.rank(), n);
  ea.out.divisor = op == ReduceOp::kMean ? float(mean_world > 0 ? mean_world : n) : 1.0f;
  ea.window_bytes = window_bytes;
  ea.memory = device ? &device->memory() : nullptr;
  ea.timeline = tl;
  ea.timeline_slice = slice;
  ea.timeline_part = part;
  execute(tr, codec, plan, bt, prog, ea, st);
  return int64_t(bt.blocks.size());
}

}  // namespace

size_t device_codecs_cached() {
  CodecCache& c = codec_cache();
  std::lock_guard<std::mutex> lk(c.mu);
  return c.codecs.size();
}

void release_device_codecs(const void* stream) {
  std::vector<std::shared_ptr<Codec>> drop;  // destroyed outside the lock
  {
    CodecCache& c = codec_cache();
    std::lock_guard<std::mutex> lk(c.mu);
    for (auto it = c.codecs.begin(); it != c.codecs.end();) {
      if (std::get<4>(it->first) == stream) {
        drop.push_back(std::move(it->second.first));
        it = c.codecs.erase(it);
      } else {
        ++it;
      }
    }
  }
}

void clear_device_codecs() {
  std::map<CodecKey, std::pair<std::shared_ptr<Codec>, uint64_t>> drop;  // destroyed outside the lock
  CodecCache& c = codec_cache();
  {
    std::lock_guard<std::mutex> lk(c.mu);
    drop.swap(c.codecs);
  }
}

void all_reduce_exact_f32(Transport& tr, Topology topo, float* data, int64_t count,
                          int64_t block_bytes, int64_t window_bytes, int64_t* bytes_sent,
                          const Device* device, Timeline* timeline, int32_t slice) {
  ExecStats es;
  if (!device) {
    run_exact(tr, topo, data, DType::kF32, count, ReduceOp::kSum, block_bytes, window_bytes, es, nullptr,
              Collective::kAllReduce, nullptr, 0, timeline, slice, "meta");
    if (bytes_sent) *bytes_sent += es.bytes_sent;
    return;
  }
  // staged through the device's memory (a GPU transport sends device buffers)
  const Memory& mem = device->memory();
  const size_t bytes = size_t(count) * sizeof(float);
  auto release = [&mem](void* p) { mem.release(p); };
  std::unique_ptr<void, decltype(release)> d(mem.allocate(bytes), release);
  mem.from_host(d.get(), data, bytes);
  try {
    run_exact(tr, topo, d.get(), DType::kF32, count, ReduceOp::kSum, block_bytes, window_bytes, es, device,
              Collective::kAllReduce, nullptr, 0, timeline, slice, "meta");
  } catch (...) {
    keep_forever(d.release());  // receives may still write there: never freed
    throw;
  }
  mem.to_host(data, d.get(), bytes);
  if (bytes_sent) *bytes_sent += es.bytes_sent;
}

Topology metadata_topology(Topology data_topology, int world) {
  static const Topology twostep = topology_id("twostep");
  return data_topology == kTopologyRing && world >= 4 ? twostep : data_topology;
}

namespace {

// The path a bucket takes as far as the config and numel decide it (both in
// the header fingerprint, so every rank agrees): kCompressed may still become
// kExactNonfinite once the header has told whether some rank holds an inf/NaN.
Path path_before_header(const CollectiveConfig& cfg, const Scheme& scheme, int world, int64_t numel) {
  if (scheme.identity() || world == 1) return Path::kExactMode;
  if (numel < std::max<int64_t>(cfg.min_compress_numel, scheme.min_compressed_numel())) return Path::kExactTiny;
  if (!scheme.fits_budget(numel)) return Path::kExactBudget;
  return Path::kCompressed;
}

// What this rank's config makes of a bucket, before any communication. A
// config this rank cannot run is reported in the header exchange, like an
// input error, so that peers with another config raise at once rather than
// wait in the exchange for the process group's timeout.
struct Setup {
  std::unique_ptr<Scheme> scheme;
  std::shared_ptr<Codec> device_codec;
  std::string config_error;  // non-empty: this rank cannot run the config
  Path path = Path::kCompressed;
};

// The scheme's device codec for cfg on d (cached: device_codec_for).
std::shared_ptr<Codec> device_codec(const CollectiveConfig& cfg, const Scheme& scheme, const Device& d) {
  return device_codec_for(cfg.fingerprint(), scheme.mode(), d, [&] { return scheme.device_codec(d); });
}

Setup set_up(const CollectiveConfig& cfg, const CallArgs& a, int world, bool ok_input) {
  Setup s;
  try {
    if (cfg.mode == kModeAuto)
      throw Error(std::string("dynamiq ") + collective_name(a.kind) +
                  ": mode 'auto' runs all-reduces only; name the mode (none, lossless, ...)");
    topology_for(cfg.topology, a.kind);  // registered, and runs this collective
    s.scheme = make_scheme(cfg);
    if (a.kind == Collective::kAllGather && !s.scheme->exact())
      throw Error(std::string("dynamiq all-gather: mode '") + mode_name(cfg.mode) +
                  "' is lossy; an all-gather runs in mode 'lossless' or 'none' (parameters must arrive exact)");
    s.path = path_before_header(cfg, *s.scheme, world, a.numel);
    // A device's codec is made now when the bucket may take the compressed
    // path, so that a config its kernels cannot run (on a GPU: super-groups
    // over the shared memory of a block) is reported here too.
    if (a.device && ok_input && s.path == Path::kCompressed) s.device_codec = device_codec(cfg, *s.scheme, *a.device);
  } catch (const Error& e) {
    s.config_error = e.what();
    if (s.config_error.empty()) s.config_error = "dynamiq: invalid config";
  }
  return s;
}

// Step 1: the scheme's statistics and the non-finite flag. A failure here (a
// device allocation or kernel error, an exhausted host) is reported in the
// header exchange too, so that the peers raise with this rank instead of
// waiting for it in the exchange.
struct LocalPass {
  std::vector<float> stats;
  bool nonfinite = false;
  std::exception_ptr error;
};

LocalPass run_local_pass(const Scheme& scheme, const CallArgs& a) {
  LocalPass p;
  try {
    p.stats.resize(size_t(scheme.stats_count(a.dtype, a.numel)));
    p.nonfinite = a.device ? scheme.device_local_pass(*a.device, a.data, a.dtype, a.numel, p.stats.data())
                           : scheme.local_pass(a.data, a.dtype, a.numel, p.stats.data());
  } catch (...) {
    p.error = std::current_exception();
  }
  return p;
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

// Steps 3-4: the metadata all-reduce of the statistics (small, so its rounds
// are its cost: never around a ring of 4+ ranks, 2(n-1) rounds, but two-step,
// 2 rounds), then the plan, its blocks and this rank's schedule.
struct Layout {
  Plan plan;
  BlockTable bt;
  Program prog;
};

Layout plan_compressed(Transport& tr, const CollectiveConfig& cfg, const CallArgs& a, const Scheme& scheme,
                       std::vector<float>& stats, CallStats& cs, uint32_t slice) {
  const int n = tr.size();
  auto t0 = Clock::now();
  if (!stats.empty())
    all_reduce_exact_f32(tr, metadata_topology(cfg.topology, n), stats.data(), int64_t(stats.size()),
                         cfg.exact_block_bytes(), cfg.window_bytes, &cs.meta_bytes_sent, a.device, a.timeline,
                         int32_t(slice));
  const auto t_meta_end = Clock::now();
  cs.t_meta = secs(t0, t_meta_end);
  phase(a.timeline, "meta", slice, t0, t_meta_end);

  t0 = Clock::now();
  PlanState local_state;
  PlanState& ps = a.plan_state ? *a.plan_state : local_state;
  PlanInfo info;
  Layout l;
  const float* global = stats.empty() ? nullptr : stats.data();
  l.plan = a.kind == Collective::kAllReduce
               ? scheme.make_plan(a.dtype, a.numel, topology_chunks(cfg.topology, n), n, global, ps, info)
               : scheme.make_shard_plan(a.dtype, a.numel, n, n, global, ps, info);
  l.bt = make_blocks(l.plan, cfg.compressed_block_bytes());
  l.prog = make_program(cfg.topology, tr.rank(), n, l.bt, a.kind);
  const auto t1 = Clock::now();
  cs.t_plan = secs(t0, t1);
  phase(a.timeline, "plan", slice, t0, t1);
  cs.bits_per_coord = info.bits_per_coord;
  for (int i = 0; i < 5; ++i) cs.width_units[i] = info.width_units[i];
  cs.alloc_passes = info.alloc_passes;
  cs.alloc_exact = info.alloc_exact ? 1 : 0;
  cs.alloc_fallbacks = info.alloc_fallback ? 1 : 0;
  cs.blocks = int64_t(l.bt.blocks.size());
  cs.has_u = ps.has_u;
  cs.u = ps.u;
  cs.u_step = ps.step;
  return l;
}

// Steps 5-6: execute; the codec's decompress writes the finished values.
ExecArgs compressed_exec_args(Transport& tr, const CollectiveConfig& cfg, const Scheme& scheme, const CallArgs& a,
                              uint32_t slice) {
  const int n = tr.size();
  ExecArgs ea;
  // a reduce-scatter's sink keeps its sum as it is: n - 1 compressions per
  // coordinate, one fewer than the all-reduce, whose owner compresses the sum
  // for the all-gather (docs/modes.md "Reduce-scatter")
  ea.sink_writes_sum = a.kind == Collective::kReduceScatter && !scheme.exact();
  ea.bucket = a.data;
  ea.out.bucket = output_base(a.kind, a.data, a.output, a.numel, a.dtype, tr.rank(), n);
  ea.out.bias_scale = float(n);
  ea.out.divisor = a.op == ReduceOp::kMean ? float(a.mean_world > 0 ? a.mean_world : n) : 1.0f;
  ea.window_bytes = cfg.window_bytes;
  ea.rng.key = make_rng_key(cfg.seed, a.seq, slice);
  ea.rng.rank = tr.rank();
  ea.rng.world = n;
  scheme.set_rng_flags(ea.rng);
  ea.memory = a.device ? &a.device->memory() : nullptr;
  ea.timeline = a.timeline;
  ea.timeline_slice = int32_t(slice);
  return ea;
}

void finish(CallStats& cs, Clock::time_point t_start, const CallArgs& a) {
  cs.t_total = secs(t_start, Clock::now());
  cs.pool_bytes = int64_t(executor_pool_bytes(a.device ? &a.device->memory() : nullptr));
}

CallStats all_reduce_one(Transport& tr, const CollectiveConfig& cfg, const CallArgs& a, uint32_t slice) {
  const auto t_start = Clock::now();
  CallStats cs;
  cs.numel = a.numel;
  if (a.timeline) {
    a.timeline->rank = tr.rank();
    a.timeline->world = tr.size();
  }
  // A null bucket is reported like any bad input: in the header exchange, so
  // that the peers raise with this rank instead of waiting for it.
  const int n = tr.size();
  const char* what = collective_name(a.kind);
  const bool null_data = a.local_error == InputError::kNone && a.numel > 0 &&
                         (a.data == nullptr || (a.kind == Collective::kReduceScatter && a.output == nullptr));
  // a reduce-scatter or all-gather's bucket is world equal shards
  const bool bad_shape = a.local_error == InputError::kNone && a.kind != Collective::kAllReduce && a.numel % n != 0;
  const InputError local_error = null_data ? InputError::kOther : bad_shape ? InputError::kShape : a.local_error;
  const bool ok_input = local_error == InputError::kNone;
  Setup setup = set_up(cfg, a, n, ok_input);
  const bool ok_config = setup.config_error.empty();

  auto t0 = Clock::now();
  LocalPass pass;
  if (ok_input && ok_config && !setup.scheme->identity()) {
    const PrecomputedLocalPass* pre = a.local_pass;
    if (pre && pre->fingerprint == cfg.fingerprint() && pre->data == a.data && pre->dtype == a.dtype &&
        pre->numel == a.numel && !a.device && a.kind == Collective::kAllReduce &&
        int64_t(pre->stats.size()) == setup.scheme->stats_count(a.dtype, a.numel)) {
      pass.stats = pre->stats;
      pass.nonfinite = pre->nonfinite;
    } else {
      pass = run_local_pass(*setup.scheme, a);
    }
  }
  auto t1 = Clock::now();
  cs.t_local = secs(t0, t1);
  phase(a.timeline, "local", slice, t0, t1);

  t0 = Clock::now();
  const std::vector<HeaderField> fields = collective_header_fields(cfg, a, slice);
  const HeaderVerdict hdr =
      exchange_header(tr, fields,
                      {pass.nonfinite, local_error, !ok_config, pass.error != nullptr, a.kind,
                       a.auto_exchange ? &a.auto_exchange->local : nullptr});
  t1 = Clock::now();
  cs.t_header = secs(t0, t1);
  phase(a.timeline, "header", slice, t0, t1);
  if (a.auto_exchange && hdr.error.empty()) a.auto_exchange->sums = hdr.sums;
  if (!ok_config) throw Error(setup.config_error);  // the detailed error; peers raise hdr.error
  if (pass.error) std::rethrow_exception(pass.error);
  if (null_data)
    throw Error(std::string("dynamiq ") + what + ": null data pointer for a bucket of " + std::to_string(a.numel) +
                " elements");
  if (bad_shape)
    throw Error(std::string("dynamiq ") + what + ": a bucket of " + std::to_string(a.numel) +
                " elements does not split into " + std::to_string(n) + " equal shards");
  if (!hdr.error.empty()) throw Error(hdr.error);
  if (!ok_input) throw Error(std::string("dynamiq ") + what + ": local input rejected");
  // From here on receives may be posted into the statistics and the bucket.
  const ParkOnFailure park(pass.stats, a.keep_alive);

  cs.path = setup.path;
  if (cs.path == Path::kCompressed && hdr.nonfinite_ranks > 0 && !setup.scheme->exact())
    cs.path = Path::kExactNonfinite;
  if (cs.path != Path::kCompressed) {
    cs.bits_per_coord = 8.0 * dtype_size(a.dtype);
    t0 = Clock::now();
    cs.blocks = run_exact(tr, cfg.topology, a.data, a.dtype, a.numel, a.op, cfg.exact_block_bytes(),
                          cfg.window_bytes, cs, a.device, a.kind, a.output, a.mean_world, a.timeline,
                          int32_t(slice));
    phase(a.timeline, "exact", slice, t0, Clock::now());
    finish(cs, t_start, a);
    return cs;
  }
  const Layout l = plan_compressed(tr, cfg, a, *setup.scheme, pass.stats, cs, slice);
  if (a.device && !setup.device_codec) setup.device_codec = device_codec(cfg, *setup.scheme, *a.device);
  const Codec& codec = a.device ? *setup.device_codec : setup.scheme->codec();
  t0 = Clock::now();
  execute(tr, codec, l.plan, l.bt, l.prog, compressed_exec_args(tr, cfg, *setup.scheme, a, slice), cs);
  phase(a.timeline, "execute", slice, t0, Clock::now());
  finish(cs, t_start, a);
  return cs;
}

}  // namespace

bool precompute_local_pass(const CollectiveConfig& cfg, const CallArgs& a, PrecomputedLocalPass& out) {
  if (a.device || a.data == nullptr || a.kind != Collective::kAllReduce) return false;
  try {
    const std::unique_ptr<Scheme> scheme = make_scheme(cfg);
    if (scheme->identity()) return false;
    CallArgs b = a;
    b.local_pass = nullptr;
    LocalPass p = run_local_pass(*scheme, b);
    if (p.error) return false;
    out.fingerprint = cfg.fingerprint();
    out.data = a.data;
    out.dtype = a.dtype;
    out.numel = a.numel;
    out.stats = std::move(p.stats);
    out.nonfinite = p.nonfinite;
    return true;
  } catch (const Error&) {
    return false;
  }
}

namespace {

// Adds one slice's stats to a bucket's (see all_reduce).
void add_slice(CallStats& total, const CallStats& c) {
  if (total.slices == 0)
    total.path = c.path;
  else if (c.path != total.path)
    total.path = Path::kMixed;
  total.slices += 1;
  total.ExecStats::add(c);
  total.meta_bytes_sent += c.meta_bytes_sent;
  for (int i = 0; i < 5; ++i) total.width_units[i] += c.width_units[i];
  total.blocks += c.blocks;
  total.alloc_passes += c.alloc_passes;
  total.alloc_exact += c.alloc_exact;
  total.alloc_fallbacks += c.alloc_fallbacks;
  total.t_local += c.t_local;
  total.t_header += c.t_header;
  total.t_meta += c.t_meta;
  total.t_plan += c.t_plan;
  total.t_total += c.t_total;
  total.pool_bytes = c.pool_bytes;
  if (c.has_u) {  // (an exact-path slice leaves the allocator state as it was)
    total.has_u = true;
    total.u = c.u;
    total.u_step = c.u_step;
  }
}

}  // namespace

CallStats collective(Transport& tr, const CollectiveConfig& cfg, const CallArgs& a) {
  if (a.kind == Collective::kAllReduce) return all_reduce(tr, cfg, a);
  CallArgs b = a;
  if (b.kind == Collective::kAllGather) b.op = ReduceOp::kSum;  // (nothing is reduced)
  return all_reduce_one(tr, cfg, b, 0);
}

int64_t padded_shard(const CollectiveConfig& cfg, Collective kind, int world, int64_t shard) {
  DQ_CHECK(world >= 1 && shard >= 0, "padded_shard: bad world or shard size");
  auto round_up = [](int64_t x, int64_t m) { return ceil_div<int64_t>(x, m) * m; };
  // the exact paths' identity plan: a unit that divides the shard, else pad to a multiple of 64
  const int64_t exact = identity_shard_unit(shard) > 0 ? shard : round_up(shard, 64);
  const std::unique_ptr<Scheme> scheme = make_scheme(cfg);
  const int64_t sm = scheme->shard_multiple();
  if (kind == Collective::kAllGather || sm == 0 ||
      path_before_header(cfg, *scheme, world, int64_t(world) * exact) != Path::kCompressed)
    return exact;
  // Compressed: whole units per shard; a multiple of 64 too, so that the exact
  // paths (non-finite input) cut it as well. A larger bucket stays compressed
  // (path_before_header is monotone in numel once the shards are whole units).
  if (shard % sm == 0 && identity_shard_unit(shard) > 0) return shard;
  return round_up(shard, std::lcm<int64_t>(sm, 64));
}

CallStats all_reduce(Transport& tr, const CollectiveConfig& cfg, const CallArgs& a) {
  if (a.kind != Collective::kAllReduce) return collective(tr, cfg, a);
  if (const TopologyDef& t = topology_def(cfg.topology); t.composition()) return t.compose(tr, cfg, a);
  if (cfg.mode == kModeAuto) return auto_all_reduce(tr, cfg, a);
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
    add_slice(total, c);
    nonfinite = nonfinite || c.path == Path::kExactNonfinite;
    bits += c.bits_per_coord * double(s.numel);
  }
  if (nonfinite) total.path = Path::kExactNonfinite;
  total.bits_per_coord = bits / double(a.numel);
  return total;
}

}  // namespace dynamiq
