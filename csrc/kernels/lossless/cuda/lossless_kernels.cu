// CUDA kernels of the lossless codec: thin loops over lossless_format.h.
// See lossless_cuda.h for the contract.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "kernels/lossless/lossless_cuda.h"
#include "kernels/base/cuda/cuda_memory.h"
#include "kernels/base/cuda/launch.h"

namespace dynamiq {
namespace {

using namespace lossless;

void check(cudaError_t e, const char* what) { cuda::check(e, "lossless CUDA", what); }

constexpr int kThreads = 256;
unsigned blocks_for(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

struct ZipTable {
  uint8_t t[8];
};

// ---- kernels ---------------------------------------------------------------------

template <DType T>
__global__ void split_kernel(const typename Split<T>::word* v, int64_t G, uint8_t* sm, uint8_t* exps) {
  const int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g < G) split_group<T>(v, g, G, sm, exps);
}

template <DType T>
__global__ void merge_kernel(const uint8_t* sm, const uint8_t* exps, int64_t G, typename Split<T>::word* v) {
  const int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g < G) merge_group<T>(sm, exps, g, G, v);
}

__global__ void histogram_kernel(const uint8_t* exps, int64_t m, unsigned long long* hist) {
  __shared__ unsigned int h[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) h[i] = 0;
  __syncthreads();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < m; i += int64_t(gridDim.x) * blockDim.x)
    atomicAdd(&h[exps[i]], 1u);
  __syncthreads();
  for (int i = threadIdx.x; i < 256; i += blockDim.x)
    if (h[i]) atomicAdd(&hist[i], (unsigned long long)h[i]);
}

__global__ void plain5_encode_kernel(const uint8_t* exps, int64_t G, uint8_t* planes) {
  const int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g < G) plain5_encode_group(exps, g, G, planes);
}

__global__ void plain5_decode_kernel(const uint8_t* planes, int64_t G, uint8_t* exps) {
  const int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g < G) plain5_decode_group(planes, g, G, exps);
}

// Escapes per segment (code 0 under code_of).
__global__ void zip_count_kernel(const uint8_t* exps, int64_t body, int64_t S, const uint8_t* code_of,
                                 uint32_t* counts) {
  const int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s >= S) return;
  const int cnt = segment_count(body, s);
  uint32_t c = 0;
  for (int i = 0; i < cnt; ++i) c += code_of[exps[s * kSegment + i]] == 0;
  counts[s] = c;
}

__global__ void zip_encode_kernel(const uint8_t* exps, int64_t G, int64_t S, const uint8_t* code_of,
                                  const uint32_t* start, uint8_t* meta, uint8_t* planes, uint8_t* esc) {
  const int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s >= S) return;
  const int64_t g0 = s * (kSegment / kGroup);
  const int64_t g1 = g0 + kSegment / kGroup < G ? g0 + kSegment / kGroup : G;
  uint32_t pos = start[s];
  for (int64_t g = g0; g < g1; ++g) zip_encode_group(exps, g, G, code_of, planes, esc, &pos);
  store_u16(meta + 2 * s, uint16_t(pos - start[s]));
}

__global__ void zip_decode_kernel(const uint8_t* planes, const uint8_t* esc, int64_t G, int64_t S,
                                  ZipTable table, const uint32_t* start, uint8_t* exps, int* error) {
  const int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s >= S) return;
  const int64_t g0 = s * (kSegment / kGroup);
  const int64_t g1 = g0 + kSegment / kGroup < G ? g0 + kSegment / kGroup : G;
  uint32_t pos = start[s];
  const uint32_t end = start[s + 1];
  bool ok = true;
  for (int64_t g = g0; g < g1; ++g) ok &= zip_decode_group(planes, g, G, table.t, esc, &pos, end, exps);
  if (!ok || pos != end) atomicExch(error, 1);
}

__global__ void huff_bytes_kernel(const uint8_t* exps, int64_t body, int64_t S, const uint8_t* len,
                                  uint32_t* bytes) {
  const int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s >= S) return;
  bytes[s] = uint32_t((huff_segment_bits(exps + s * kSegment, segment_count(body, s), len) + 7) / 8);
}

__global__ void huff_encode_kernel(const uint8_t* exps, int64_t body, int64_t S, const uint16_t* code,
                                   const uint8_t* len, const uint32_t* start, uint8_t* meta,
                                   uint8_t* streams) {
  const int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s >= S) return;
  const uint32_t b =
      huff_encode_segment(exps + s * kSegment, segment_count(body, s), code, len, streams + start[s]);
  store_u16(meta + 2 * s, uint16_t(b));
}

__global__ void huff_decode_kernel(const uint8_t* streams, uint64_t total, int64_t body, int64_t S,
                                   const uint16_t* table_g, const uint32_t* start, uint8_t* exps,
                                   int* error) {
  __shared__ uint16_t table[kDecodeTableSize];
  for (int i = threadIdx.x; i < kDecodeTableSize; i += blockDim.x) table[i] = table_g[i];
  __syncthreads();
  const int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s >= S) return;
  const uint32_t b = start[s];
  if (!huff_decode_segment(streams + b, start[s + 1] - b, total - b, segment_count(body, s), table,
                           exps + s * kSegment))
    atomicExch(error, 1);
}

