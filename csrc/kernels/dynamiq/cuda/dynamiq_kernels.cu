// CUDA kernels of the DynamiQ codec: thin loops over dynamiq_math.h (see
// dynamiq_kernels.h). One block per super-group; every per-element and
// per-group computation is the same __host__ __device__ function the CPU
// codec calls, in the same arithmetic order (group maxima are exact integer
// maxima of bit patterns, so the reduction order does not matter).
#include "kernels/dynamiq/cuda/dynamiq_kernels.h"
#include "kernels/base/cuda/cuda_memory.h"
#include "kernels/base/cuda/launch.h"

#include <cuda_runtime.h>

#include <string>

namespace dynamiq {
namespace cuda {
namespace {

enum Kind : int { kCompress = 0, kFused = 1, kDecAcc = 2, kDecompress = 3 };

// Largest S the kernels accept (shared memory: 5 bytes per element + 8 per group).
constexpr int kMaxS = 8192;
constexpr size_t kMaxSharedBytes = 48 * 1024;  // per block without cudaFuncSetAttribute

size_t shared_bytes(const DynamiqFormat& f) { return size_t(f.S) * 5 + size_t(f.S / f.s) * 8 + 16; }

__device__ float load_elem(DType dt, const void* p, int64_t i) {
  switch (dt) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
  }
}

__device__ void store_elem(DType dt, void* p, int64_t i, float v) {
  switch (dt) {
    case DType::kF32: static_cast<float*>(p)[i] = v; break;
    case DType::kBF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
    default: static_cast<uint16_t*>(p)[i] = f32_to_f16(v); break;
  }
}

// Element i of wire position w of the local data (load_unit semantics).
__device__ float load_local(const DevicePlan& p, const DeviceLocal& x, int64_t w, int64_t src,
                            int i, int64_t cnt) {
  if (x.acc) return x.acc[(w - x.acc_w0) * p.unit + i];
  if (i >= cnt) return 0.0f;
  const float v = load_elem(p.dtype, x.bucket, src * p.unit + i);
  return p.bias ? v - p.bias[src] : v;
}

// decompress: value; accumulate: base + value (fmaf, as the CPU's std::fma).
template <int B>
__device__ float decode_elem(const uint8_t* sg, const DynamiqFormat& f, const DqTables& tb, int i,
                             float base, bool accumulate) {
  if constexpr (B == 16) {
    const float v = bf16_to_f32(load_u16(sg + 2 * i));
    return accumulate ? base + v : v;
  } else {
    const uint8_t* codes = sg + dynamiq_scale_bytes(B, f);
    const float sc = dq_read_group_scale(sg, f, tb.r255, i / f.s);
    const float d = tb.lv[dynamiq_width_index(B)].decode[dq_code_at(codes, f.S, B, i)];
    return accumulate ? fmaf(d, sc, base) : d * sc;
  }
}

// Encodes the block's tile (shared) into out; the CPU's encode_sg step by step.
template <int B>
__device__ void encode_block(const DynamiqFormat& f, bool stochastic_scales, const DqTables& tb,
                             const DqRounding& rd, int64_t src, const float* tile, uint32_t* gm,
                             float* inv, uint8_t* codes, uint8_t* out) {
  const int S = f.S, s = f.s, G = S / s;
  if constexpr (B == 16) {
    for (int i = threadIdx.x; i < S; i += blockDim.x) {
      const uint16_t h = f32_to_bf16(tile[i]);
      out[2 * i] = uint8_t(h);
      out[2 * i + 1] = uint8_t(h >> 8);
    }
  } else {
    for (int k = threadIdx.x; k < G; k += blockDim.x) gm[k] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < S; i += blockDim.x)
      atomicMax(&gm[i / s], f32_bits(tile[i]) & 0x7fffffffu);
    __syncthreads();
    uint32_t mbits = 0;
    for (int k = 0; k < G; ++k) mbits = gm[k] > mbits ? gm[k] : mbits;
    const bool bad = mbits >= 0x7f800000u;
    const float M = bits_f32(mbits);
    uint8_t* codes_out;
    if (f.hierarchical) {
      const uint16_t hb = bad ? uint16_t(0x7fc0u) : dq_sg_scale_bits(M);
      const float Msg = bf16_to_f32(hb);
      if (threadIdx.x == 0) {
        out[0] = uint8_t(hb);
        out[1] = uint8_t(hb >> 8);
      }
      for (int k = threadIdx.x; k < G; k += blockDim.x) {
        const float g = bits_f32(gm[k]);
        DqGroupScale gs{0, 0.0f, 0.0f};
        if (!bad) {
          gs = stochastic_scales
                   ? dq_group_scale_stochastic(g, Msg, tb.r255, dq_group_word(rd.key, rd.rank, src, G, k))
                   : dq_group_scale_up(g, Msg, tb.r255);
        }
        out[2 + k] = gs.r;
        inv[k] = gs.inv;
      }
      codes_out = out + 2 + G;
    } else {
      for (int k = threadIdx.x; k < G; k += blockDim.x) {
        uint16_t hb;
        DqGroupScale gs = dq_group_scale_flat(bits_f32(gm[k]), hb);
        if (bad) {
          hb = 0x7fc0u;
          gs.inv = 0.0f;
        }
        out[2 * k] = uint8_t(hb);
        out[2 * k + 1] = uint8_t(hb >> 8);
        inv[k] = gs.inv;
      }
      codes_out = out + 2 * G;
    }
    __syncthreads();
    const DqLevels& lv = tb.lv[dynamiq_width_index(B)];
    for (int i = threadIdx.x; i < S; i += blockDim.x) {
      const uint32_t w = rd.stochastic ? dq_value_word(rd.key, kPurposeValue, rd.rank, src, S, i) : 0u;
      const float pi = dq_stratum(rd, src, S, i);
      uint32_t c;
      if constexpr (B == 1)
        c = dq_encode_sign(tile[i], inv[i / s], pi, w, rd);
      else
        c = dq_encode_value<B>(lv, tile[i], inv[i / s], pi, w, rd);
      codes[i] = uint8_t(c);
    }
    __syncthreads();
    constexpr int P = 8 / B;
    const int nb = S / P;
    for (int k = threadIdx.x; k < nb; k += blockDim.x) {
      uint32_t byte = 0;
      for (int j = 0; j < P; ++j) byte |= uint32_t(codes[k + j * nb]) << (j * B);
      codes_out[k] = uint8_t(byte);
    }
  }
}

struct Args {
  DynamiqFormat f;
  bool stochastic_scales;
  DqTables tb;
  DevicePlan p;
  DeviceLocal x;
  int64_t w0;
  DqRounding rd;
  const uint8_t* in;
  uint8_t* out;
  float* acc;
  DeviceOutput y;
};

template <int B>
__device__ void run_block(const Args& a, int kind, int64_t w, int64_t src, float* tile,
                          uint32_t* gm, float* inv, uint8_t* codes) {
  const DynamiqFormat& f = a.f;
  const int S = f.S;
  const int64_t base_off = a.p.wire_offset[a.w0];
  const uint8_t* in_sg = a.in ? a.in + (a.p.wire_offset[w] - base_off) : nullptr;
  const int64_t e0 = src * a.p.unit;
  const int64_t cnt = a.p.numel - e0 < S ? a.p.numel - e0 : S;
  for (int i = threadIdx.x; i < S; i += blockDim.x) {
    float v = kind == kDecompress ? 0.0f : load_local(a.p, a.x, w, src, i, cnt);
    if (kind != kCompress) {
      v = decode_elem<B>(in_sg, f, a.tb, i, v, kind != kDecompress);
      if (kind != kDecompress && i >= cnt) v = 0.0f;  // zero padding
    }
    tile[i] = v;
  }
  __syncthreads();
  if (kind == kDecompress) {
    const float b = a.p.bias ? a.y.bias_scale * a.p.bias[src] : 0.0f;
    for (int i = threadIdx.x; i < cnt; i += blockDim.x) {
      float v = tile[i];
      if (a.p.bias) v += b;
      if (a.y.divisor != 1.0f) v /= a.y.divisor;
      store_elem(a.p.dtype, a.y.bucket, e0 + i, v);
    }
    return;
  }
  if (kind == kDecAcc) {
    for (int i = threadIdx.x; i < S; i += blockDim.x) a.acc[(w - a.w0) * S + i] = tile[i];
    return;
  }
  uint8_t* out_sg = a.out + (a.p.wire_offset[w] - base_off);
  encode_block<B>(f, a.stochastic_scales, a.tb, a.rd, src, tile, gm, inv, codes, out_sg);
}

__global__ void dynamiq_kernel(const Args a, int kind) {
  DQ_DYNAMIC_SMEM(smem);
  const int S = a.f.S, G = S / a.f.s;
  float* tile = reinterpret_cast<float*>(smem);
  uint32_t* gm = reinterpret_cast<uint32_t*>(tile + S);
  float* inv = reinterpret_cast<float*>(gm + G);
  uint8_t* codes = reinterpret_cast<uint8_t*>(inv + G);
  const int64_t w = a.w0 + blockIdx.x;
  const int64_t src = a.p.order ? a.p.order[w] : w;
  switch (a.p.bits[src]) {
    case 1: run_block<1>(a, kind, w, src, tile, gm, inv, codes); break;
    case 2: run_block<2>(a, kind, w, src, tile, gm, inv, codes); break;
    case 4: run_block<4>(a, kind, w, src, tile, gm, inv, codes); break;
    case 8: run_block<8>(a, kind, w, src, tile, gm, inv, codes); break;
    default: run_block<16>(a, kind, w, src, tile, gm, inv, codes); break;
  }
}

// Full blocks: kStatUnitsPerBlock super-groups per block of kStatLanes *
// kStatUnitsPerBlock threads (kStatLanes lanes per super-group, each summing
// the same elements in the same order as the CPU pass, dynamiq_stats.h, so
// the statistics are bit-identical to it).
constexpr int kStatUnitsPerBlock = 32;

__global__ void stats_kernel(const void* data, DType dt, int64_t numel, int32_t S, float* out,
                             uint32_t* nonfinite) {
  __shared__ double s[kStatUnitsPerBlock][kStatLanes], q[kStatUnitsPerBlock][kStatLanes];
  const int j = int(threadIdx.x) / kStatLanes;  // super-group of the block
  const int l = int(threadIdx.x) % kStatLanes;  // lane
  const int64_t u = int64_t(blockIdx.x) * kStatUnitsPerBlock + j;
  const int64_t e0 = u * S;
  const int64_t c = e0 >= numel ? 0 : numel - e0 < S ? numel - e0 : S;
  double ls = 0.0, lq = 0.0;
  uint32_t bad = 0;
  for (int64_t i = l; i < c; i += kStatLanes) {
    const float f = load_elem(dt, data, e0 + i);
    const double v = double(f);
    ls += v;
    lq += v * v;
    bad |= DTypeTraits<DType::kF32>::nonfinite(f);  // (the conversion keeps inf and nan)
  }
  s[j][l] = ls;
  q[j][l] = lq;
  if (bad) atomicOr(nonfinite, 1u);
  __syncthreads();
  if (l == 0 && c > 0) {
    out[2 * u] = dq_saturate(dq_combine_lanes(s[j]) / double(c));
    out[2 * u + 1] = dq_saturate(dq_combine_lanes(q[j]));
  }
}

int launch(const DynamiqParams& prm, const DqTables& tb, const DevicePlan& p, const DeviceLocal& x,
           int64_t w0, int64_t w1, const DqRounding& rd, const uint8_t* in, uint8_t* out,
           float* acc, const DeviceOutput& y, int kind, void* stream) {
  if (w1 <= w0) return 0;
  if (prm.fmt.S > kMaxS || p.unit != prm.fmt.S) return int(cudaErrorInvalidValue);
  Args a{prm.fmt, prm.stochastic_group_scales, tb, p, x, w0, rd, in, out, acc, y};
  const int S = prm.fmt.S;
  const size_t smem = shared_bytes(prm.fmt);
  const int threads = S < 256 ? S : 256;
  DQ_LAUNCH(dynamiq_kernel, unsigned(w1 - w0), unsigned(threads), smem, static_cast<cudaStream_t>(stream))(a, kind);
  return int(cudaGetLastError());
}

}  // namespace

