// Audit for the NCCL binding: which collectives post their point-to-point
// operations in an order NCCL can run (InprocWorld::nccl_order_violations:
// the k-th operation between two ranks must be a send on one side and a
// receive of the same size on the other, a group counting as one unit). Runs
// the whole collective driver (metadata all-reduce included) over the
// in-process transport for every mode, topology and 2-5 ranks, and prints a
// markdown table.
//   build/bench/nccl_order_audit
#include <cstdio>
#include <random>
#include <vector>

#include "hook/collective.h"
#include "hook/inproc_transport.h"

using namespace dynamiq;

int main() {
  const int64_t numel = 256 * 64 + 11;
  std::printf("| mode | topology | ranks | pairs breaking the rule | first offence |\n|---|---|---:|---:|---|\n");
  for (Mode mode : {Mode::kNone, Mode::kDynamiq, Mode::kBitsplit, Mode::kLossless})
    for (Topology topo : {Topology::kRing, Topology::kButterfly, Topology::kTwoStep})
      for (int n : {2, 3, 4, 5}) {
        CollectiveConfig cfg;
        cfg.mode = mode;
        cfg.topology = topo;
        cfg.bits = mode == Mode::kBitsplit ? 4.0 : 5.0;
        cfg.block_bytes = 4096;  // several blocks per chunk
        std::vector<std::vector<float>> x(static_cast<size_t>(n), std::vector<float>(size_t(numel)));
        std::mt19937 g{uint32_t(n)};
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (auto& v : x)
          for (auto& e : v) e = nd(g);
        InprocWorld world(n, std::chrono::seconds(60));
        world.run([&](int r, Transport& tr) {
          CallArgs a;
          a.data = x[size_t(r)].data();
          a.numel = numel;
          a.seq = 1;
          all_reduce(tr, cfg, a);
        });
        const auto v = world.nccl_order_violations();
        std::printf("| %s | %s | %d | %zu of %d | %s |\n", mode_name(mode), topology_name(topo), n, v.size(),
                    n * (n - 1) / 2, v.empty() ? "" : v[0].c_str());
      }
  return 0;
}
