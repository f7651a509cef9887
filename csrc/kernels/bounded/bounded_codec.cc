#include "kernels/bounded/bounded_codec.h"

#include <cstring>
#include <vector>

namespace dynamiq {
namespace {

struct Span {
  int64_t e0, e1;
};

Span block_span(const Plan& plan, const Block& b) {
  if (!plan.order.empty() || !plan.bias.empty())
    throw Error("bounded codec needs an identity plan (no reordering, no bias)");
  int64_t e0 = b.w0 * plan.unit;
  int64_t e1 = b.w1 * plan.unit;
  if (e1 > plan.numel) e1 = plan.numel;
  if (e0 > e1) e0 = e1;
  return {e0, e1};
}

int64_t code_blocks_for(int64_t n, int32_t unit) {
  const int64_t full = n / unit, rest = n % unit;
  return full * ceil_div<int64_t>(unit, kBoundedBlock) + ceil_div<int64_t>(rest, kBoundedBlock);
}

// Scratch floats of the calling thread (a block's values).
float* scratch(int64_t n, int which) {
  thread_local std::vector<float> buf[2];
  if (buf[which].size() < size_t(n)) buf[which].resize(size_t(n));
  return buf[which].data();
}

// v[i] = element e0 + i of the rank's local data, as float.
void read_local(const Local& x, const Plan& plan, const Span& s, float* v) {
  const int64_t n = s.e1 - s.e0;
  if (x.acc) {
    const float* a = x.acc - x.acc_w0 * plan.unit + s.e0;
    std::memcpy(v, a, size_t(n) * sizeof(float));
    return;
  }
  DQ_DISPATCH_DTYPE(plan.dtype, T, [&] {
    using Tr = DTypeTraits<T>;
    const auto* bk = static_cast<const typename Tr::storage*>(x.bucket) + s.e0;
    for (int64_t i = 0; i < n; ++i) v[i] = Tr::load(bk, i);
  });
}

void check_bound(const Plan& plan) {
  const float e = plan.error_bound;
  if (!(e >= 0.0f && e <= kBoundedMaxBound))
    throw Error("bounded codec: plan error bound " + std::to_string(e) + " outside [0, 2^126]");
}

}  // namespace

size_t bounded_static_bytes_for(int64_t n, int32_t unit) {
  return size_t(bounded_static_bytes(ceil_div<int64_t>(n, unit), code_blocks_for(n, unit)));
}

size_t bounded_max_dynamic_bytes_for(int64_t n, int32_t unit) {
  return size_t(code_blocks_for(n, unit)) * kBoundedRawBytes;
}

size_t bounded_encode(const float* v, int64_t n, int32_t unit, float e, uint8_t* out,
                      BoundedBlockInfo* info) {
  DQ_CHECK(unit >= 1 && unit <= kBoundedMaxUnit, "bounded codec: unit of " + std::to_string(unit) + " values");
  const int64_t nu = ceil_div<int64_t>(n, unit);
  const int64_t ncb = code_blocks_for(n, unit);
  const int64_t stat = bounded_static_bytes(nu, ncb);
  const float w = e * 2.0f;
  uint8_t* anchors = out + kBoundedHeaderBytes;
  uint8_t* lens = anchors + 4 * nu;
  uint8_t* dyn = out + stat;
  int64_t dpos = 0, cb = 0;
  BoundedBlockInfo st;
  int32_t q[kBoundedBlock];
  uint32_t z[kBoundedBlock];
  for (int64_t u = 0; u < nu; ++u) {
    const int64_t u0 = u * unit;
    const int64_t cnt = n - u0 < unit ? n - u0 : unit;
    bool have_prev = false;
    int32_t prev = 0, anchor = 0;
    for (int64_t b0 = 0; b0 < cnt; b0 += kBoundedBlock, ++cb) {
      const int m = int(cnt - b0 < kBoundedBlock ? cnt - b0 : kBoundedBlock);
      const float* x = v + u0 + b0;
      bool ok = true;
      for (int i = 0; i < m; ++i) ok &= bounded_quantize(x[i], w, e, q[i]);
      if (!ok) {
        lens[cb] = kBoundedRaw;
        uint8_t* p = dyn + dpos;
        for (int i = 0; i < kBoundedBlock; ++i) store_u32(p + 4 * i, i < m ? f32_bits(x[i]) : 0u);
        dpos += kBoundedRawBytes;
        ++st.raw_blocks;
        continue;
      }
      if (!have_prev) {
        anchor = prev = q[0];
        have_prev = true;
      }
      uint32_t zmax = 0;
      for (int i = 0; i < kBoundedBlock; ++i) {
        if (i < m) {
          z[i] = bounded_zigzag(q[i] - prev);
          prev = q[i];
        } else {
          z[i] = 0;
        }
        zmax |= z[i];
      }
      const int L = bounded_bitlen(zmax);
      lens[cb] = uint8_t(L);
      if (L == 0) {
        ++st.zero_blocks;
      } else {
        bounded_pack(z, L, dyn + dpos);
        dpos += 4 * L;
      }
    }
    store_u32(anchors + 4 * u, uint32_t(anchor));
  }
  out[0] = kBoundedMagic;
  out[1] = kBoundedVersion;
  store_u16(out + 2, 0);
  store_u32(out + 4, f32_bits(e));
  store_u32(out + 8, uint32_t(dpos));
  store_u32(out + 12, uint32_t(n));
  if (info) {
    st.values = n;
    st.code_blocks = ncb;
    *info = st;
  }
  return size_t(stat + dpos);
}

namespace {

// Validates the static part and returns the dynamic size it announces.
size_t parse_static(const uint8_t* in, int64_t n, int32_t unit, float e) {
  const int64_t nu = ceil_div<int64_t>(n, unit);
  const int64_t ncb = code_blocks_for(n, unit);
  if (in[0] != kBoundedMagic || in[1] != kBoundedVersion || load_u16(in + 2) != 0)
    throw MalformedMessage("bounded: bad magic or version");
  if (load_u32(in + 4) != f32_bits(e))
    throw MalformedMessage("bounded: error bound differs from the plan's");
  if (load_u32(in + 12) != uint32_t(n)) throw MalformedMessage("bounded: value count differs from the plan's");
  const uint8_t* anchors = in + kBoundedHeaderBytes;
  for (int64_t u = 0; u < nu; ++u) {
    const int32_t a = int32_t(load_u32(anchors + 4 * u));
    if (a > kBoundedQMax || a < -kBoundedQMax) throw MalformedMessage("bounded: anchor out of range");
  }
  const uint8_t* lens = anchors + 4 * nu;
  int64_t dyn = 0;
  for (int64_t c = 0; c < ncb; ++c) {
    const int64_t p = bounded_payload_bytes(lens[c]);
    if (p < 0) throw MalformedMessage("bounded: bad code length " + std::to_string(int(lens[c])));
    dyn += p;
  }
  if (uint64_t(dyn) != load_u32(in + 8)) throw MalformedMessage("bounded: dynamic size disagrees with code lengths");
  return size_t(dyn);
}

}  // namespace

void bounded_decode(const uint8_t* in, size_t in_bytes, int64_t n, int32_t unit, float e, float* v) {
  const size_t stat = bounded_static_bytes_for(n, unit);
  if (in_bytes < stat) check_message_size(in_bytes, stat, "bounded");
  const size_t dyn_bytes = parse_static(in, n, unit, e);
  check_message_size(in_bytes, stat + dyn_bytes, "bounded");
  const int64_t nu = ceil_div<int64_t>(n, unit);
  const uint8_t* anchors = in + kBoundedHeaderBytes;
  const uint8_t* lens = anchors + 4 * nu;
  const uint8_t* dyn = in + stat;
  const float w = e * 2.0f;
  int64_t dpos = 0, cb = 0;
  uint32_t z[kBoundedBlock];
  for (int64_t u = 0; u < nu; ++u) {
    const int64_t u0 = u * unit;
    const int64_t cnt = n - u0 < unit ? n - u0 : unit;
    int32_t prev = int32_t(load_u32(anchors + 4 * u));
    for (int64_t b0 = 0; b0 < cnt; b0 += kBoundedBlock, ++cb) {
      const int m = int(cnt - b0 < kBoundedBlock ? cnt - b0 : kBoundedBlock);
      float* y = v + u0 + b0;
      const uint8_t L = lens[cb];
      if (L == kBoundedRaw) {
        for (int i = 0; i < m; ++i) y[i] = bits_f32(load_u32(dyn + dpos + 4 * i));
        dpos += kBoundedRawBytes;
        continue;
      }
      if (L == 0) {
        const float c = bounded_value(prev, w);
        for (int i = 0; i < m; ++i) y[i] = c;
        continue;
      }
      bounded_unpack(dyn + dpos, L, z);
      dpos += 4 * L;
      for (int i = 0; i < m; ++i) {
        const int32_t q = prev + bounded_unzigzag(z[i]);  // |prev| <= 2^24, |r| <= 2^26: no overflow
        if (q > kBoundedQMax || q < -kBoundedQMax) throw MalformedMessage("bounded: bin index out of range");
        prev = q;
        y[i] = bounded_value(q, w);
      }
    }
  }
}

size_t BoundedCodec::static_bytes(const Plan& plan, const Block& b) const {
  const Span s = block_span(plan, b);
  return bounded_static_bytes_for(s.e1 - s.e0, plan.unit);
}

size_t BoundedCodec::max_dynamic_bytes(const Plan& plan, const Block& b) const {
  const Span s = block_span(plan, b);
  return bounded_max_dynamic_bytes_for(s.e1 - s.e0, plan.unit);
}

size_t BoundedCodec::dynamic_bytes(const uint8_t* static_part, const Plan& plan, const Block& b) const {
  const Span s = block_span(plan, b);
  return parse_static(static_part, s.e1 - s.e0, plan.unit, plan.error_bound);
}

size_t BoundedCodec::compress(const Local& x, const Plan& plan, const Block& b, const RngCtx&,
                              uint8_t* out) const {
  check_bound(plan);
  const Span s = block_span(plan, b);
  const int64_t n = s.e1 - s.e0;
  float* v = scratch(n, 0);
  read_local(x, plan, s, v);
  return bounded_encode(v, n, plan.unit, plan.error_bound, out);
}

void BoundedCodec::decompress(const uint8_t* in, size_t in_bytes, const Plan& plan, const Block& b,
                              const Output& y) const {
  const Span s = block_span(plan, b);
  const int64_t n = s.e1 - s.e0;
  float* v = scratch(n, 0);
  bounded_decode(in, in_bytes, n, plan.unit, plan.error_bound, v);
  const float d = y.divisor;
  DQ_DISPATCH_DTYPE(plan.dtype, T, [&] {
    using Tr = DTypeTraits<T>;
    auto* dst = static_cast<typename Tr::storage*>(y.bucket) + s.e0;
    if (d == 1.0f)
      for (int64_t i = 0; i < n; ++i) Tr::store(dst, i, v[i]);
    else
      for (int64_t i = 0; i < n; ++i) Tr::store(dst, i, v[i] / d);
  });
}

void BoundedCodec::decompress_accumulate(const uint8_t* in, size_t in_bytes, const Local& x,
                                         const Plan& plan, const Block& b, float* acc) const {
  const Span s = block_span(plan, b);
  const int64_t n = s.e1 - s.e0;
  float* v = scratch(n, 0);
  float* l = scratch(n, 1);
  bounded_decode(in, in_bytes, n, plan.unit, plan.error_bound, v);
  read_local(x, plan, s, l);  // before writing acc: x may alias it
  for (int64_t i = 0; i < n; ++i) acc[i] = l[i] + v[i];
}

size_t BoundedCodec::decompress_accumulate_recompress(const uint8_t* in, size_t in_bytes, const Local& x,
                                                      const Plan& plan, const Block& b, const RngCtx&,
                                                      uint8_t* out) const {
  check_bound(plan);
  const Span s = block_span(plan, b);
  const int64_t n = s.e1 - s.e0;
  float* v = scratch(n, 0);
  float* l = scratch(n, 1);
  bounded_decode(in, in_bytes, n, plan.unit, plan.error_bound, v);
  read_local(x, plan, s, l);
  for (int64_t i = 0; i < n; ++i) v[i] = l[i] + v[i];
  return bounded_encode(v, n, plan.unit, plan.error_bound, out);
}

}  // namespace dynamiq

namespace dynamiq {

// kind: Collective (config.h) 0 all-reduce, 1 reduce-scatter, 2 all-gather.
// A reduction over `world` ranks is a tree with world - 1 messages per
// coordinate whatever the topology (ring: a chain; butterfly: the halving
// steps, extra ranks sending once to a core rank; two-step: every rank to the
// owner), and every message is one compression, whose error stays in the sum;
// the all-reduce's sink compresses the sum once more for the all-gather, where
// the bytes are forwarded, never recompressed; a reduce-scatter's sink keeps
// its sum as it is (ExecArgs::sink_writes_sum). An all-gather compresses each
// shard once.
int bounded_compressions(int kind, int world) {
  if (world <= 1) return 0;
  if (kind == 2) return 1;
  return kind == 1 ? world - 1 : world;
}

}  // namespace dynamiq
