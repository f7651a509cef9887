// Internal to the DynamiQ CPU codec: the kernels of one super-group's stages,
// one namespace per instruction set, each in its own file:
//   dq_cpu::scalar  dynamiq_cpu_scalar.cc  portable loops (every build; the
//                                          only kernels of a build without AVX2)
//   dq_cpu::avx2    dynamiq_cpu_avx2.cc    AVX2 + FMA (the x86-64-v3 build), and
//                   dynamiq_cpu_avx2.h     its decode loop, inlined by the dispatcher
// dynamiq_codec.cc chooses between them per stage by the build's ISA (compile
// time) and the shapes each variant handles, stated at its declaration below.
// Every variant is bit-identical to the shared per-element math of
// dynamiq_math.h (tests/cpp/test_dynamiq_fastpath.cc). There are no AVX-512
// kernels: they were withdrawn (CHANGELOG; git history keeps
// dynamiq_cpu_avx512.cc) until an AVX-512 machine runs them, and an AVX-512
// CPU runs the AVX2 ones.
//
// Helpers shared by the vector files are static (one copy per file, compiled
// with that file's flags), so that a file compiled with other ISA flags, if
// one comes back, cannot lend the whole program its copy of an inline
// function with external linkage.
#pragma once

#include <cstdint>

#include "kernels/base/x86_intrin.h"
#include "kernels/dynamiq/dynamiq_codec.h"
#include "kernels/dynamiq/dynamiq_math.h"