std::string unsupported(const DynamiqParams& prm) {
  const DynamiqFormat& f = prm.fmt;
  if (f.S > kMaxS)
    return "the CUDA kernels take super-groups of at most " + std::to_string(kMaxS) + " elements (supergroup_size=" +
           std::to_string(f.S) + ")";
  if (f.s < 1 || f.S % f.s != 0) return "group size must divide the super-group size";
  if (shared_bytes(f) > kMaxSharedBytes)
    return "supergroup_size=" + std::to_string(f.S) + " with group_size=" + std::to_string(f.s) + " needs " +
           std::to_string(shared_bytes(f)) + " bytes of shared memory per block, over the " +
           std::to_string(kMaxSharedBytes) + " a CUDA kernel gets (use larger groups or smaller super-groups)";
  return "";
}

// ---- tables ----------------------------------------------------------------------

DeviceTables::DeviceTables(const DynamiqTables& tables, void* stream) : stream_(stream) {
  const auto& img = tables.image();
  // On the kernels' stream (ordered before them), not waited for: the host
  // image lives as long as the codec that owns these tables (the host codec
  // of a CudaCodec), and a copy from pageable memory has read it when it returns.
  const auto st = static_cast<cudaStream_t>(stream_);
  image_ = static_cast<uint8_t*>(device_alloc(img.size(), st));
  if (cudaMemcpyAsync(image_, img.data(), img.size(), cudaMemcpyHostToDevice, st) != cudaSuccess) {
    device_free(image_, st);
    throw Error("dynamiq cuda: cannot upload the level tables");
  }
  view_ = tables.rebased(image_);
}

