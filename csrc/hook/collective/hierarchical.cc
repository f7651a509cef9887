#include "hook/collective/hierarchical.h"

#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "hook/collective/auto_mode.h"
#include "hook/collective/buffer_pool.h"
#include "hook/collective/header_exchange.h"
#include "hook/collective/topology.h"
#include "hook/transport/sub_transport.h"
#include "kernels/registry.h"

namespace dynamiq {
namespace {

using Clock = std::chrono::steady_clock;
double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// A buffer in the bucket's memory (host or the device's).
struct Buffer {
  const Memory* mem = nullptr;  // null: host
  std::vector<uint8_t> host;
  void* dev = nullptr;
  Buffer(const Memory* m, size_t bytes) : mem(m) {
    if (mem)
      dev = mem->allocate(bytes);
    else
      host.resize(bytes);
  }
  ~Buffer() {
    if (!leak) {
      if (dev) mem->release(dev);
    } else if (!mem) {
      keep_forever(std::make_shared<std::vector<uint8_t>>(std::move(host)));  // (keeps its heap buffer)
    }
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() { return mem ? dev : host.data(); }
  bool leak = false;  // receives may still write here after a failure: never freed
};

// dst <- src (bytes) in `mem` (through the host for a device's memory).
void copy(const Memory* mem, void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  if (!mem) {
    std::memmove(dst, src, bytes);
    return;
  }
  std::vector<uint8_t> h(bytes);
  mem->to_host(h.data(), src, bytes);
  mem->from_host(dst, h.data(), bytes);
}

void zero(const Memory* mem, void* dst, size_t bytes) {
  if (bytes == 0) return;
  if (!mem) {
    std::memset(dst, 0, bytes);
    return;
  }
  std::vector<uint8_t> h(bytes, 0);
  mem->from_host(dst, h.data(), bytes);
}

}  // namespace

std::string hierarchical_config_problem(const CollectiveConfig& cfg, int world) {
  const int k = cfg.local_size;
  if (k <= 0)
    return "dynamiq: topology 'hierarchical' needs the ranks per node: Config(local_size=k) or torchrun's "
           "LOCAL_WORLD_SIZE (got " + std::to_string(k) + ")";
  if (world % k != 0)
    return "dynamiq: topology 'hierarchical': local_size=" + std::to_string(k) + " does not divide the world of " +
           std::to_string(world) + " ranks (nodes must have equal numbers of ranks)";
  try {
    if (!make_scheme(hierarchical_intra_config(cfg))->exact())
      return std::string("dynamiq: topology 'hierarchical': intra_mode '") + mode_name(cfg.intra_mode) +
             "' is lossy; the intra-node phases run in 'none' or 'lossless'";
    if (cfg.mode != kModeAuto) make_scheme(hierarchical_inter_config(cfg, 0));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

CollectiveConfig hierarchical_intra_config(const CollectiveConfig& cfg) {
  CollectiveConfig c = cfg;
  c.mode = cfg.intra_mode;
  c.params = ParamSet();  // `params` are the inter-node mode's; the exact intra modes have none
  c.topology = kTopologyRing;
  c.local_size = 0;
  c.intra_mode = kModeNone;
  return c;
}

CollectiveConfig hierarchical_inter_config(const CollectiveConfig& cfg, int local) {
  CollectiveConfig c = cfg;
  c.topology = kTopologyRing;
  c.local_size = 0;
  c.intra_mode = kModeNone;
  c.seed = cfg.seed + 0x9e3779b97f4a7c15ull * uint64_t(local);
  return c;
}

CallStats hierarchical_all_reduce(Transport& tr, const CollectiveConfig& cfg, const CallArgs& a) {
  DQ_CHECK(cfg.topology == kTopologyHierarchical && a.kind == Collective::kAllReduce,
           "hierarchical_all_reduce: not a hierarchical all-reduce");
  const auto t_start = Clock::now();
  const int n = tr.size(), r = tr.rank();
  CallStats cs;
  cs.numel = a.numel;

  // 1. header over every rank. The allocator state differs between local
  // ranks (each plans its own shard): compared inside each inter-node ring.
  const std::string problem = hierarchical_config_problem(cfg, n);
  const bool null_data = a.local_error == InputError::kNone && a.numel > 0 && a.data == nullptr;
  const InputError local_error = null_data ? InputError::kOther : a.local_error;
  CallArgs h = a;
  h.plan_state = nullptr;
  auto t0 = Clock::now();
  // A bad local_size is not reported as a config error: ranks that differ in
  // it are told so by the header (its field), ranks that agree on a bad one
  // all raise the same detailed message below.
  const bool size_problem = cfg.local_size <= 0 || n % cfg.local_size != 0;
  const HeaderVerdict hdr = exchange_header(tr, collective_header_fields(cfg, h, 0),
                                            {false, local_error, !problem.empty() && !size_problem, false, a.kind});
  cs.t_header = secs(t0, Clock::now());
  if (size_problem && !hdr.error.empty() && hdr.error.find("local_size") != std::string::npos)
    throw Error(hdr.error);
  if (!problem.empty()) throw Error(problem);
  if (null_data)
    throw Error("dynamiq all-reduce: null data pointer for a bucket of " + std::to_string(a.numel) + " elements");
  if (!hdr.error.empty()) throw Error(hdr.error);
  if (local_error != InputError::kNone) throw Error("dynamiq all-reduce: local input rejected");

  const int k = cfg.local_size, m = n / k, node = r / k, local = r % k;
  std::vector<int> intra_members(static_cast<size_t>(k)), inter_members(static_cast<size_t>(m));
  for (int j = 0; j < k; ++j) intra_members[size_t(j)] = node * k + j;
  for (int i = 0; i < m; ++i) inter_members[size_t(i)] = i * k + local;
  const Memory* mem = a.device ? &a.device->memory() : nullptr;
  SubTransport intra(tr, intra_members, mem), inter(tr, inter_members, mem);
  const CollectiveConfig ci = hierarchical_intra_config(cfg), ce = hierarchical_inter_config(cfg, local);
  cs.path = Path::kExactMode;
  cs.bits_per_coord = 8.0 * dtype_size(a.dtype);
  if (a.numel == 0) {
    cs.t_total = secs(t_start, Clock::now());
    return cs;
  }

  // 2-4 over the bucket cut into k shards of S elements (padded with zeros)
  const int64_t es = dtype_size(a.dtype);
  int64_t S = padded_shard(ci, Collective::kReduceScatter, k, ceil_div<int64_t>(a.numel, k));
  DQ_CHECK(padded_shard(ci, Collective::kAllGather, k, S) == S, "hierarchical: shard sizes of the phases differ");
  const int64_t total = S * k;
  std::unique_ptr<Buffer> staged;
  void* work = a.data;
  if (total != a.numel) {
    staged = std::make_unique<Buffer>(mem, size_t(total * es));
    work = staged->data();
    copy(mem, work, a.data, size_t(a.numel * es));
    zero(mem, static_cast<uint8_t*>(work) + a.numel * es, size_t((total - a.numel) * es));
  }
  Buffer shard(mem, size_t(S * es));
  void* own = static_cast<uint8_t*>(work) + int64_t(local) * S * es;
  try {
    CallArgs b;
    b.dtype = a.dtype;
    b.seq = a.seq;
    b.device = a.device;
    b.keep_alive = a.keep_alive;
    t0 = Clock::now();
    CallStats rs, ar, ag;
    if (k > 1) {
      b.kind = Collective::kReduceScatter;
      b.data = work;
      b.output = shard.data();
      b.numel = total;
      b.op = ReduceOp::kSum;
      rs = collective(intra, ci, b);
    } else {
      copy(mem, shard.data(), work, size_t(S * es));
    }
    cs.t_intra += secs(t0, Clock::now());
    t0 = Clock::now();
    CallArgs c = b;
    c.kind = Collective::kAllReduce;
    c.data = shard.data();
    c.output = nullptr;
    c.numel = S;
    c.op = a.op;
    c.mean_world = n;
    c.plan_state = a.plan_state;
    c.auto_state = a.auto_state ? &inter_auto_state(*a.auto_state) : nullptr;
    ar = all_reduce(inter, ce, c);  // (one rank per node: also the sum of a node of one)
    cs.t_inter = secs(t0, Clock::now());
    t0 = Clock::now();
    copy(mem, own, shard.data(), size_t(S * es));
    if (k > 1) {
      b.kind = Collective::kAllGather;
      b.data = work;
      b.output = nullptr;
      b.numel = total;
      ag = collective(intra, ci, b);
    }
    if (staged) copy(mem, a.data, work, size_t(a.numel * es));
    cs.t_intra += secs(t0, Clock::now());
    for (const CallStats* p : {&rs, &ar, &ag}) {
      cs.ExecStats::add(*p);
      cs.meta_bytes_sent += p->meta_bytes_sent;
      cs.blocks += p->blocks;
      cs.t_local += p->t_local;
      cs.t_header += p->t_header;
      cs.t_meta += p->t_meta;
      cs.t_plan += p->t_plan;
    }
    cs.inter_bytes_sent = ar.bytes_sent + ar.meta_bytes_sent;
    cs.path = ar.path;
    cs.bits_per_coord = ar.bits_per_coord;
    for (int i = 0; i < 5; ++i) cs.width_units[i] = ar.width_units[i];
    cs.slices = ar.slices;
    cs.alloc_passes = ar.alloc_passes;
    cs.alloc_exact = ar.alloc_exact;
    cs.alloc_fallbacks = ar.alloc_fallbacks;
    cs.has_u = ar.has_u;
    cs.u = ar.u;
    cs.u_step = ar.u_step;
    cs.pool_bytes = ar.pool_bytes;
    cs.auto_choice = ar.auto_choice;
    cs.auto_reprobe = ar.auto_reprobe;
    for (int i = 0; i < 3; ++i) cs.auto_predicted[i] = ar.auto_predicted[i];
  } catch (...) {
    shard.leak = true;
    if (staged) staged->leak = true;
    throw;
  }
  cs.t_total = secs(t_start, Clock::now());
  return cs;
}

TopologyDef hierarchical_topology() {
  TopologyDef d;
  d.collectives = kAllReduceOnly;
  d.compose = hierarchical_all_reduce;
  d.group_problem = hierarchical_config_problem;
  d.validate = [](const CollectiveConfig& cfg) {
    DQ_CHECK(make_scheme(hierarchical_intra_config(cfg))->exact(),
             "intra_mode must be an exact mode (none or lossless)");
  };
  return d;
}

}  // namespace dynamiq
