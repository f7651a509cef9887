// CUDA kernels of the lossless codec: thin loops over lossless_format.h.
// See lossless_cuda.h for the contract.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "kernels/lossless/lossless_cuda.h"
#include "kernels/lossless/lossless_validate.h"
#include "kernels/base/cuda/cuda_memory.h"
#include "kernels/base/cuda/launch.h"

namespace dynamiq {
namespace {

using namespace lossless;

void check(cudaError_t e, const char* what) { cuda::check(e, "lossless CUDA", what); }

constexpr int kThreads = 256;
unsigned blocks_for(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

// ---- kernels ---------------------------------------------------------------------

template <DType T>
__global__ void split_kernel(const typename Split<T>::word* v, int64_t G, uint8_t* sm, uint8_t* exps) {
  const int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g < G) split_group<T>(v, g, G, sm, exps);
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


__global__ void huff_bytes_kernel(const uint8_t* exps, int64_t body, int64_t S, const uint8_t* len,
                                  uint32_t* bytes) {
  const int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s >= S) return;
  bytes[s] = uint32_t((huff_segment_bits(exps + s * kSegment, segment_count(body, s), len) + 7) / 8);
}

// A segment whose stream would end past `limit` (the plan's bound on the
// streams: exceeding it is a bug the host reports) writes nothing.
__global__ void huff_encode_kernel(const uint8_t* exps, int64_t body, int64_t S, const uint16_t* code,
                                   const uint8_t* len, const uint32_t* start, uint64_t limit, uint8_t* meta,
                                   uint8_t* streams) {
  const int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s >= S || start[s + 1] > limit) return;
  const uint32_t b =
      huff_encode_segment(exps + s * kSegment, segment_count(body, s), code, len, streams + start[s]);
  store_u16(meta + 2 * s, uint16_t(b));
}


// ---- one-block scan; decode: parse, sections, merge (no host wait) -------------------

constexpr int kParseThreads = 256;  // the one block of the parse and of the encode's scan

// start[0..S) <- the exclusive prefix sums of value(0..S), start[S] <- their
// total (truncated to 32 bits; the total itself is returned to every
// thread). Every thread of a block of kParseThreads calls it (it holds
// barriers); part: kParseThreads + 1 shared counters.
template <class F>
__device__ unsigned long long block_scan(int64_t S, const F& value, uint32_t* start, unsigned long long* part) {
  const int tid = int(threadIdx.x);
  const int64_t chunk = (S + kParseThreads - 1) / kParseThreads;
  const int64_t s0 = chunk * tid < S ? chunk * tid : S, s1 = s0 + chunk < S ? s0 + chunk : S;
  unsigned long long sum = 0;
  for (int64_t s = s0; s < s1; ++s) sum += value(s);
  part[tid] = sum;
  __syncthreads();
  if (tid == 0) {
    unsigned long long run = 0;
    for (int i = 0; i < kParseThreads; ++i) {
      const unsigned long long v = part[i];
      part[i] = run;
      run += v;
    }
    part[kParseThreads] = run;
    start[S] = uint32_t(run);
  }
  __syncthreads();
  unsigned long long pos = part[tid];
  for (int64_t s = s0; s < s1; ++s) {
    start[s] = uint32_t(pos);
    pos += value(s);
  }
  const unsigned long long total = part[kParseThreads];
  __syncthreads();  // part is free again
  return total;
}

// One block: the header and the tables (thread 0, lossless_validate.h), the
// per-segment sizes scanned into seg_start by every thread, the Huffman decode
// start[0..S] <- the exclusive prefix sums of sizes[0..S) and their total. One block.
__global__ void scan_kernel(const uint32_t* sizes, int64_t S, uint32_t* start) {
  __shared__ unsigned long long part[kParseThreads + 1];
  block_scan(S, [&](int64_t s) -> uint32_t { return sizes[s]; }, start, part);
}

// table built in parallel. Writes *P, whose fault says whether it parsed.
__global__ void parse_kernel(DType dtype, const uint8_t* msg, uint64_t in_bytes, int64_t n,
                             LosslessDevicePlan* P, uint32_t* seg_start, uint16_t* table) {
  __shared__ Fault f;
  __shared__ Tables t;
  __shared__ uint8_t format;
  __shared__ unsigned long long part[kParseThreads + 1];
  __shared__ int counts_bad;
  __shared__ uint16_t rc[256];
  const int tid = int(threadIdx.x);
  const Layout L = make_layout(dtype, n);
  const int64_t S = L.segments;
  const uint8_t* sec = msg + L.static_bytes;
  if (tid == 0) {
    Header h{};
    f = Fault{};
    t = Tables{};
    counts_bad = 0;
    format = 0;
    if (in_bytes < uint64_t(L.static_bytes)) f = fault(FaultKind::kTruncated, int64_t(in_bytes), L.static_bytes);
    if (f.kind == FaultKind::kNone) f = check_header(msg, dtype, L, h);
    if (f.kind == FaultKind::kNone && in_bytes != uint64_t(L.static_bytes) + h.dynamic_bytes)
      f = fault(FaultKind::kSize, int64_t(in_bytes), L.static_bytes + int64_t(h.dynamic_bytes));
    if (f.kind == FaultKind::kNone) {
      format = h.format;
      f = check_tables(ExpFormat(h.format), sec, h.dynamic_bytes, dtype, L, t);
    }
  }
  __syncthreads();
  const ExpFormat fmt = ExpFormat(format);
  const bool scan = f.kind == FaultKind::kNone && (fmt == ExpFormat::kZip || fmt == ExpFormat::kHuffman);
  if (scan) {  // uniform: every thread reads the same shared values
    const uint8_t* meta = sec + t.meta_offset;
    const bool zip = fmt == ExpFormat::kZip;
    const unsigned long long total = block_scan(
        S,
        [&](int64_t s) -> uint32_t {
          const uint32_t c = load_u16(meta + 2 * s);
          if (zip && !zip_count_ok(c, L.body, s)) counts_bad = 1;
          return c;
        },
        seg_start, part);
    if (tid == 0) {
      // (seg_start is read only if this passes: a refused total may have wrapped it)
      f = counts_bad ? fault(FaultKind::kZipCount) : check_segment_total(fmt, total, t.payload_bytes);
      if (f.kind == FaultKind::kNone && !zip) huff_reversed_codes(t.k, t.len, rc);
    }
    __syncthreads();
    if (f.kind == FaultKind::kNone && !zip) {
      for (int i = tid; i < kDecodeTableSize; i += kParseThreads) table[i] = 0;
      __syncthreads();
      for (int i = tid; i < t.k; i += kParseThreads) huff_fill_entries(sec[1 + i], rc[i], t.len[i], table);
    }
  }
  if (tid == 0) {
    LosslessDevicePlan p;
    p.fault = f;
    p.fault.dtype = int32_t(dtype);
    p.format = format;
    p.constant = t.constant;
    for (int i = 0; i < 8; ++i) p.zip_table[i] = t.zip_table[i];
    p.planes_offset = t.planes_offset;
    p.payload_offset = t.payload_offset;
    p.payload_bytes = t.payload_bytes;
    *P = p;
  }
}

// The body exponents of a parsed message's section: thread i decodes group i
// (plain, const) or segment i (zip, Huffman). Nothing if the parse refused it.
__global__ void section_kernel(DType dtype, LosslessDevicePlan* P, const uint8_t* sec, int64_t body,
                               int64_t G, int64_t S, const uint32_t* start, const uint16_t* table_g,
                               uint8_t* exps) {
  __shared__ uint16_t table[kDecodeTableSize];
  if (P->fault.kind != FaultKind::kNone) return;  // uniform
  const ExpFormat fmt = ExpFormat(P->format);
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  switch (fmt) {
    case ExpFormat::kPlain:  // bf16, float32: the section is the exponents (the merge reads it)
      if (i < G && dtype == DType::kF16) plain5_decode_group(sec, i, G, exps);
      return;
    case ExpFormat::kConst:
      if (i < G) store_u64(exps + 8 * i, 0x0101010101010101ull * P->constant);
      return;
    case ExpFormat::kZip: {
      if (i >= S) return;
      const uint8_t* planes = sec + P->planes_offset;
      const uint8_t* esc = sec + P->payload_offset;
      const int64_t g0 = i * (kSegment / kGroup);
      const int64_t g1 = g0 + kSegment / kGroup < G ? g0 + kSegment / kGroup : G;
      uint32_t pos = start[i];
      const uint32_t end = start[i + 1];
      bool ok = true;
      for (int64_t g = g0; g < g1; ++g) ok &= zip_decode_group(planes, g, G, P->zip_table, esc, &pos, end, exps);
      if (!ok || pos != end) atomicExch(&P->codes_bad, 1);
      return;
    }
    case ExpFormat::kHuffman: {
      if (int64_t(blockIdx.x) * blockDim.x >= S) return;  // uniform: a block past the segments
      for (int j = threadIdx.x; j < kDecodeTableSize; j += blockDim.x) table[j] = table_g[j];
      __syncthreads();
      if (i >= S) return;
      const uint8_t* streams = sec + P->payload_offset;
      const uint32_t b = start[i];
      if (!huff_decode_segment(streams + b, start[i + 1] - b, uint64_t(P->payload_bytes) - b,
                               segment_count(body, i), table, exps + i * kSegment))
        atomicExch(&P->codes_bad, 1);
      return;
    }
  }
}

// values <- the SM planes and tail merged with the exponents; if the message
// was refused, nothing, and thread 0 records the refusal in *first (if empty).
template <DType T>
__global__ void merge_kernel(LosslessDevicePlan* P, const uint8_t* msg, int64_t static_bytes, const uint8_t* exps,
                             int64_t G, int64_t tail, int64_t tail_offset, typename Split<T>::word* v,
                             Fault* first) {
  using W = typename Split<T>::word;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  Fault f = P->fault;
  if (f.kind == FaultKind::kNone && P->codes_bad) {
    const int32_t dt = f.dtype;
    f = fault(FaultKind::kCodes);
    f.dtype = dt;
  }
  if (f.kind != FaultKind::kNone) {
    if (i == 0 && atomicCAS(reinterpret_cast<int32_t*>(&first->kind), 0, int32_t(f.kind)) == 0) {
      first->dtype = f.dtype;
      first->a = f.a;
      first->b = f.b;
    }
    return;
  }
  // a plain bf16 / float32 section holds the exponents as they are: read in place
  const uint8_t* e = T != DType::kF16 && P->format == uint8_t(ExpFormat::kPlain) ? msg + static_bytes : exps;
  if (i < G) merge_group<T>(msg + kHeaderBytes, e, i, G, v);
  if (i < tail) {
    W w;
    memcpy(&w, msg + tail_offset + i * int64_t(sizeof(W)), sizeof(W));
    v[8 * G + i] = w;
  }
}

// The total start[S] the scan wrote: the host's wait for the section's size.
uint32_t read_total(const LosslessEncodeScratch& sc, int64_t S, cudaStream_t stream) {
  uint32_t local = 0;
  uint32_t* host = sc.total ? sc.total : &local;
  check(cudaMemcpyAsync(host, sc.start + S, sizeof(uint32_t), cudaMemcpyDeviceToHost, stream), "section size");
  check(cudaStreamSynchronize(stream), "section size");
  return *host;
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
                                    uint8_t* msg, const LosslessEncodeScratch& sc, cudaStream_t stream) {
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
      uint8_t* code_of = sc.tables;
      check(cudaMemcpyAsync(code_of, p.zip_code_of, 256, cudaMemcpyHostToDevice, stream), "zip codes");
      DQ_LAUNCH(zip_count_kernel, blocks_for(S), kThreads, 0, stream)(exps, L.body, S, code_of, sc.sizes);
      check(cudaGetLastError(), "zip count kernel");
      DQ_LAUNCH(scan_kernel, 1, kParseThreads, 0, stream)(sc.sizes, S, sc.start);
      check(cudaGetLastError(), "scan kernel");
      uint8_t* meta = sec + kZipTableBytes;
      uint8_t* planes = meta + 2 * S;
      uint8_t* esc = planes + 3 * G;
      check(cudaMemcpyAsync(sec, p.prefix, kZipTableBytes, cudaMemcpyHostToDevice, stream), "zip table");
      DQ_LAUNCH(zip_encode_kernel, blocks_for(S), kThreads, 0, stream)(exps, G, S, code_of, sc.start, meta, planes,
                                                                        esc);
      check(cudaGetLastError(), "zip encode kernel");
      return size_t(kZipTableBytes + 2 * S + 3 * G + int64_t(read_total(sc, S, stream)));
    }
    case ExpFormat::kHuffman: {
      uint8_t* len = sc.tables + 256;
      auto* code = reinterpret_cast<uint16_t*>(sc.tables + 512);
      check(cudaMemcpyAsync(code, p.huff_code, 256 * sizeof(uint16_t), cudaMemcpyHostToDevice, stream), "codes");
      check(cudaMemcpyAsync(len, p.huff_len, 256, cudaMemcpyHostToDevice, stream), "code lengths");
      DQ_LAUNCH(huff_bytes_kernel, blocks_for(S), kThreads, 0, stream)(exps, L.body, S, len, sc.sizes);
      check(cudaGetLastError(), "huffman size kernel");
      DQ_LAUNCH(scan_kernel, 1, kParseThreads, 0, stream)(sc.sizes, S, sc.start);
      check(cudaGetLastError(), "scan kernel");
      check(cudaMemcpyAsync(sec, p.prefix, size_t(p.prefix_bytes), cudaMemcpyHostToDevice, stream), "huffman table");
      uint8_t* meta = sec + p.prefix_bytes;
      const int64_t limit = p.section_bytes - p.prefix_bytes - 2 * S;
      DQ_LAUNCH(huff_encode_kernel, blocks_for(S), kThreads, 0, stream)(exps, L.body, S, code, len, sc.start,
                                                                         uint64_t(limit > 0 ? limit : 0), meta,
                                                                         meta + 2 * S);
      check(cudaGetLastError(), "huffman encode kernel");
      const int64_t size = p.prefix_bytes + 2 * S + int64_t(read_total(sc, S, stream));
      if (size > p.section_bytes) throw Error("lossless CUDA: Huffman section exceeded its bound (bug)");
      return size_t(size);
    }
  }
  throw Error("lossless CUDA: unknown format");
}

