// One DynamiQ compress and one fused hop (decompress_accumulate_recompress) on
// a bucket, for an instruction count under callgrind (instructions do not
// depend on the machine's load, unlike timings):
//   g++ -O3 -march=x86-64-v3 -ffp-contract=off -std=c++20 -Icsrc experiments/probes/dynamiq_hop_instructions.cc build/cpp/libdynamiq_kernels.a -lpthread -o /tmp/hop
//   DYNAMIQ_CPU_THREADS=1 valgrind --tool=callgrind --callgrind-out-file=/tmp/hop.cg --toggle-collect='dynamiq::DynamiqCodec::decompress_accumulate_recompress*' /tmp/hop 1048576 4 mix5
//   callgrind_annotate /tmp/hop.cg | head   (the total: instructions of the fused hop)
// Arguments: numel, world (1: independent rounding; 2-8: correlated, permutation
// table; > 8 swap-or-not), widths: "4" (every super-group at width 4) or
// "mix5" (30 % 8-bit, 30 % 4-bit, 40 % 2-bit, scattered, wire order by width,
// as the allocator's plans). fp32, default format, means subtracted.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/dynamiq/dynamiq_codec.h"

using namespace dynamiq;

int main(int argc, char** argv) {
  const int64_t numel = argc > 1 ? std::atoll(argv[1]) : (int64_t(1) << 20);
  const int world = argc > 2 ? std::atoi(argv[2]) : 1;
  const std::string widths = argc > 3 ? argv[3] : "mix5";
  DynamiqParams prm;
  DynamiqCodec codec(prm);
  const int S = prm.fmt.S;
  const int64_t units = (numel + S - 1) / S;
  std::mt19937 g(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint8_t> bits(static_cast<size_t>(units), 4);
  if (widths == "mix5")
    for (auto& b : bits) {
      const unsigned r = g() % 10;
      b = r < 3 ? 8 : r < 6 ? 4 : 2;
    }
  std::vector<int32_t> order(static_cast<size_t>(units));
  for (int64_t u = 0; u < units; ++u) order[size_t(u)] = int32_t(u);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return bits[size_t(a)] < bits[size_t(b)]; });
  std::vector<float> x(static_cast<size_t>(numel)), bias(static_cast<size_t>(units));
  for (auto& v : x) v = nd(g);
  for (int64_t u = 0; u < units; ++u) {
    double s = 0;
    for (int64_t i = u * S; i < std::min<int64_t>(numel, (u + 1) * S); ++i) s += x[size_t(i)];
    bias[size_t(u)] = float(s / S);
  }
  const Plan plan = make_dynamiq_plan(DType::kF32, numel, prm.fmt, bits, order, bias, 1);
  const Block all{0, units};
  const size_t bytes = codec.static_bytes(plan, all);
  RngCtx rng;
  rng.key = make_rng_key(5, 6);
  rng.world = world;
  rng.rank = world - 1;
  rng.correlated = world > 1;
  Local lx;
  lx.bucket = x.data();
  std::vector<uint8_t> in(bytes), out(bytes);
  codec.compress(lx, plan, all, rng, in.data());
  codec.decompress_accumulate_recompress(in.data(), bytes, lx, plan, all, rng, out.data());
  unsigned h = 0;
  for (uint8_t b : out) h = h * 31 + b;
  std::printf("numel %lld world %d widths %s bytes %zu hash %08x\n", static_cast<long long>(numel), world,
              widths.c_str(), bytes, h);
  return 0;
}