DeviceTables::~DeviceTables() {
  const auto st = static_cast<cudaStream_t>(stream_);
  device_free(image_, st);
  for (auto& kv : columns_) device_free(kv.second, st);
}

DqRounding DeviceTables::rounding(const RngCtx& rng) {
  DqRounding rd = make_dynamiq_rounding(rng);  // host column
  if (rd.correlated && rd.perm.column) {
    const auto key = std::make_pair(int(rd.perm.n), int(rd.perm.rank));
    int32_t*& dev = columns_[key];
    if (!dev) {
      const size_t bytes = size_t(rd.perm.nfact) * sizeof(int32_t);
      const auto st = static_cast<cudaStream_t>(stream_);
      dev = static_cast<int32_t*>(device_alloc(bytes, st));
      // not waited for: ordered before the kernels (pageable source, read at the call)
      if (cudaMemcpyAsync(dev, rd.perm.column, bytes, cudaMemcpyHostToDevice, st) != cudaSuccess) {
        device_free(dev, st);
        dev = nullptr;
        throw Error("dynamiq cuda: cannot upload the permutation table");
      }
    }
    rd.perm.column = dev;
  }
  return rd;
}

// ---- launchers -------------------------------------------------------------------

int stats(const void* data, DType dtype, int64_t numel, int32_t S, float* out, uint32_t* nonfinite,
          void* stream) {
  if (numel <= 0) return 0;
  if (S < 1) return int(cudaErrorInvalidValue);
  const int64_t units = ceil_div<int64_t>(numel, S);
  const unsigned blocks = unsigned(ceil_div<int64_t>(units, kStatUnitsPerBlock));
  DQ_LAUNCH(stats_kernel, blocks, kStatLanes * kStatUnitsPerBlock, 0, static_cast<cudaStream_t>(stream))(
      data, dtype, numel, S, out, nonfinite);
  return int(cudaGetLastError());
}