size_t lossless_encode_section_cuda(DType dtype, const LosslessEncodePlan& p, const uint8_t* exps,
                                    uint8_t* msg, cudaStream_t stream) {
  const int64_t S = p.layout.segments;
  cuda::DeviceArray<uint8_t> tables(1024, stream);
  cuda::DeviceArray<uint32_t> sizes{static_cast<size_t>(S) + 1, stream}, start{static_cast<size_t>(S) + 1, stream};
  LosslessEncodeScratch sc;
  sc.tables = tables.p;
  sc.sizes = sizes.p;
  sc.start = start.p;
  return lossless_encode_section_cuda(dtype, p, exps, msg, sc, stream);
}

void lossless_decode_cuda(DType dtype, const uint8_t* msg, size_t in_bytes, int64_t n, void* values,
                          const LosslessDecodeScratch& sc, cudaStream_t stream) {
  const Layout L = make_layout(dtype, n);
  DQ_LAUNCH(parse_kernel, 1, kParseThreads, 0, stream)(dtype, msg, uint64_t(in_bytes), n, sc.plan, sc.seg_start,
                                                        sc.table);
  check(cudaGetLastError(), "parse kernel");
  if (L.groups) {
    DQ_LAUNCH(section_kernel, blocks_for(L.groups), kThreads, 0, stream)(dtype, sc.plan, msg + L.static_bytes, L.body,
                                                                         L.groups, L.segments, sc.seg_start, sc.table,
                                                                         sc.exps);
    check(cudaGetLastError(), "section kernel");
  }
  const int64_t threads = L.groups > L.tail ? L.groups : (L.tail > 0 ? L.tail : 1);
  DQ_DISPATCH_DTYPE(dtype, T, [&] {
    using W = typename Split<T>::word;
    DQ_LAUNCH(merge_kernel<T>, blocks_for(threads), kThreads, 0, stream)(
        sc.plan, msg, L.static_bytes, sc.exps, L.groups, L.tail, L.tail_offset, static_cast<W*>(values), sc.fault);
    check(cudaGetLastError(), "merge kernel");
  });
}

}  // namespace dynamiq
