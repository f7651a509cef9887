// Benchmark of the lossless codec (mode "lossless") on one CPU core:
// compression ratio (bytes on the wire / raw bytes) and throughput (GB/s of
// raw input) of compress, decompress and the fused decompress-accumulate-
// recompress, next to memcpy of the same bytes in the same run.
//
//   build/cpp/bench_lossless [--mb 16] [--reps 5] [--quick] [--only "gauss bfloat16"] [--block-kib 256]
//   DYNAMIQ_CPU_THREADS=2 build/cpp/bench_lossless   # codec calls on 2 threads, wall time
//
// Data: Gaussian of several sigmas in bf16, fp16, fp32, and two gradient-like
// heavy-tailed sets (Student t with 2 degrees of freedom; Gaussian with a
// log-normal scale per 256-value row and 10% exact zeros). Blocks are cut as
// the collective cuts them (256-value units, block_bytes = 256 KiB raw unless
// --block-kib says otherwise).
#include <algorithm>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "hook/collective/schedule.h"
#include "kernels/base/float_bits.h"
#include "kernels/identity/identity_codec.h"
#include "kernels/lossless/lossless_codec.h"
#include "kernels/base/parallel.h"

using namespace dynamiq;

namespace {

int64_t g_block_bytes = 256 * 1024;  // raw bytes per block (--block-kib)

// CPU time of this thread: the machine is shared, and wall time would count
// the time other processes hold the core. With DYNAMIQ_CPU_THREADS > 1 the
// codec calls also run on helper threads, which this clock would miss: wall
// time then.
double thread_seconds() {
  timespec ts;
  clock_gettime(dynamiq_cpu_threads() > 1 ? CLOCK_MONOTONIC : CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Best of `reps` timed runs of fn (thread_seconds); one untimed warm-up.
double best_time(const std::function<void()>& fn, int reps) {
  fn();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = thread_seconds();
    fn();
    best = std::min(best, thread_seconds() - t0);
  }
  return best;
}

uint32_t from_float(DType t, float f) {
  if (t == DType::kF32) return f32_bits(f);
  return t == DType::kBF16 ? f32_to_bf16(f) : f32_to_f16(f);
}

struct DataSet {
  std::string name;
  DType dtype;
  std::vector<uint8_t> bytes;
  int64_t numel() const { return int64_t(bytes.size()) / dtype_size(dtype); }
};

DataSet make(const std::string& kind, DType t, double sigma, int64_t numel, uint32_t seed) {
  DataSet d;
  d.dtype = t;
  d.bytes.resize(size_t(numel * dtype_size(t)));
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::chi_squared_distribution<float> chi(2.f);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  const int es = dtype_size(t);
  float row_scale = 1.f;
  for (int64_t i = 0; i < numel; ++i) {
    float v;
    if (kind == "gauss") {
      v = float(sigma) * nd(g);
    } else if (kind == "t2") {
      v = float(sigma) * nd(g) / std::sqrt(chi(g) / 2.f);
    } else {  // grad: log-normal row scales, 10% zeros
      if (i % 256 == 0) row_scale = float(sigma) * std::exp(1.5f * nd(g));
      v = u(g) < 0.1f ? 0.f : row_scale * nd(g);
    }
    const uint32_t w = from_float(t, v);
    std::memcpy(d.bytes.data() + i * es, &w, size_t(es));
  }
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%s %s s=%.0e", kind.c_str(), dtype_name(t), sigma);
  d.name = buf;
  return d;
}

struct Row {
  std::string name;
  double ratio, ratio_zip, ratio_huff, bits, entropy, block_entropy, zip_sigma_bits;
  int64_t formats[4];
  double memcpy_gbs, comp_gbs, decomp_gbs, dar_gbs, none_dar_gbs;
};

Row bench(const DataSet& d, int reps, bool timing) {
  Row row{};
  row.name = d.name;
  const DType t = d.dtype;
  const int64_t numel = d.numel();
  const int64_t raw = int64_t(d.bytes.size());

  // Compression: the stats function (what the lead's Python side calls).
  const LosslessStats s = lossless_stats(d.bytes.data(), t, numel, g_block_bytes);
  row.ratio = s.ratio;
  row.bits = s.exponent_bits;
  row.entropy = s.exponent_entropy;
  row.block_entropy = s.block_exponent_entropy;
  for (int f = 0; f < 4; ++f) row.formats[f] = s.blocks_by_format[f];
  LosslessOptions zip, huf;
  zip.formats = 0x5;
  huf.formats = 0x9;
  row.ratio_zip = lossless_stats(d.bytes.data(), t, numel, g_block_bytes, zip).ratio;
  row.ratio_huff = lossless_stats(d.bytes.data(), t, numel, g_block_bytes, huf).ratio;
  row.zip_sigma_bits = zipccl_sigma_rule_bits(d.bytes.data(), t, numel);
  if (!timing) return row;

  // Throughput through the codec interface, blocks as the collective cuts them.
  LosslessCodec codec;
  Plan plan = make_lossless_plan(t, numel, 1);
  BlockTable bt = make_blocks(plan, g_block_bytes);
  std::vector<size_t> off(bt.blocks.size() + 1, 0), len(bt.blocks.size());
  for (size_t i = 0; i < bt.blocks.size(); ++i) off[i + 1] = off[i] + codec.max_message_bytes(plan, bt.blocks[i]);
  std::vector<uint8_t> msgs(off.back()), out(off.back()), dst(d.bytes.size()), cpy(d.bytes.size());
  Local x;
  x.bucket = d.bytes.data();
  RngCtx rng;
  const double t_copy = best_time([&] { std::memcpy(cpy.data(), d.bytes.data(), d.bytes.size()); }, reps);
  const double t_comp = best_time(
      [&] {
        for (size_t i = 0; i < bt.blocks.size(); ++i)
          len[i] = codec.compress(x, plan, bt.blocks[i], rng, msgs.data() + off[i]);
      },
      reps);
  Output y;
  y.bucket = dst.data();
  const double t_dec = best_time(
      [&] {
        for (size_t i = 0; i < bt.blocks.size(); ++i)
          codec.decompress(msgs.data() + off[i], len[i], plan, bt.blocks[i], y);
      },
      reps);
  if (dst != d.bytes) std::fprintf(stderr, "ROUND TRIP MISMATCH on %s\n", d.name.c_str());
  const double t_dar = best_time(
      [&] {
        for (size_t i = 0; i < bt.blocks.size(); ++i)
          codec.decompress_accumulate_recompress(msgs.data() + off[i], len[i], x, plan, bt.blocks[i],
                                                 rng, out.data() + off[i]);
      },
      reps);
  // Mode none's fused hop on the same blocks: the arithmetic both modes share.
  IdentityCodec id;
  std::vector<uint8_t> raw_out(d.bytes.size());
  const double t_none = best_time(
      [&] {
        for (size_t i = 0; i < bt.blocks.size(); ++i) {
          const size_t e0 = size_t(bt.blocks[i].w0 * plan.unit) * size_t(dtype_size(t));
          id.decompress_accumulate_recompress(cpy.data() + e0, id.static_bytes(plan, bt.blocks[i]), x,
                                              plan, bt.blocks[i], rng, raw_out.data() + e0);
        }
      },
      reps);
  row.none_dar_gbs = double(raw) / t_none / 1e9;
  row.memcpy_gbs = double(raw) / t_copy / 1e9;
  row.comp_gbs = double(raw) / t_comp / 1e9;
  row.decomp_gbs = double(raw) / t_dec / 1e9;
  row.dar_gbs = double(raw) / t_dar / 1e9;
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  double mb = 16;
  int reps = 5;
  bool quick = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--mb" && i + 1 < argc) mb = std::atof(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--quick") quick = true;
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else if (a == "--block-kib" && i + 1 < argc) g_block_bytes = int64_t(std::atoi(argv[++i])) * 1024;
    else {
      std::fprintf(stderr, "usage: %s [--mb MB] [--reps N] [--quick] [--only SUBSTRING] [--block-kib KIB]\n",
                   argv[0]);
      return 2;
    }
  }
  struct Spec {
    std::string kind;
    DType t;
    double sigma;
  };
  std::vector<Spec> specs;
  for (DType t : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (double s : {1e-2, 1e-3, 1e-4, 1e-5, 1e-6}) {
      if (quick && s != 1e-2 && s != 1e-4) continue;
      specs.push_back({"gauss", t, s});
    }
    specs.push_back({"t2", t, 1e-4});
    specs.push_back({"grad", t, 1e-4});
  }
  const int threads = dynamiq_cpu_threads();
  if (threads > 1)
    std::printf("lossless codec, %d threads per call (DYNAMIQ_CPU_THREADS; memcpy stays one thread), %.0f MB raw per set, best of %d; blocks of %lld KiB raw\n",
                threads, mb, reps, (long long)(g_block_bytes / 1024));
  else
    std::printf("lossless codec, one core, %.0f MB raw per set, best of %d; blocks of %lld KiB raw\n", mb, reps,
                (long long)(g_block_bytes / 1024));
  std::printf("ratio = wire bytes / raw bytes (headers and tables included); zip = ZipCCL top-7 only;\n");
  std::printf("huff = Huffman only; bits/exp = achieved exponent bits (tables included) vs entropy H\n");
  std::printf("(whole tensor) and Hb (per-block mean); sigma-rule = ZipCCL's 3 + escapes with the window\n");
  std::printf("from log2(sigma) - 5.35. Throughput in GB/s of raw input (%s); x = ratio to\n",
              threads > 1 ? "wall time" : "thread CPU time");
  std::printf("memcpy of the same bytes in the same run; none DAR = mode none's fused hop on the same blocks.\n\n");
  std::printf("| data | ratio | zip | huff | bits/exp | H | Hb | sigma-rule bits | blocks p/c/z/h | memcpy | compress | decompress | DAR | none DAR |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  uint32_t seed = 0;
  for (const Spec& sp : specs) {
    ++seed;
    char name[96];
    std::snprintf(name, sizeof(name), "%s %s s=%.0e", sp.kind.c_str(), dtype_name(sp.t), sp.sigma);
    if (!only.empty() && std::string(name).find(only) == std::string::npos) continue;
    const DataSet d = make(sp.kind, sp.t, sp.sigma, int64_t(mb * 1e6) / dtype_size(sp.t), seed);
    Row r = bench(d, reps, true);
    std::printf("| %s | %.4f | %.4f | %.4f | %.3f | %.3f | %.3f | %.3f | %lld/%lld/%lld/%lld | %.2f | %.2f (%.2fx) | %.2f (%.2fx) | %.2f (%.2fx) | %.2f |\n",
                r.name.c_str(), r.ratio, r.ratio_zip, r.ratio_huff, r.bits, r.entropy, r.block_entropy,
                r.zip_sigma_bits, (long long)r.formats[0], (long long)r.formats[1], (long long)r.formats[2],
                (long long)r.formats[3], r.memcpy_gbs, r.comp_gbs, r.comp_gbs / r.memcpy_gbs, r.decomp_gbs,
                r.decomp_gbs / r.memcpy_gbs, r.dar_gbs, r.dar_gbs / r.memcpy_gbs, r.none_dar_gbs);
    std::fflush(stdout);
  }
  return 0;
}