int compress(const DynamiqParams& prm, const DqTables& tb, const DevicePlan& p, const DeviceLocal& x,
             int64_t w0, int64_t w1, const DqRounding& rd, uint8_t* out, void* stream) {
  return launch(prm, tb, p, x, w0, w1, rd, nullptr, out, nullptr, DeviceOutput(), kCompress, stream);
}

int decompress(const DynamiqParams& prm, const DqTables& tb, const DevicePlan& p, const uint8_t* in,
               int64_t w0, int64_t w1, const DeviceOutput& y, void* stream) {
  return launch(prm, tb, p, DeviceLocal(), w0, w1, DqRounding(), in, nullptr, nullptr, y, kDecompress,
                stream);
}

int decompress_accumulate(const DynamiqParams& prm, const DqTables& tb, const DevicePlan& p,
                          const uint8_t* in, const DeviceLocal& x, int64_t w0, int64_t w1,
                          float* acc, void* stream) {
  return launch(prm, tb, p, x, w0, w1, DqRounding(), in, nullptr, acc, DeviceOutput(), kDecAcc, stream);
}

int decompress_accumulate_recompress(const DynamiqParams& prm, const DqTables& tb,
                                     const DevicePlan& p, const uint8_t* in, const DeviceLocal& x,
                                     int64_t w0, int64_t w1, const DqRounding& rd, uint8_t* out,
                                     void* stream) {
  return launch(prm, tb, p, x, w0, w1, rd, in, out, nullptr, DeviceOutput(), kFused, stream);
}

}  // namespace cuda
}  // namespace dynamiq
