#include "kernels/lossless/lossless_codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <mutex>

#include "kernels/base/parallel.h"

namespace dynamiq {

static_assert(std::endian::native == std::endian::little,
              "the lossless wire format is little-endian and read with memcpy");

using namespace lossless;

void lossless_check_count(int64_t n) {
  if (n < 0 || n > kMaxBlockValues)
    throw Error("lossless: a block of " + std::to_string(n) +
                " values does not fit the 32-bit count; lower block_bytes");
}

namespace {

[[noreturn]] void bad(const std::string& what) { throw MalformedMessage("lossless: " + what); }

// Segments per thread below which a call does not split (64 x 1024 values,
// about the DynamiQ and bitsplit codecs' 64K elements), and per run. Every
// segment's bytes are a function of its own exponents and of the block's
// plan, so any assignment of segments to threads gives the same message.
constexpr int64_t kMinSegmentsPerThread = 64;
constexpr int64_t kSegmentsPerRun = 16;
// The largest Huffman stream of a segment.
constexpr int64_t kMaxStreamBytes = kSegment * kMaxCodeLen / 8;

// Per-thread scratch (the executor runs one group's collectives on one thread).
// A call's threads share the caller's: bind a reference before parallel_units
// (a lambda naming a thread_local gets its own thread's).
struct Scratch {
  std::vector<uint8_t> exps, raw_in, raw_out;
  std::vector<uint8_t> spill;  // escapes / streams of segments not written in place
  LosslessEncodePlan enc;
  LosslessDecodePlan dec;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}
uint8_t* grow(std::vector<uint8_t>& v, size_t bytes) {
  if (v.size() < bytes + 8) v.resize(bytes + 8);  // +8: room for 8-byte group stores
  return v.data();
}

// ---- histogram -------------------------------------------------------------------

// Adds the counts of e[0, m) to out. Eight sub-histograms: exponents
// concentrate on a few values, and one table would serialise on the
// store-to-load latency of the same counter.
void histogram(const uint8_t* e, int64_t m, uint64_t* out /*256*/) {
  uint32_t h[8][256];
  std::memset(h, 0, sizeof(h));
  int64_t i = 0;
  for (; i + 8 <= m; i += 8) {
    const uint64_t x = load_u64(e + i);
    ++h[0][x & 0xff];
    ++h[1][(x >> 8) & 0xff];
    ++h[2][(x >> 16) & 0xff];
    ++h[3][(x >> 24) & 0xff];
    ++h[4][(x >> 32) & 0xff];
    ++h[5][(x >> 40) & 0xff];
    ++h[6][(x >> 48) & 0xff];
    ++h[7][x >> 56];
  }
  for (; i < m; ++i) ++h[0][e[i]];
  for (int s = 0; s < 256; ++s) {
    uint64_t t = 0;
    for (int k = 0; k < 8; ++k) t += h[k][s];
    out[s] += t;
  }
}

// ---- split: values -> SM planes + exponent bytes ----------------------------------
// Flat loops over the same element functions as split_group (so they vectorise);
// the tests check they agree with split_group byte for byte. Body values
// [i0, i1), i0 a multiple of kSegment; the tail is copied by the caller.

template <DType T>
void split_block(const typename Split<T>::word* v, const Layout& L, int64_t i0, int64_t i1,
                 uint8_t* msg, uint8_t* exps) {
  using S = Split<T>;
  const int64_t G = L.groups;
  uint8_t* sm = msg + kHeaderBytes;
  if constexpr (T == DType::kBF16) {
    for (int64_t i = i0; i < i1; ++i) {
      sm[i] = S::sm(v[i]);
      exps[i] = S::exponent(v[i]);
    }
  } else if constexpr (T == DType::kF16) {
    uint8_t hi[kSegment];  // hi3 of one segment, packed into planes below
    for (int64_t b = i0; b < i1; b += kSegment) {
      const int64_t c = std::min<int64_t>(kSegment, i1 - b);
      for (int64_t i = 0; i < c; ++i) {
        sm[b + i] = S::lo(v[b + i]);
        exps[b + i] = S::exponent(v[b + i]);
        hi[i] = S::hi3(v[b + i]);
      }
      for (int64_t g = 0; g < c / 8; ++g) {
        const uint64_t x = load_u64(hi + 8 * g);
        const int64_t gg = b / 8 + g;
        sm[8 * G + gg] = pack_plane(x, 0);
        sm[9 * G + gg] = pack_plane(x, 1);
        sm[10 * G + gg] = pack_plane(x, 2);
      }
    }
  } else {
    uint8_t* hi = sm + 16 * G;
    for (int64_t i = i0; i < i1; ++i) {
      store_u16(sm + 2 * i, S::lo16(v[i]));
      hi[i] = S::hi(v[i]);
      exps[i] = S::exponent(v[i]);
    }
  }
}

template <DType T>
void merge_block(const uint8_t* msg, const Layout& L, const uint8_t* exps, int64_t i0, int64_t i1,
                 typename Split<T>::word* v) {
  using S = Split<T>;
  const int64_t G = L.groups;
  const uint8_t* sm = msg + kHeaderBytes;
  if constexpr (T == DType::kBF16) {
    for (int64_t i = i0; i < i1; ++i) v[i] = S::merge(exps[i], sm[i]);
  } else if constexpr (T == DType::kF16) {
    uint8_t hi[kSegment];
    for (int64_t b = i0; b < i1; b += kSegment) {
      const int64_t c = std::min<int64_t>(kSegment, i1 - b);
      for (int64_t g = 0; g < c / 8; ++g) {
        const int64_t gg = b / 8 + g;
        const uint64_t x = unpack_plane(sm[8 * G + gg]) | (unpack_plane(sm[9 * G + gg]) << 1) |
                           (unpack_plane(sm[10 * G + gg]) << 2);
        store_u64(hi + 8 * g, x);
      }
      for (int64_t i = 0; i < c; ++i) v[b + i] = S::merge(exps[b + i], sm[b + i], hi[i]);
    }
  } else {
    const uint8_t* hi = sm + 16 * G;
    for (int64_t i = i0; i < i1; ++i) {
      v[i] = S::merge(exps[i], load_u16(sm + 2 * i), hi[i]);
    }
  }
}

// ---- exponent section encoders (CPU loops) ------------------------------------------
// By runs of segments [r0, r1). The plain section and the zip code planes
// have fixed offsets. A segment's zip escapes or Huffman stream start where
// the earlier segments' end: the run that starts at segment 0 (the only run
// on one thread) writes them in place at `direct`; any other run writes
// segment s's to spill + s * slot (slot: the most a segment can take), and
// gather_spilled moves them into place once the section's table holds every
// segment's size.


template <DType T>
void encode_plain(const uint8_t* exps, const Layout& L, int64_t r0, int64_t r1, uint8_t* sec) {
  if constexpr (T == DType::kF16) {
    const int64_t g1 = std::min<int64_t>(L.groups, r1 * (kSegment / kGroup));
    for (int64_t g = r0 * (kSegment / kGroup); g < g1; ++g) plain5_encode_group(exps, g, L.groups, sec);
  } else {
    const int64_t i0 = r0 * kSegment;
    std::memcpy(sec + i0, exps + i0, size_t(std::min(L.body, r1 * kSegment) - i0));
  }
}

void encode_zip(const uint8_t* exps, const LosslessEncodePlan& p, int64_t r0, int64_t r1, uint8_t* sec,
                uint8_t* direct, uint8_t* spill) {
  const Layout& L = p.layout;
  uint8_t* meta = sec + kZipTableBytes;
  uint8_t* planes = meta + 2 * L.segments;
  const int64_t G = L.groups;
  for (int64_t s = r0; s < r1; ++s) {
    uint8_t* esc = direct ? direct : spill + s * kSegment;
    uint32_t n_esc = 0;
    const int64_t g0 = s * (kSegment / kGroup);
    const int64_t g1 = std::min<int64_t>(G, g0 + kSegment / kGroup);
    for (int64_t g = g0; g < g1; ++g) zip_encode_group(exps, g, G, p.zip_code_of, planes, esc, &n_esc);
    store_u16(meta + 2 * s, uint16_t(n_esc));
    if (direct) direct += n_esc;
  }
}

// enc[e] = code | length << 16: one load per symbol.
void encode_huffman(const uint8_t* exps, const LosslessEncodePlan& p, const uint32_t* enc, int64_t r0,
                    int64_t r1, uint8_t* sec, uint8_t* direct, uint8_t* spill) {
  const Layout& L = p.layout;
  uint8_t* meta = sec + p.prefix_bytes;
  // Two segments at a time: two independent bit writers (four spill registers).
  // Each writes to a private buffer with slack, then is copied into place
  // (or its spill slot).
  constexpr int kLanes = 2;
  constexpr int kLaneBytes = kMaxStreamBytes + 16;
  alignas(64) uint8_t buf[kLanes][kLaneBytes];
  for (int64_t s0 = r0; s0 < r1; s0 += kLanes) {
    const int lanes = int(std::min<int64_t>(kLanes, r1 - s0));
    HuffWriter w[kLanes];
    const uint8_t* sy[kLanes];
    int cnt[kLanes];
    int cmin = kSegment;
    for (int l = 0; l < lanes; ++l) {
      sy[l] = exps + (s0 + l) * kSegment;
      cnt[l] = segment_count(L.body, s0 + l);
      cmin = std::min(cmin, cnt[l]);
    }
    int i = 0;
    if (lanes == kLanes) {
      for (; i + 4 <= cmin; i += 4)
        for (int l = 0; l < kLanes; ++l) {
          for (int j = 0; j < 4; ++j) {
            const uint32_t e = enc[sy[l][i + j]];
            huff_put(w[l], e & 0xffffu, int(e >> 16));
          }
          huff_flush_slack(w[l], buf[l]);
        }
    }
    for (int l = 0; l < lanes; ++l) {
      for (int j = i; j < cnt[l]; ++j) {
        const uint32_t e = enc[sy[l][j]];
        huff_put(w[l], e & 0xffffu, int(e >> 16));
        huff_flush_slack(w[l], buf[l]);
      }
      const uint32_t b = huff_finish(w[l], buf[l]);
      std::memcpy(direct ? direct : spill + (s0 + l) * kMaxStreamBytes, buf[l], b);
      store_u16(meta + 2 * (s0 + l), uint16_t(b));
      if (direct) direct += b;
    }
  }
}

// Moves the escapes or streams of segments [s1, S) from their spill slots to
// their places after those of segments [0, s1); returns the bytes of all.
int64_t gather_spilled(const uint8_t* meta, int64_t s1, int64_t S, const uint8_t* spill, int64_t slot,
                       uint8_t* payload) {
  int64_t pos = 0;
  for (int64_t s = 0; s < S; ++s) {
    const uint16_t b = load_u16(meta + 2 * s);
    if (s >= s1) std::memcpy(payload + pos, spill + s * slot, b);
    pos += b;
  }
  return pos;
}

template <DType T>
size_t encode_impl(const typename Split<T>::word* v, int64_t n, uint8_t* out,
                   const LosslessOptions& opt, LosslessBlockInfo* info) {
  const Layout L = make_layout(T, n);
  const int64_t m = L.body, S = L.segments;
  Scratch& sc = scratch();
  uint8_t* exps = grow(sc.exps, size_t(m));
  // Split and count by runs of segments; the parts' counts are summed (any order).
  uint64_t hist[256] = {};
  std::mutex mu;
  parallel_units(0, S, kMinSegmentsPerThread, kSegmentsPerRun, [&](UnitRuns& runs) {
    uint64_t h[256] = {};
    for (int64_t r0, r1; runs.next(r0, r1);) {
      const int64_t i0 = r0 * kSegment, i1 = std::min(m, r1 * kSegment);
      split_block<T>(v, L, i0, i1, out, exps);
      histogram(exps + i0, i1 - i0, h);
    }
    std::lock_guard<std::mutex> lk(mu);
    for (int e = 0; e < 256; ++e) hist[e] += h[e];
  });
  if (L.tail) std::memcpy(out + L.tail_offset, v + m, size_t(L.tail) * sizeof(typename Split<T>::word));
  LosslessEncodePlan& p = sc.enc;
  lossless_plan_encode(T, n, hist, opt, p);

  uint8_t* sec = out + L.static_bytes;
  int64_t dyn = p.section_bytes;  // exact, except Huffman: below
  if (p.format == ExpFormat::kConst) {
    sec[0] = p.syms[0];
  } else {
    const bool zip = p.format == ExpFormat::kZip, huff = p.format == ExpFormat::kHuffman;
    std::memcpy(sec, p.prefix, size_t(p.prefix_bytes));
    uint8_t* meta = sec + p.prefix_bytes;
    uint8_t* payload = meta + 2 * S + (zip ? 3 * L.groups : 0);
    const int64_t slot = huff ? kMaxStreamBytes : kSegment;
    uint8_t* spill = zip || huff ? grow(sc.spill, size_t(S * slot)) : nullptr;
    uint32_t enc[256];
    if (huff)
      for (int i = 0; i < 256; ++i) enc[i] = p.huff_code[i] | (uint32_t(p.huff_len[i]) << 16);
    int64_t in_place = 0;  // segments [0, in_place) wrote their escapes or streams in place
    parallel_units(0, S, kMinSegmentsPerThread, kSegmentsPerRun, [&](UnitRuns& runs) {
      for (int64_t r0, r1; runs.next(r0, r1);) {
        uint8_t* direct = nullptr;
        if (r0 == 0) direct = payload, in_place = r1;
        if (zip) encode_zip(exps, p, r0, r1, sec, direct, spill);
        else if (huff) encode_huffman(exps, p, enc, r0, r1, sec, direct, spill);
        else encode_plain<T>(exps, L, r0, r1, sec);
      }
    });
    if (zip || huff) {
      const int64_t bytes = gather_spilled(meta, in_place, S, spill, slot, payload);
      if (huff) {
        dyn = payload - sec + bytes;
        if (dyn > p.section_bytes) throw Error("lossless: Huffman section exceeded its bound (bug)");
      }
    }
  }
  lossless_write_header(out, T, n, p.format, uint32_t(dyn));

  if (info) {
    info->format = p.format;
    info->count = n;
    info->body = m;
    info->static_bytes = L.static_bytes;
    info->dynamic_bytes = dyn;
    info->distinct = p.k;
    info->entropy_bits = p.entropy_bits;
    for (int f = 0; f < kNumFormats; ++f) info->candidate_bytes[f] = p.candidate_bytes[f];
    if (p.format == ExpFormat::kHuffman) info->candidate_bytes[int(ExpFormat::kHuffman)] = dyn;
  }
  return size_t(L.static_bytes + dyn);
}

// ---- header validation -------------------------------------------------------------

// MalformedMessage for a fault of lossless_validate.h's checks; nothing for none.
void refuse(const Fault& f, DType dtype) {
  if (f.kind != FaultKind::kNone) throw MalformedMessage(lossless_fault_message(f, dtype));
}

// The header's checks, raising MalformedMessage.
Header header_or_throw(const uint8_t* p, DType dtype, const Layout& L) {
  Header h;
  refuse(check_header(p, dtype, L, h), dtype);
  return h;
}

// ---- decoding (CPU loops over a parsed plan) ------------------------------------------

// Exponents of segments [r0, r1) (the bf16/fp32 plain section is read in
// place). mtable: the Huffman multi-symbol table, or null.
void decode_exponents(const LosslessDecodePlan& P, const uint8_t* sec, const uint32_t* mtable, int64_t r0,
                      int64_t r1, uint8_t* exps) {
  const Layout& L = P.layout;
  const int64_t m = L.body, G = L.groups;
  switch (P.format) {
    case ExpFormat::kPlain: {  // fp16
      const int64_t g1 = std::min<int64_t>(G, r1 * (kSegment / kGroup));
      for (int64_t g = r0 * (kSegment / kGroup); g < g1; ++g) plain5_decode_group(sec, g, G, exps);
      return;
    }
    case ExpFormat::kConst: {
      const int64_t i0 = r0 * kSegment;
      std::memset(exps + i0, P.constant, size_t(std::min(m, r1 * kSegment) - i0));
      return;
    }
    case ExpFormat::kZip: {
      const uint8_t* planes = sec + P.planes_offset;
      const uint8_t* esc = sec + P.payload_offset;
      for (int64_t s = r0; s < r1; ++s) {
        uint32_t pos = P.seg_start[size_t(s)];
        const uint32_t end = P.seg_start[size_t(s) + 1];
        const int64_t g0 = s * (kSegment / kGroup);
        const int64_t g1 = std::min<int64_t>(G, g0 + kSegment / kGroup);
        bool ok = true;
        for (int64_t g = g0; g < g1; ++g) ok &= zip_decode_group(planes, g, G, P.zip_table, esc, &pos, end, exps);
        if (!ok || pos != end) bad("zip escape codes disagree with the segment's escape count");
      }
      return;
    }
    case ExpFormat::kHuffman: {
      const uint16_t* table = P.huff_table.data();
      const uint8_t* streams = sec + P.payload_offset;
      const uint64_t total = uint64_t(P.payload_bytes);
      // Four segments in lockstep: four independent lookup chains.
      constexpr int kLanes = 4;
      for (int64_t s0 = r0; s0 < r1; s0 += kLanes) {
        const int lanes = int(std::min<int64_t>(kLanes, r1 - s0));
        HuffReader r[kLanes];
        uint32_t sb[kLanes];
        int cnt[kLanes];
        uint8_t* o[kLanes];
        for (int l = 0; l < lanes; ++l) {
          const uint32_t b = P.seg_start[size_t(s0 + l)];
          sb[l] = P.seg_start[size_t(s0 + l) + 1] - b;
          r[l].seg = streams + b;
          r[l].avail = total - b;
          cnt[l] = segment_count(m, s0 + l);
          o[l] = exps + (s0 + l) * kSegment;
        }
        int pos[kLanes] = {0, 0, 0, 0};
        if (lanes == kLanes && mtable) {
          // Up to 15 symbols per lane and round, writing at most 16 bytes.
          const int cmin = std::min(std::min(cnt[0], cnt[1]), std::min(cnt[2], cnt[3]));
          while (pos[0] + 16 <= cmin && pos[1] + 16 <= cmin && pos[2] + 16 <= cmin &&
                 pos[3] + 16 <= cmin && huff_fast(r[0]) && huff_fast(r[1]) && huff_fast(r[2]) &&
                 huff_fast(r[3]))
            for (int l = 0; l < kLanes; ++l) pos[l] += huff_decode_multi5(r[l], mtable, o[l] + pos[l]);
        } else if (lanes == kLanes) {
          const int cmin = std::min(std::min(cnt[0], cnt[1]), std::min(cnt[2], cnt[3]));
          int i = 0;
          while (i + 5 <= cmin && huff_fast(r[0]) && huff_fast(r[1]) && huff_fast(r[2]) && huff_fast(r[3])) {
            for (int l = 0; l < kLanes; ++l) huff_decode5(r[l], table, o[l] + i);
            i += 5;
          }
          for (int l = 0; l < kLanes; ++l) pos[l] = i;
        }
        for (int l = 0; l < lanes; ++l) {
          int j = pos[l];
          while (j + 5 <= cnt[l] && huff_fast(r[l])) {
            huff_decode5(r[l], table, o[l] + j);
            j += 5;
          }
          for (; j < cnt[l]; ++j) huff_decode1(r[l], table, o[l] + j);
          if (!huff_reader_ok(r[l], sb[l]))
            bad("invalid Huffman code stream in segment " + std::to_string(s0 + l));
        }
      }
      return;
    }
  }
}

template <DType T>
void decode_impl(const uint8_t* in, size_t in_bytes, int64_t n, typename Split<T>::word* v) {
  Scratch& sc = scratch();
  LosslessDecodePlan& P = sc.dec;
  lossless_parse(in, in_bytes, T, n, P);
  const Layout& L = P.layout;
  const int64_t m = L.body;
  const uint8_t* sec = in + L.static_bytes;
  // bf16/fp32 plain: one exponent per byte already
  uint8_t* e = P.format == ExpFormat::kPlain && T != DType::kF16 ? nullptr : grow(sc.exps, size_t(m));
  const uint8_t* exps = e ? e : sec;
  // Multi-symbol table: worth its 2048 entries only for longer sections.
  alignas(64) uint32_t mtable[kDecodeTableSize];
  const bool multi = P.format == ExpFormat::kHuffman && m >= 8 * kSegment;
  if (multi)
    for (uint32_t q = 0; q < uint32_t(kDecodeTableSize); ++q) mtable[q] = huff_multi_entry(P.huff_table.data(), q);
  // By runs of segments: they decode independently given P.seg_start.
  parallel_units(0, L.segments, kMinSegmentsPerThread, kSegmentsPerRun, [&](UnitRuns& runs) {
    for (int64_t r0, r1; runs.next(r0, r1);) {
      if (e) decode_exponents(P, sec, multi ? mtable : nullptr, r0, r1, e);
      merge_block<T>(in, L, exps, r0 * kSegment, std::min(m, r1 * kSegment), v);
    }
  });
  if (L.tail) std::memcpy(v + m, in + L.tail_offset, size_t(L.tail) * sizeof(typename Split<T>::word));
}

}  // namespace

size_t lossless_parse_prefix_bytes(DType dtype, int64_t n) {
  lossless_check_count(n);
  // the largest Huffman table (k <= 256 symbols, ceil(k/2) length bytes) + the per-segment sizes
  return size_t(huff_header_bytes(make_layout(dtype, n), 256));
}

void lossless_parse(const uint8_t* in, size_t in_bytes, DType dtype, int64_t n, LosslessDecodePlan& P) {
  lossless_check_count(n);
  const Layout L = make_layout(dtype, n);
  if (in_bytes < size_t(L.static_bytes))
    refuse(fault(FaultKind::kTruncated, int64_t(in_bytes), L.static_bytes), dtype);
  lossless_parse_parts(in, in + L.static_bytes, in_bytes - size_t(L.static_bytes), in_bytes, dtype, n, P);
}

void lossless_parse_parts(const uint8_t* header, const uint8_t* sec, size_t sec_bytes, size_t in_bytes,
                          DType dtype, int64_t n, LosslessDecodePlan& P) {
  lossless_check_count(n);
  const Layout L = make_layout(dtype, n);
  P.layout = L;
  if (in_bytes < size_t(L.static_bytes))
    refuse(fault(FaultKind::kTruncated, int64_t(in_bytes), L.static_bytes), dtype);
  const Header h = header_or_throw(header, dtype, L);
  if (in_bytes != size_t(L.static_bytes) + h.dynamic_bytes)
    refuse(fault(FaultKind::kSize, int64_t(in_bytes), L.static_bytes + int64_t(h.dynamic_bytes)), dtype);
  // From here on nothing past min(dynamic_bytes, the largest prefix) is read (every read below
  // is bounded by dynamic_bytes and by a table of at most huff_header_bytes(L, 256) bytes).
  const size_t need = std::min<size_t>(h.dynamic_bytes, size_t(huff_header_bytes(L, 256)));
  if (sec_bytes < need)
    throw Error("lossless: parse given " + std::to_string(sec_bytes) + " section bytes, needs " +
                std::to_string(need) + " (bug)");
  P.format = ExpFormat(h.format);
  P.dynamic_bytes = h.dynamic_bytes;
  P.seg_start.clear();
  Tables t{};
  refuse(check_tables(P.format, sec, h.dynamic_bytes, dtype, L, t), dtype);
  P.constant = t.constant;
  std::memcpy(P.zip_table, t.zip_table, sizeof(P.zip_table));
  P.planes_offset = t.planes_offset;
  P.payload_offset = t.payload_offset;
  P.payload_bytes = t.payload_bytes;
  if (P.format != ExpFormat::kZip && P.format != ExpFormat::kHuffman) return;
  const int64_t S = L.segments;
  const uint8_t* meta = sec + t.meta_offset;
  P.seg_start.resize(size_t(S) + 1);
  uint64_t pos = 0;
  bool counts_ok = true;
  for (int64_t s = 0; s < S; ++s) {
    P.seg_start[size_t(s)] = uint32_t(pos);
    const uint32_t cnt = load_u16(meta + 2 * s);
    if (P.format == ExpFormat::kZip) counts_ok &= zip_count_ok(cnt, L.body, s);
    pos += cnt;
  }
  if (!counts_ok) refuse(fault(FaultKind::kZipCount), dtype);
  refuse(check_segment_total(P.format, pos, P.payload_bytes), dtype);
  P.seg_start[size_t(S)] = uint32_t(pos);
  if (P.format == ExpFormat::kHuffman) {
    P.huff_table.resize(kDecodeTableSize);
    huff_build_tables(t.k, sec + 1, t.len, P.huff_table.data(), nullptr, nullptr);
  }
}

std::string lossless_fault_message(const Fault& f, DType dtype) {
  const auto num = [](int64_t v) { return std::to_string(v); };
  std::string m;
  switch (f.kind) {
    case FaultKind::kNone: return "lossless: no fault (bug)";
    case FaultKind::kTruncated:
      m = "truncated message: " + num(f.a) + " bytes, the static part alone is " + num(f.b);
      break;
    case FaultKind::kMagic: m = "bad magic byte " + num(f.a) + " (not a lossless message)"; break;
    case FaultKind::kVersion:
      m = "format version " + num(f.a) + ", this build reads version " + num(kVersion) +
          " (all ranks must run the same dynamiq build)";
      break;
    case FaultKind::kChecksum: m = "header checksum mismatch (corrupted header)"; break;
    case FaultKind::kDtype: m = "message dtype " + num(f.a) + ", expected " + dtype_name(dtype); break;
    case FaultKind::kCount: m = "message holds " + num(f.a) + " values, the plan expects " + num(f.b); break;
    case FaultKind::kReserved: m = "reserved header field is not zero"; break;
    case FaultKind::kFormat: m = "unknown exponent format " + num(f.a); break;
    case FaultKind::kDynamicBound:
      m = "dynamic part of " + num(f.a) + " bytes exceeds its bound of " + num(f.b);
      break;
    case FaultKind::kPlainSize: m = "plain exponent section of " + num(f.a) + " bytes, expected " + num(f.b); break;
    case FaultKind::kConstSize: m = "constant exponent section of " + num(f.a) + " bytes"; break;
    case FaultKind::kZipShort: m = "zip exponent section too short"; break;
    case FaultKind::kHuffmanShort: m = "Huffman exponent section too short"; break;
    case FaultKind::kSize: m = "message of " + num(f.a) + " bytes, header announces " + num(f.b); break;
    case FaultKind::kConstRange: m = "constant exponent out of range"; break;
    case FaultKind::kZipTableRange: m = "zip table exponent out of range"; break;
    case FaultKind::kZipPadding: m = "zip table padding is not zero"; break;
    case FaultKind::kZipCount: m = "zip segment escape count out of range"; break;
    case FaultKind::kZipTotal: m = "zip escape counts disagree with the escape list"; break;
    case FaultKind::kHuffmanSymbols: m = "Huffman table with " + num(f.a) + " symbols"; break;
    case FaultKind::kHuffmanTableSize: m = "Huffman table larger than its section"; break;
    case FaultKind::kHuffmanSymbolRange: m = "Huffman symbol out of range"; break;
    case FaultKind::kHuffmanSymbolOrder: m = "Huffman symbols not strictly increasing"; break;
    case FaultKind::kHuffmanLength: m = "Huffman code length out of range"; break;
    case FaultKind::kHuffmanPadding: m = "Huffman length padding is not zero"; break;
    case FaultKind::kHuffmanKraft: m = "Huffman code lengths are over-subscribed"; break;
    case FaultKind::kHuffmanOver: m = "Huffman segment lengths exceed the section"; break;
    case FaultKind::kHuffmanUnder: m = "Huffman section longer than its segments"; break;
    case FaultKind::kCodes: m = "invalid exponent codes in a segment"; break;
    default: m = "unknown fault " + num(int64_t(f.kind)); break;
  }
  return "lossless: " + m;
}

// ---- block-level API ----------------------------------------------------------------

size_t lossless_static_bytes(DType dtype, int64_t n) {
  lossless_check_count(n);
  return size_t(make_layout(dtype, n).static_bytes);
}

size_t lossless_max_dynamic_bytes(DType dtype, int64_t n) {
  lossless_check_count(n);
  return size_t(make_layout(dtype, n).plain_bytes);
}

size_t lossless_encode(const void* values, DType dtype, int64_t n, uint8_t* out,
                       const LosslessOptions& opt, LosslessBlockInfo* info) {
  lossless_check_count(n);
  return DQ_DISPATCH_DTYPE(dtype, T, [&] {
    return encode_impl<T>(static_cast<const typename Split<T>::word*>(values), n, out, opt, info);
  });
}

size_t lossless_dynamic_bytes(const uint8_t* static_part, DType dtype, int64_t n) {
  lossless_check_count(n);
  return header_or_throw(static_part, dtype, make_layout(dtype, n)).dynamic_bytes;
}

void lossless_decode(const uint8_t* in, size_t in_bytes, DType dtype, int64_t n, void* values) {
  lossless_check_count(n);
  DQ_DISPATCH_DTYPE(dtype, T, [&] {
    decode_impl<T>(in, in_bytes, n, static_cast<typename Split<T>::word*>(values));
  });
}

ExpFormat lossless_format_of(const uint8_t* msg) { return ExpFormat(msg[3]); }

// ---- the codec ---------------------------------------------------------------------

namespace {

struct Span {
  int64_t e0, n;
};

Span span_of(const Plan& plan, const Block& b) {
  if (!plan.order.empty() || !plan.bias.empty())
    throw Error("lossless codec needs an identity plan (no reordering, no bias)");
  int64_t e0 = b.w0 * plan.unit;
  int64_t e1 = std::min<int64_t>(b.w1 * plan.unit, plan.numel);
  if (e0 > e1) e0 = e1;
  lossless_check_count(e1 - e0);
  return {e0, e1 - e0};
}

}  // namespace

Plan make_lossless_plan(DType dtype, int64_t numel, int num_chunks) {
  return make_identity_plan(dtype, numel, num_chunks);
}

size_t LosslessCodec::static_bytes(const Plan& plan, const Block& b) const {
  return lossless_static_bytes(plan.dtype, span_of(plan, b).n);
}

size_t LosslessCodec::max_dynamic_bytes(const Plan& plan, const Block& b) const {
  return lossless_max_dynamic_bytes(plan.dtype, span_of(plan, b).n);
}

size_t LosslessCodec::dynamic_bytes(const uint8_t* static_part, const Plan& plan,
                                    const Block& b) const {
  return lossless_dynamic_bytes(static_part, plan.dtype, span_of(plan, b).n);
}

size_t LosslessCodec::compress(const Local& x, const Plan& plan, const Block& b, const RngCtx& rng,
                               uint8_t* out) const {
  const Span s = span_of(plan, b);
  const size_t es = size_t(dtype_size(plan.dtype));
  const void* values;
  if (x.acc) {
    // The identity codec's rounding of the float accumulator to the bucket dtype.
    uint8_t* raw = grow(scratch().raw_out, size_t(s.n) * es);
    id_.compress(x, plan, b, rng, raw);
    values = raw;
  } else {
    values = static_cast<const uint8_t*>(x.bucket) + size_t(s.e0) * es;
  }
  return lossless_encode(values, plan.dtype, s.n, out, opt_);
}

void LosslessCodec::decompress(const uint8_t* in, size_t in_bytes, const Plan& plan, const Block& b,
                               const Output& y) const {
  const Span s = span_of(plan, b);
  const size_t es = size_t(dtype_size(plan.dtype));
  uint8_t* dst = static_cast<uint8_t*>(y.bucket) + size_t(s.e0) * es;
  lossless_decode(in, in_bytes, plan.dtype, s.n, dst);
  // Division for mean exactly as the identity codec does it (in place).
  if (y.divisor != 1.0f) id_.decompress(dst, size_t(s.n) * es, plan, b, y);
}

void LosslessCodec::decompress_accumulate(const uint8_t* in, size_t in_bytes, const Local& x,
                                          const Plan& plan, const Block& b, float* acc) const {
  const Span s = span_of(plan, b);
  const size_t bytes = size_t(s.n) * size_t(dtype_size(plan.dtype));
  uint8_t* raw = grow(scratch().raw_in, bytes);
  lossless_decode(in, in_bytes, plan.dtype, s.n, raw);
  id_.decompress_accumulate(raw, bytes, x, plan, b, acc);
}

size_t LosslessCodec::decompress_accumulate_recompress(const uint8_t* in, size_t in_bytes,
                                                       const Local& x, const Plan& plan,
                                                       const Block& b, const RngCtx& rng,
                                                       uint8_t* out) const {
  const Span s = span_of(plan, b);
  const size_t bytes = size_t(s.n) * size_t(dtype_size(plan.dtype));
  Scratch& sc = scratch();
  uint8_t* raw = grow(sc.raw_in, bytes);
  lossless_decode(in, in_bytes, plan.dtype, s.n, raw);
  uint8_t* sum = grow(sc.raw_out, bytes);
  id_.decompress_accumulate_recompress(raw, bytes, x, plan, b, rng, sum);
  return lossless_encode(sum, plan.dtype, s.n, out, opt_);
}

}  // namespace dynamiq
