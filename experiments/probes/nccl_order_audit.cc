// Audit for the NCCL binding: whether the collectives post their
// point-to-point operations in an order NCCL can run, under both of the ways
// ProcessGroupNCCL orders them: one stream per pair of ranks
// (InprocWorld::nccl_order_violations: the k-th operation between two ranks
// must be a send on one side and a receive of the same size on the other, a
// group counting as one unit) and one stream per rank
// (InprocWorld::nccl_stream_deadlock: grouped operations, or every operation
// of an eagerly initialised group in newer torch). Runs the whole collective
// driver (metadata all-reduce included) over the in-process transport for
// every mode, topology and 2-5 ranks, with the executor's default posting
// (receives posted ahead) and with the posting it uses on a transport that
// matches in posting order (posts_in_order, as NCCL's), and prints a markdown
// table, with the rounds of the ordered posting under the one-stream model
// (InprocWorld::nccl_stream_rounds: one round per unit of operations that
// cannot overlap; header all-reduce included).
//   build/bench/nccl_order_audit
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "hook/collective/collective.h"
#include "hook/transport/inproc_transport.h"

using namespace dynamiq;

int main() {
  const int64_t numel = 256 * 64 + 11;
  std::printf("| mode | topology | ranks | pairs breaking it, default posting | pairs breaking it, ordered posting | first offence (ordered posting, else default) | one stream per rank, default posting | one stream per rank, ordered posting | rounds, ordered posting |\n|---|---|---:|---:|---:|---|---|---|---:|\n");
  for (Mode mode : {mode_id("none"), mode_id("dynamiq"), mode_id("bitsplit"), mode_id("lossless")})
    for (Topology topo : schedule_topologies())
      for (int n : {2, 3, 4, 5, 8}) {
        CollectiveConfig cfg;
        cfg.mode = mode;
        cfg.topology = topo;
        cfg.block_bytes = 4096;  // several blocks per chunk
        std::vector<std::vector<float>> x(static_cast<size_t>(n), std::vector<float>(size_t(numel)));
        std::mt19937 g{uint32_t(n)};
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (auto& v : x)
          for (auto& e : v) e = nd(g);
        std::vector<std::string> v[2];
        std::string dead[2];
        int64_t rounds = -1;
        for (int ordered = 0; ordered < 2; ++ordered) {
          std::vector<std::vector<float>> y = x;
          InprocWorld world(n, std::chrono::seconds(60));
          world.set_posts_in_order(ordered == 1);
          world.run([&](int r, Transport& tr) {
            CallArgs a;
            a.data = y[size_t(r)].data();
            a.numel = numel;
            a.seq = 1;
            all_reduce(tr, cfg, a);
          });
          v[ordered] = world.nccl_order_violations();
          dead[ordered] = world.nccl_stream_deadlock();
          if (ordered) rounds = world.nccl_stream_rounds();
        }
        const int pairs = n * (n - 1) / 2;
        const std::string first = !v[1].empty() ? v[1][0] : !v[0].empty() ? v[0][0] : "";
        std::printf("| %s | %s | %d | %zu of %d | %zu of %d | %s | %s | %s | %lld |\n", mode_name(mode),
                    topology_name(topo), n, v[0].size(), pairs, v[1].size(), pairs, first.c_str(),
                    dead[0].empty() ? "runs" : "blocks", dead[1].empty() ? "runs" : dead[1].c_str(),
                    (long long)rounds);
      }
  return 0;
}
