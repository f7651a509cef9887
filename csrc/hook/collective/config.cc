#include "hook/collective/config.h"

#include <cstring>
#include <sstream>

#include "kernels/registry.h"

namespace dynamiq {

const char* topology_name(Topology t) {
  switch (t) {
    case Topology::kRing: return "ring";
    case Topology::kButterfly: return "butterfly";
    case Topology::kTwoStep: return "twostep";
    case Topology::kHierarchical: return "hierarchical";
  }
  return "?";
}

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::kAllReduce: return "all-reduce";
    case Collective::kReduceScatter: return "reduce-scatter";
    case Collective::kAllGather: return "all-gather";
  }
  return "?";
}

namespace {
struct Fnv {
  uint64_t h = 1469598103934665603ull;
  template <typename T>
  void add(const T& v) {
    unsigned char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    for (unsigned char c : b) {
      h ^= c;
      h *= 1099511628211ull;
    }
  }
};
}  // namespace

uint64_t CollectiveConfig::fingerprint() const {
  Fnv f;
  f.add(uint32_t(1));  // encoding version
  f.add(uint8_t(mode));
  f.add(uint8_t(topology));
  f.add(seed);
  f.add(bits);
  f.add(widths_mask);
  f.add(uint8_t(exact_allocator));
  f.add(uint8_t(correlated));
  f.add(uint8_t(stochastic));
  f.add(group_size);
  f.add(supergroup_size);
  f.add(spike_reserve);
  f.add(uint8_t(log_scales));
  for (float e : eps) f.add(e);
  f.add(uint8_t(uniform_levels));
  f.add(uint8_t(hierarchical_scales));
  f.add(block_bytes);
  f.add(min_compress_numel);
  if (max_collective_bytes != (int64_t(256) << 20)) f.add(max_collective_bytes);  // default: fingerprint as before
  if (topology == Topology::kHierarchical) {  // (other topologies: fingerprint as before)
    f.add(local_size);
    f.add(uint8_t(intra_mode));
  }
  if (mode == kModeAuto) {
    f.add(uint8_t(auto_lossy));
    f.add(auto_bandwidth);
    f.add(auto_latency);
  }
  if (error_bound != 0.0 || error_bound_rel != 0.0) {  // mode bounded; other configs fingerprint as before
    f.add(error_bound);
    f.add(error_bound_rel);
  }
  // window_bytes is rank-local (receive buffering) and does not change the wire.
  return f.h;
}

std::string CollectiveConfig::describe() const {
  std::ostringstream s;
  s << "mode=" << (mode == kModeAuto ? "auto" : mode_name(mode)) << " topology=" << topology_name(topology) << " bits=" << bits
    << " seed=" << seed;
  return s.str();
}

}  // namespace dynamiq
