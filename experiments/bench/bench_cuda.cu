// GPU codec benchmark: compress, the fused hop (decompress + accumulate +
// recompress, what a ring's middle hop runs) and decompress of every mode's
// CUDA codec over a float32 or bf16 bucket, block by block as the executor
// calls them (blocks of the compressed path's wire size), timed with CUDA
// events on one stream, against a device-to-device copy of the same bytes in
// the same run. Prints one row per (size, mode, op): milliseconds, GB/s of
// bucket bytes (input bytes / time; the copy: bytes copied / time) and the
// percentage of the copy's rate.
//
//   bench_cuda [--mib 64,256] [--iters 5] [--dtype f32|bf16] [--dry-run]
//
// Then the host time per collective (issue 30's target: < 0.5 ms): a 2-rank
// all-reduce in one process (a thread per rank, both on this GPU, the in-process
// transport posting in order as NCCL does) of 4 KiB and 256 KiB buckets, whose
// kernels take microseconds, so that the wall time of a call is mostly the
// host's: driver, header exchange, plan, launches and the waits it must do.
// Rank 0's median over the calls (the device work is synchronized after each
// call, outside the timed region).
//
// --dry-run: a 256 KiB bucket and one iteration, to check that everything runs
// (scripts/gpu_check.sh --dry-run runs it on the CUDA emulation, whose times
// mean nothing). Targets on H100/H200 (issue 30): dynamiq fused hop and
// bitsplit at >= 50 % of the copy, lossless compress + decompress >= 25 %.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "hook/collective/collective.h"
#include "hook/collective/config.h"
#include "hook/collective/schedule.h"
#include "kernels/base/cuda/cuda_device.h"
#include "kernels/base/cuda/cuda_memory.h"
#include "kernels/base/float_bits.h"
#include "kernels/registry.h"
#include "kernels/scheme.h"
#include "hook/transport/inproc_transport.h"