template <typename T>
void upload(cuda::DeviceArray<T>& d, const T* h, size_t n, cudaStream_t stream) {
  if (n) check(cudaMemcpyAsync(d.p, h, n * sizeof(T), cudaMemcpyHostToDevice, stream), "upload");
}

std::vector<uint32_t> exclusive_scan(const std::vector<uint32_t>& v) {
  std::vector<uint32_t> out(v.size() + 1, 0);
  for (size_t i = 0; i < v.size(); ++i) out[i + 1] = out[i] + v[i];
  return out;
}

}  // namespace

void lossless_split_cuda(DType dtype, const void* values, int64_t n, uint8_t* msg, uint8_t* exps,
                         cudaStream_t stream) {
  const Layout L = make_layout(dtype, n);
  DQ_DISPATCH_DTYPE(dtype, T, [&] {
    using W = typename Split<T>::word;
    const W* v = static_cast<const W*>(values);
    if (L.groups) DQ_LAUNCH(split_kernel<T>, blocks_for(L.groups), kThreads, 0, stream)(v, L.groups, msg + kHeaderBytes, exps);
    check(cudaGetLastError(), "split kernel");
    if (L.tail)
      check(cudaMemcpyAsync(msg + L.tail_offset, v + L.body, size_t(L.tail) * sizeof(W),
                            cudaMemcpyDeviceToDevice, stream),
            "tail copy");
  });
}

void lossless_histogram_cuda(const uint8_t* exps, int64_t m, unsigned long long* hist, cudaStream_t stream) {
  check(cudaMemsetAsync(hist, 0, 256 * sizeof(unsigned long long), stream), "histogram memset");
  if (m == 0) return;
  const unsigned grid = blocks_for(m) < 1024 ? blocks_for(m) : 1024;
  DQ_LAUNCH(histogram_kernel, grid, kThreads, 0, stream)(exps, m, hist);
  check(cudaGetLastError(), "histogram kernel");
}

size_t lossless_encode_section_cuda(DType dtype, const LosslessEncodePlan& p, const uint8_t* exps,
                                    uint8_t* msg, cudaStream_t stream) {
  const Layout& L = p.layout;
  uint8_t* sec = msg + L.static_bytes;
  const int64_t S = L.segments, G = L.groups;
  switch (p.format) {
    case ExpFormat::kPlain:
      if (dtype == DType::kF16) {
        if (G) DQ_LAUNCH(plain5_encode_kernel, blocks_for(G), kThreads, 0, stream)(exps, G, sec);
        check(cudaGetLastError(), "plain5 kernel");
      } else if (L.body) {
        check(cudaMemcpyAsync(sec, exps, size_t(L.body), cudaMemcpyDeviceToDevice, stream), "plain copy");
      }
      return size_t(L.plain_bytes);
    case ExpFormat::kConst:
      check(cudaMemsetAsync(sec, p.syms[0], 1, stream), "const section");
      return 1;
    case ExpFormat::kZip: {
      cuda::DeviceArray<uint8_t> code_of(256, stream);
      cuda::DeviceArray<uint32_t> counts{static_cast<size_t>(S), stream}, start{static_cast<size_t>(S) + 1, stream};
      upload(code_of, p.zip_code_of, 256, stream);
      DQ_LAUNCH(zip_count_kernel, blocks_for(S), kThreads, 0, stream)(exps, L.body, S, code_of.p, counts.p);
      check(cudaGetLastError(), "zip count kernel");
      std::vector<uint32_t> h(static_cast<size_t>(S));
      check(cudaMemcpyAsync(h.data(), counts.p, size_t(S) * 4, cudaMemcpyDeviceToHost, stream), "zip counts");
      check(cudaStreamSynchronize(stream), "zip counts");
      const std::vector<uint32_t> st = exclusive_scan(h);
      upload(start, st.data(), st.size(), stream);
      uint8_t* meta = sec + kZipTableBytes;
      uint8_t* planes = meta + 2 * S;
      uint8_t* esc = planes + 3 * G;
      check(cudaMemcpyAsync(sec, p.prefix, kZipTableBytes, cudaMemcpyHostToDevice, stream), "zip table");
      DQ_LAUNCH(zip_encode_kernel, blocks_for(S), kThreads, 0, stream)(exps, G, S, code_of.p, start.p, meta, planes, esc);
      check(cudaGetLastError(), "zip encode kernel");
      return size_t(kZipTableBytes + 2 * S + 3 * G + int64_t(st.back()));
    }
    case ExpFormat::kHuffman: {
      cuda::DeviceArray<uint16_t> code(256, stream);
      cuda::DeviceArray<uint8_t> len(256, stream);
      cuda::DeviceArray<uint32_t> bytes{static_cast<size_t>(S), stream}, start{static_cast<size_t>(S) + 1, stream};
      upload(code, p.huff_code, 256, stream);
      upload(len, p.huff_len, 256, stream);
      DQ_LAUNCH(huff_bytes_kernel, blocks_for(S), kThreads, 0, stream)(exps, L.body, S, len.p, bytes.p);
      check(cudaGetLastError(), "huffman size kernel");
      std::vector<uint32_t> h(static_cast<size_t>(S));
      check(cudaMemcpyAsync(h.data(), bytes.p, size_t(S) * 4, cudaMemcpyDeviceToHost, stream), "huffman sizes");
      check(cudaStreamSynchronize(stream), "huffman sizes");
      const std::vector<uint32_t> st = exclusive_scan(h);
      const int64_t size = p.prefix_bytes + 2 * S + int64_t(st.back());
      if (size > p.section_bytes) throw Error("lossless CUDA: Huffman section exceeded its bound (bug)");
      upload(start, st.data(), st.size(), stream);
      check(cudaMemcpyAsync(sec, p.prefix, size_t(p.prefix_bytes), cudaMemcpyHostToDevice, stream), "huffman table");
      uint8_t* meta = sec + p.prefix_bytes;
      DQ_LAUNCH(huff_encode_kernel, blocks_for(S), kThreads, 0, stream)(exps, L.body, S, code.p, len.p, start.p, meta,
                                                                meta + 2 * S);
      check(cudaGetLastError(), "huffman encode kernel");
      return size_t(size);
    }
  }
  throw Error("lossless CUDA: unknown format");
}

