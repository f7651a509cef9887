#include "kernels/identity/identity_codec.h"

#include <cstring>

#include "kernels/base/float_bits.h"

namespace dynamiq {
namespace {

struct Span {
  int64_t e0, e1;  // element range of the block
};

Span block_span(const Plan& plan, const Block& b) {
  if (!plan.order.empty() || !plan.bias.empty())
    throw Error("identity codec needs an identity plan (no reordering, no bias)");
  int64_t e0 = b.w0 * plan.unit;
  int64_t e1 = b.w1 * plan.unit;
  if (e1 > plan.numel) e1 = plan.numel;
  if (e0 > e1) e0 = e1;
  return {e0, e1};
}

// Value of element e of the rank's local data (bucket or wire-order accumulator).
template <DType T>
struct LocalReader {
  using Tr = DTypeTraits<T>;
  const typename Tr::storage* bucket;
  const float* acc;  // shifted so acc[e] is element e

  LocalReader(const Local& x, const Plan& plan)
      : bucket(static_cast<const typename Tr::storage*>(x.bucket)),
        acc(x.acc ? x.acc - x.acc_w0 * plan.unit : nullptr) {}
};

// 16-bit buckets: the element loops below first run 8 elements per vector
// conversion (Lanes8, the same bits lane for lane as Tr::load / Tr::store) and
// leave the rest to the generic per-element loop: gcc does not vectorise the
// fp16 conversions and vectorises the bf16 rounding poorly. Operand dtypes
// A, B, O: the bucket's or float32 (an accumulator). Each helper returns how
// many elements it did: n rounded down to 8, or 0 when every operand is
// float32 (plain loops gcc vectorises) or without AVX2.
template <DType A, DType B, DType O>
int64_t add_prefix(const typename DTypeTraits<A>::storage* a, const typename DTypeTraits<B>::storage* b,
                   typename DTypeTraits<O>::storage* out, int64_t n) {  // out[i] = a[i] + b[i]
  int64_t i = 0;
#if defined(DQ_HAVE_LANES8)
  if constexpr (A != DType::kF32 || B != DType::kF32 || O != DType::kF32)
    for (; i + 8 <= n; i += 8)
      Lanes8<O>::store(out + i, _mm256_add_ps(Lanes8<A>::load(a + i), Lanes8<B>::load(b + i)));
#else
  (void)a, (void)b, (void)out, (void)n;
#endif
  return i;
}

// out[i] = a[i] / d (as divide8: r = exact_reciprocal(d); d = 1 copies)
template <DType A, DType O>
int64_t divide_prefix(const typename DTypeTraits<A>::storage* a, float d, float r,
                      typename DTypeTraits<O>::storage* out, int64_t n) {
  int64_t i = 0;
#if defined(DQ_HAVE_LANES8)
  if constexpr (A != DType::kF32 || O != DType::kF32)
    for (; i + 8 <= n; i += 8) Lanes8<O>::store(out + i, divide8(Lanes8<A>::load(a + i), d, r));
#else
  (void)a, (void)d, (void)r, (void)out, (void)n;
#endif
  return i;
}

constexpr DType kAcc = DType::kF32;  // accumulators hold float32

}  // namespace

Plan make_identity_plan(DType dtype, int64_t numel, int num_chunks, int32_t unit) {
  DQ_CHECK(num_chunks >= 1, "identity plan: num_chunks must be >= 1");
  DQ_CHECK(unit >= 1, "identity plan: unit must be >= 1");
  Plan p;
  p.dtype = dtype;
  p.numel = numel;
  p.unit = unit;
  p.num_units = ceil_div<int64_t>(numel, unit);
  p.wire_offset.resize(size_t(p.num_units) + 1);
  const int64_t es = dtype_size(dtype);
  for (int64_t w = 0; w <= p.num_units; ++w) {
    int64_t e = w * unit < numel ? w * unit : numel;
    p.wire_offset[size_t(w)] = e * es;
  }
  p.chunk_begin.resize(size_t(num_chunks) + 1);
  for (int c = 0; c <= num_chunks; ++c) p.chunk_begin[size_t(c)] = p.num_units * c / num_chunks;
  return p;
}

size_t IdentityCodec::static_bytes(const Plan& plan, const Block& b) const {
  Span s = block_span(plan, b);
  return size_t(s.e1 - s.e0) * size_t(dtype_size(plan.dtype));
}

const uint8_t* IdentityCodec::wire_view(const Local& x, const Plan& plan, const Block& b) const {
  if (x.acc || !x.bucket) return nullptr;
  Span s = block_span(plan, b);
  return static_cast<const uint8_t*>(x.bucket) + s.e0 * dtype_size(plan.dtype);
}

uint8_t* IdentityCodec::output_view(const Output& y, const Plan& plan, const Block& b) const {
  if (!y.bucket) return nullptr;
  Span s = block_span(plan, b);
  return static_cast<uint8_t*>(y.bucket) + s.e0 * dtype_size(plan.dtype);
}

size_t IdentityCodec::compress(const Local& x, const Plan& plan, const Block& b, const RngCtx&,
                               uint8_t* out) const {
  Span s = block_span(plan, b);
  const size_t bytes = size_t(s.e1 - s.e0) * size_t(dtype_size(plan.dtype));
  DQ_DISPATCH_DTYPE(plan.dtype, T, [&] {
    using Tr = DTypeTraits<T>;
    LocalReader<T> r(x, plan);
    auto* o = reinterpret_cast<typename Tr::storage*>(out);
    if (r.acc) {
      const float* a = r.acc + s.e0;
      const int64_t n = s.e1 - s.e0;
      for (int64_t i = divide_prefix<kAcc, T>(a, 1.0f, 1.0f, o, n); i < n; ++i) Tr::store(o, i, a[i]);
    } else {
      if (static_cast<const void*>(out) != static_cast<const void*>(r.bucket + s.e0))
        std::memcpy(out, r.bucket + s.e0, bytes);
    }
  });
  return bytes;
}

void IdentityCodec::decompress(const uint8_t* in, size_t in_bytes, const Plan& plan,
                               const Block& b, const Output& y) const {
  Span s = block_span(plan, b);
  const size_t bytes = size_t(s.e1 - s.e0) * size_t(dtype_size(plan.dtype));
  check_message_size(in_bytes, bytes, "identity");
  DQ_DISPATCH_DTYPE(plan.dtype, T, [&] {
    using Tr = DTypeTraits<T>;
    auto* dst = static_cast<typename Tr::storage*>(y.bucket) + s.e0;
    const auto* src = reinterpret_cast<const typename Tr::storage*>(in);
    if (y.divisor == 1.0f) {
      if (static_cast<const void*>(dst) != static_cast<const void*>(src)) std::memmove(dst, src, bytes);
    } else {
      const float d = y.divisor;
      const float r = exact_reciprocal(d);  // same values, a multiply instead of a division
      const int64_t n = s.e1 - s.e0;
      const int64_t i0 = divide_prefix<T, T>(src, d, r, dst, n);
      if (r != 0.0f)
        for (int64_t i = i0; i < n; ++i) Tr::store(dst, i, Tr::load(src, i) * r);
      else
        for (int64_t i = i0; i < n; ++i) Tr::store(dst, i, Tr::load(src, i) / d);
    }
  });
}

void IdentityCodec::decompress_accumulate(const uint8_t* in, size_t in_bytes, const Local& x,
                                          const Plan& plan, const Block& b, float* acc) const {
  Span s = block_span(plan, b);
  check_message_size(in_bytes, size_t(s.e1 - s.e0) * size_t(dtype_size(plan.dtype)), "identity");
  DQ_DISPATCH_DTYPE(plan.dtype, T, [&] {
    using Tr = DTypeTraits<T>;
    LocalReader<T> r(x, plan);
    const auto* src = reinterpret_cast<const typename Tr::storage*>(in);
    const int64_t n = s.e1 - s.e0;
    if (r.acc) {
      const float* a = r.acc + s.e0;
      for (int64_t i = add_prefix<kAcc, T, kAcc>(a, src, acc, n); i < n; ++i) acc[i] = a[i] + Tr::load(src, i);
    } else {
      const auto* bk = r.bucket + s.e0;
      for (int64_t i = add_prefix<T, T, kAcc>(bk, src, acc, n); i < n; ++i)
        acc[i] = Tr::load(bk, i) + Tr::load(src, i);
    }
  });
}

size_t IdentityCodec::decompress_accumulate_recompress(const uint8_t* in, size_t in_bytes,
                                                       const Local& x, const Plan& plan,
                                                       const Block& b, const RngCtx&,
                                                       uint8_t* out) const {
  Span s = block_span(plan, b);
  const size_t bytes = size_t(s.e1 - s.e0) * size_t(dtype_size(plan.dtype));
  check_message_size(in_bytes, bytes, "identity");
  DQ_DISPATCH_DTYPE(plan.dtype, T, [&] {
    using Tr = DTypeTraits<T>;
    LocalReader<T> r(x, plan);
    const auto* src = reinterpret_cast<const typename Tr::storage*>(in);
    auto* o = reinterpret_cast<typename Tr::storage*>(out);
    const int64_t n = s.e1 - s.e0;
    if (r.acc) {
      const float* a = r.acc + s.e0;
      for (int64_t i = add_prefix<kAcc, T, T>(a, src, o, n); i < n; ++i) Tr::store(o, i, a[i] + Tr::load(src, i));
    } else {
      const auto* bk = r.bucket + s.e0;
      for (int64_t i = add_prefix<T, T, T>(bk, src, o, n); i < n; ++i)
        Tr::store(o, i, Tr::load(bk, i) + Tr::load(src, i));
    }
  });
  return bytes;
}

}  // namespace dynamiq