namespace {

using namespace dynamiq;

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_cuda: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

struct Timer {
  cudaEvent_t a, b;
  Timer() {
    ck(cudaEventCreate(&a), "event");
    ck(cudaEventCreate(&b), "event");
  }
  ~Timer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  // Mean milliseconds of `iters` runs of fn on `st` (after one warm-up run).
  template <class F>
  float time(cudaStream_t st, int iters, F&& fn) {
    fn();
    ck(cudaEventRecord(a, st), "record");
    for (int i = 0; i < iters; ++i) fn();
    ck(cudaEventRecord(b, st), "record");
    ck(cudaEventSynchronize(b), "event sync");
    float ms = 0;
    ck(cudaEventElapsedTime(&ms, a, b), "elapsed");
    return ms / float(iters);
  }
};

// Gradient-like values: normal-ish, magnitudes varying by super-group (so
// dynamiq picks several widths), a few large ones.
std::vector<uint8_t> make_values(DType dt, int64_t n) {
  std::vector<uint8_t> out(size_t(n) * size_t(dtype_size(dt)));
  uint64_t s = 0x9e3779b97f4a7c15ull;
  auto next = [&] {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    return double(s >> 11) * (1.0 / 9007199254740992.0);
  };
  for (int64_t i = 0; i < n; ++i) {
    const double scale = std::ldexp(1.0, -12 + int((i / 256) % 9));
    const double u1 = next() + 1e-12, u2 = next();
    const float v = float(scale * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
    if (dt == DType::kF32) std::memcpy(&out[size_t(i) * 4], &v, 4);
    else {
      const uint16_t h = f32_to_bf16(v);
      std::memcpy(&out[size_t(i) * 2], &h, 2);
    }
  }
  return out;
}

struct Row {
  std::string mode, op;
  float ms;
};

// See the header comment: rank 0's median wall time of `calls` all-reduces.
void host_time_per_collective(DType dt, int calls) {
  std::printf("# host time per collective: 2 ranks in one process on this GPU, %s, median of %d calls\n",
              dtype_name(dt), calls);
  std::printf("%-9s %-10s %10s\n", "KiB", "mode", "ms/call");
  for (const size_t bytes : {size_t(4) << 10, size_t(256) << 10}) {
    const int64_t numel = int64_t(bytes / size_t(dtype_size(dt)));
    const std::vector<uint8_t> host = make_values(dt, numel);
    for (const char* mode : {"none", "dynamiq", "bitsplit", "lossless"}) {
      CollectiveConfig cfg;
      cfg.mode = mode_id(mode);
      cfg.min_compress_numel = 0;  // the codec's path even for the small bucket
      std::vector<double> ms;
      InprocWorld world(2, std::chrono::seconds(60), &cuda::device_memory());
      world.set_posts_in_order(true);
      world.run([&](int r, Transport& tr) {
        cudaStream_t rs = nullptr;
        ck(cudaStreamCreateWithFlags(&rs, cudaStreamNonBlocking), "stream");
        cuda::StreamScope scope(rs);
        void* d = nullptr;
        ck(cudaMalloc(&d, bytes), "malloc");
        PlanState ps;
        for (int i = 0; i < calls + 2; ++i) {  // 2 warm-up calls
          ck(cudaMemcpyAsync(d, host.data(), bytes, cudaMemcpyHostToDevice, rs), "upload");
          ck(cudaStreamSynchronize(rs), "sync");
          CallArgs a;
          a.data = d;
          a.dtype = dt;
          a.numel = numel;
          a.seq = uint64_t(i);
          a.plan_state = &ps;
          a.device = &cuda::device();
          const auto t0 = std::chrono::steady_clock::now();
          all_reduce(tr, cfg, a);
          const auto t1 = std::chrono::steady_clock::now();
          ck(cudaStreamSynchronize(rs), "sync");
          if (r == 0 && i >= 2) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        }
        cudaFree(d);
        cudaStreamDestroy(rs);
      });
      std::sort(ms.begin(), ms.end());
      std::printf("%-9g %-10s %10.3f\n", double(bytes) / 1024.0, mode, ms[ms.size() / 2]);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> mibs = {64, 256};
  int iters = 5;
  bool dry = false;
  DType dt = DType::kF32;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dry-run") dry = true;
    else if (a == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (a == "--dtype" && i + 1 < argc) dt = std::string(argv[++i]) == "bf16" ? DType::kBF16 : DType::kF32;
    else if (a == "--mib" && i + 1 < argc) {
      mibs.clear();
      for (char* p = std::strtok(argv[++i], ","); p; p = std::strtok(nullptr, ",")) mibs.push_back(std::atoll(p));
    } else {
      std::fprintf(stderr, "usage: bench_cuda [--mib 64,256] [--iters 5] [--dtype f32|bf16] [--dry-run]\n");
      return 2;
    }
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::fprintf(stderr, "bench_cuda: no CUDA device\n");
    return 1;
  }
  std::vector<size_t> sizes;
  for (int64_t m : mibs) sizes.push_back(size_t(m) << 20);
  if (dry) {
    sizes = {size_t(256) << 10};
    iters = 1;
  }
#if defined(DYNAMIQ_CUDA_EMULATION)
  const char* card = "the CPU emulation of CUDA";
#else
  cudaDeviceProp prop{};
  ck(cudaGetDeviceProperties(&prop, 0), "properties");
  const char* card = prop.name;
#endif
  cudaStream_t st = nullptr;
  ck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  cuda::StreamScope scope(st);
  const Device& dev = cuda::device();
  Timer timer;
  std::printf("# bench_cuda: %s, %s buckets, %d iterations, blocks of %lld wire bytes%s\n", card,
              dtype_name(dt), iters, (long long)CollectiveConfig::kCompressedBlockBytes,
              dry ? " (dry run: times mean nothing)" : "");
  std::printf("%-9s %-10s %-9s %10s %9s %8s\n", "MiB", "mode", "op", "ms", "GB/s", "%copy");
  for (const size_t bytes : sizes) {
    const double mib = double(bytes) / double(1 << 20);
    const int64_t numel = int64_t(bytes / size_t(dtype_size(dt)));
    const std::vector<uint8_t> host = make_values(dt, numel);
    void *x = nullptr, *y = nullptr;
    ck(cudaMalloc(&x, bytes), "malloc");
    ck(cudaMalloc(&y, bytes), "malloc");
    ck(cudaMemcpy(x, host.data(), bytes, cudaMemcpyHostToDevice), "upload");
    const float copy_ms =
        timer.time(st, iters, [&] { ck(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, st), "copy"); });
    const double gb = double(bytes) / 1e9;
    std::printf("%-9g %-10s %-9s %10.3f %9.1f %8.1f\n", mib, "copy", "d2d", copy_ms, gb / (copy_ms / 1e3),
                100.0);
    for (const char* mode : {"none", "dynamiq", "bitsplit", "lossless"}) {
      CollectiveConfig cfg;
      cfg.mode = mode_id(mode);
      const std::unique_ptr<Scheme> scheme = make_scheme(cfg);
      // the plan of a 2-rank all-reduce whose ranks hold these values
      std::vector<float> stats(size_t(scheme->stats_count(dt, numel)));
      scheme->device_local_pass(dev, x, dt, numel, stats.data());
      for (float& v : stats) v *= 2.0f;
      PlanState ps;
      PlanInfo info;
      const Plan plan = scheme->make_plan(dt, numel, 1, 2, stats.data(), ps, info);
      const BlockTable bt = make_blocks(plan, CollectiveConfig::kCompressedBlockBytes);
      const std::unique_ptr<Codec> codec = scheme->device_codec(dev);
      std::vector<size_t> off(bt.blocks.size() + 1, 0);
      for (size_t i = 0; i < bt.blocks.size(); ++i)
        off[i + 1] = off[i] + (codec->max_message_bytes(plan, bt.blocks[i]) + 255) / 256 * 256;
      uint8_t *w1 = nullptr, *w2 = nullptr;
      ck(cudaMalloc(reinterpret_cast<void**>(&w1), off.back() + 256), "malloc");
      ck(cudaMalloc(reinterpret_cast<void**>(&w2), off.back() + 256), "malloc");
      std::vector<size_t> len(bt.blocks.size(), 0);
      RngCtx rng;
      rng.key = make_rng_key(1, 2);
      rng.rank = 0;
      rng.world = 2;
      Local lx;
      lx.bucket = x;
      Output out;
      out.bucket = y;
      out.bias_scale = 2.0f;
      out.divisor = 2.0f;
      auto compress = [&] {
        for (size_t i = 0; i < bt.blocks.size(); ++i) len[i] = codec->compress(lx, plan, bt.blocks[i], rng, w1 + off[i]);
      };
      const float c_ms = timer.time(st, iters, compress);
      const float h_ms = timer.time(st, iters, [&] {
        for (size_t i = 0; i < bt.blocks.size(); ++i)
          codec->decompress_accumulate_recompress(w1 + off[i], len[i], lx, plan, bt.blocks[i], rng, w2 + off[i]);
      });
      const float d_ms = timer.time(st, iters, [&] {
        for (size_t i = 0; i < bt.blocks.size(); ++i) codec->decompress(w1 + off[i], len[i], plan, bt.blocks[i], out);
      });
      size_t wire = 0;
      for (size_t l : len) wire += l;
      for (const Row& r : {Row{mode, "compress", c_ms}, Row{mode, "hop", h_ms}, Row{mode, "decompress", d_ms}})
        std::printf("%-9g %-10s %-9s %10.3f %9.1f %8.1f\n", mib, r.mode.c_str(), r.op.c_str(), r.ms,
                    gb / (r.ms / 1e3), 100.0 * copy_ms / r.ms);
      std::printf("#   %s: %.3f wire bits per coordinate, %zu blocks\n", mode, 8.0 * double(wire) / double(numel),
                  bt.blocks.size());
      ck(cudaStreamSynchronize(st), "sync");
      cudaFree(w1);
      cudaFree(w2);
    }
    cudaFree(x);
    cudaFree(y);
  }
  host_time_per_collective(dt, dry ? 3 : 50);
  cudaStreamDestroy(st);
  return 0;
}