namespace dynamiq::dq_cpu {

// A bf16 scale on the wire, little-endian.
static inline void put_bf16(uint8_t* p, uint16_t h) {
  p[0] = uint8_t(h);
  p[1] = uint8_t(h >> 8);
}
static inline uint16_t get_bf16(const uint8_t* p) { return uint16_t(p[0] | (uint16_t(p[1]) << 8)); }

// ---- portable kernels (any S, s; S a multiple of 8) -----------------------------
namespace scalar {

// words[4k + j] = word j of Philox call base + k, k < S/4 (any counter, also
// across a 2^32 boundary): the calls' words side by side, so the S words of
// S/4 permutation calls are the S elements' words in element order.
void fill_words(const RngKey& key, uint64_t base, uint32_t purpose, uint32_t who, int S,
                uint32_t* __restrict words);
// w[0, S/2) holds the words of S/8 value calls (fill_words); afterwards w[i]
// is element i's rounding word, dq_octet_word(call i/8, i%8).
void expand_u16_words(int S, uint32_t* __restrict w);
// pi[i] = this rank's stratum for the permutation words sw[i], i < S.
void fill_strata(const PermParams& pp, int S, const uint32_t* __restrict sw, float* __restrict pi);
// out[k*s + i] = v[k] for i < s: the per-element copy of per-group values.
void broadcast_groups(const float* __restrict v, int G, int s, float* __restrict out);
// Group maxima of |t| on the bit patterns (G groups of s); returns the overall max.
uint32_t group_max(const float* __restrict t, int G, int s, float* __restrict gmax);
// dq_group_scale_up for groups [k0, G): codes into rk, 1/normaliser into ik.
void group_scales_up(const float* __restrict gmax, float Msg, const float* __restrict r255, int k0,
                     int G, uint32_t* __restrict rk, float* __restrict ik);
// dq_group_scale_stochastic for the G groups of source SG src: the scale codes
// to out[0, G), 1/normaliser into ginv.
void group_scales_stochastic(const float* __restrict gmax, float Msg, const float* __restrict r255,
                             const DqRounding& rd, int64_t src, int G, uint8_t* __restrict out,
                             float* __restrict ginv);
// Flat (ablation) group scales: G bf16 scales to out[0, 2G), 1/normaliser into
// ginv (0 and nan scales when `bad`: the SG holds inf or nan).
void flat_scales(const float* __restrict gmax, int G, bool bad, uint8_t* __restrict out,
                 float* __restrict ginv);

// Scratch of encode_values: S entries each.
struct Passes {
  float* a;
  float* p;
  int32_t* j;
  uint32_t* c;
};
// The value codes of an SG of width B in {1, 2, 4, 8} (dq_encode_value as one
// vectorisable pass per step) and their planar packing into out (S*B/8 bytes):
// inv_e the per-element 1/normaliser, pi the strata (0 when not correlated),
// w the expanded rounding words (0 when not stochastic).
template <int B>
void encode_values(const DqLevels& lv, const DqRounding& rd, int S, const float* __restrict t,
                   const float* __restrict inv_e, const float* __restrict pi,
                   const uint32_t* __restrict w, const Passes& ps, uint8_t* __restrict out);
// tile[i] = base[i] + decode[code of i] * sc[i] (fma; base may be null: no
// add) for the planar codes of width B in {1, 2, 4, 8}; sc per element.
template <int B>
void decode_values(const float* __restrict dec, const uint8_t* __restrict codes, int S,
                   const float* __restrict sc, const float* __restrict base, float* __restrict tile);
// Width 16: the S values as bf16 (round to nearest even) to out; back into
// tile (+ base when base).
void encode_bf16(const float* __restrict t, int S, uint16_t* __restrict scratch, uint8_t* __restrict out);
void decode_bf16(const uint8_t* __restrict in, int S, const float* __restrict base, float* __restrict tile);

}  // namespace scalar

#if defined(__AVX2__)
// ---- AVX2 kernels (the x86-64-v3 build) ----------------------------------------
namespace avx2 {

// scalar::fill_words for q = S/4 a multiple of 32 and base + q without a 32-bit wrap.
void fill_words(const RngKey& key, uint64_t base, uint32_t purpose, uint32_t who, int S,
                uint32_t* __restrict words);
void expand_u16_words(int S, uint32_t* __restrict w);
// S a multiple of 8; col8 the byte column of the permutation table (3 <= n <= 8).
void fill_strata(const PermParams& pp, const uint8_t* col8, int S, const uint32_t* __restrict sw,
                 float* __restrict pi);
// s a multiple of 8.
void broadcast_groups(const float* __restrict v, int G, int s, float* __restrict out);
uint32_t group_max(const float* __restrict t, int G, int s, float* __restrict gmax);
// Groups [0, G8), G8 a multiple of 8. rrec: DynamiqTables::r255_rec.
void group_scales_up(const float* __restrict gmax, float Msg, const float* __restrict rrec, int G8,
                     uint32_t* __restrict rk, float* __restrict ik);
// The value passes and the packing of scalar::encode_values in one loop, for
// B in {2, 4, 8}, nb = S*B/8 a multiple of 32 and s a multiple of 8.
// gv[i >> rs]: 1/normaliser of the run of 2^rs elements from i (rs = 3 or 4);
// w: the S/2 rounding words unexpanded (read when stochastic); pi: strata
// (null when not correlated); recp: DynamiqTables::cell_rec of width B.
template <int B>
void encode_values(const DqLevels& lv, const uint32_t* __restrict recp, const DqRounding& rd, int S,
                   const float* __restrict t, const float* __restrict gv, int rs,
                   const float* __restrict pi, const uint32_t* __restrict w, uint8_t* __restrict out);
// decode_values: scalar::decode_values on 8 lanes, for B in {2, 4, 8} and nb,
// s multiples of 8, the scales per run (gv[i >> rs]); in dynamiq_cpu_avx2.h,
// static inline (a call per super-group cost decompress 4-5 %).

}  // namespace avx2

// (f(0), ..., f(7)) from 8 scalar loads and inserts: on the Zen 3 guest
// cheaper than an 8-wide gather (vpgatherdd). Static: see the top of the file.
template <typename F>
static inline __m256i insert8_epi32(F&& f) {
  __m128i a = _mm_cvtsi32_si128(f(0)), b = _mm_cvtsi32_si128(f(4));
  a = _mm_insert_epi32(a, f(1), 1);
  b = _mm_insert_epi32(b, f(5), 1);
  a = _mm_insert_epi32(a, f(2), 2);
  b = _mm_insert_epi32(b, f(6), 2);
  a = _mm_insert_epi32(a, f(3), 3);
  b = _mm_insert_epi32(b, f(7), 3);
  return _mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1);
}
#endif

}  // namespace dynamiq::dq_cpu