void lossless_decode_section_cuda(DType dtype, const LosslessDecodePlan& P, const uint8_t* msg,
                                  uint8_t* exps, cudaStream_t stream) {
  const Layout& L = P.layout;
  const uint8_t* sec = msg + L.static_bytes;
  const int64_t S = L.segments, G = L.groups;
  cuda::DeviceArray<int> error(1, stream);
  check(cudaMemsetAsync(error.p, 0, sizeof(int), stream), "error flag");
  switch (P.format) {
    case ExpFormat::kPlain:
      if (dtype == DType::kF16) {
        if (G) DQ_LAUNCH(plain5_decode_kernel, blocks_for(G), kThreads, 0, stream)(sec, G, exps);
        check(cudaGetLastError(), "plain5 kernel");
      } else if (L.body) {
        check(cudaMemcpyAsync(exps, sec, size_t(L.body), cudaMemcpyDeviceToDevice, stream), "plain copy");
      }
      break;
    case ExpFormat::kConst:
      if (L.body) check(cudaMemsetAsync(exps, P.constant, size_t(L.body), stream), "const fill");
      break;
    case ExpFormat::kZip: {
      cuda::DeviceArray<uint32_t> start(P.seg_start.size(), stream);
      upload(start, P.seg_start.data(), P.seg_start.size(), stream);
      ZipTable t;
      for (int i = 0; i < 8; ++i) t.t[i] = P.zip_table[i];
      DQ_LAUNCH(zip_decode_kernel, blocks_for(S), kThreads, 0, stream)(sec + P.planes_offset, sec + P.payload_offset, G,
                                                               S, t, start.p, exps, error.p);
      check(cudaGetLastError(), "zip decode kernel");
      break;
    }
    case ExpFormat::kHuffman: {
      cuda::DeviceArray<uint32_t> start(P.seg_start.size(), stream);
      cuda::DeviceArray<uint16_t> table(P.huff_table.size(), stream);
      upload(start, P.seg_start.data(), P.seg_start.size(), stream);
      upload(table, P.huff_table.data(), P.huff_table.size(), stream);
      DQ_LAUNCH(huff_decode_kernel, blocks_for(S), kThreads, 0, stream)(sec + P.payload_offset, uint64_t(P.payload_bytes),
                                                                L.body, S, table.p, start.p, exps, error.p);
      check(cudaGetLastError(), "huffman decode kernel");
      break;
    }
  }
  int h = 0;
  check(cudaMemcpyAsync(&h, error.p, sizeof(int), cudaMemcpyDeviceToHost, stream), "error flag");
  check(cudaStreamSynchronize(stream), "decode section");
  if (h) throw MalformedMessage("lossless: invalid exponent codes in a segment (GPU decode)");
}

void lossless_merge_cuda(DType dtype, const uint8_t* msg, const uint8_t* exps, int64_t n, void* values,
                         cudaStream_t stream) {
  const Layout L = make_layout(dtype, n);
  DQ_DISPATCH_DTYPE(dtype, T, [&] {
    using W = typename Split<T>::word;
    W* v = static_cast<W*>(values);
    if (L.groups) DQ_LAUNCH(merge_kernel<T>, blocks_for(L.groups), kThreads, 0, stream)(msg + kHeaderBytes, exps, L.groups, v);
    check(cudaGetLastError(), "merge kernel");
    if (L.tail)
      check(cudaMemcpyAsync(v + L.body, msg + L.tail_offset, size_t(L.tail) * sizeof(W),
                            cudaMemcpyDeviceToDevice, stream),
            "tail copy");
  });
}

}  // namespace dynamiq
