// Shared random permutations for correlated rounding (DynamiQ section 3.3,
// after Suresh et al.): for every coordinate i, all n ranks agree on a random
// permutation pi_i of {0..n-1} without communicating, and rank r uses the
// stratum pi_i(r) for its uniform u = (pi_i(r) + gamma)/n. Each rank evaluates
// pi_i at its own index only; nothing is materialised per coordinate.
//
// The permutation of coordinate i is a function of one shared 32-bit Philox
// word w_i (purpose kPurposePermutation, rank word 0, so identical on every
// rank) and of n:
//   n == 1      pi = identity;
//   n == 2      pi(r) = r xor (top bit of w): exactly uniform;
//   3 <= n <= 8 m = floor(w * n! / 2^32) indexes the n! permutations in
//               lexicographic order, pi(r) = column_r[m] (a host-built table of
//               n! bytes). Exactly uniform up to the quantisation of m: every
//               permutation has probability within n!/2^32 (< 1e-5) of 1/n!;
//   n > 8       swap-or-not shuffle (Hoang, Morris, Rogaway, CRYPTO 2012) on
//               [0, n) with kSwapOrNotRounds rounds; each round pairs x with
//               (K - x) mod n and swaps the pair when a round function of the
//               pair's larger member is 1, so it is a bijection for every key
//               and needs no cycle walking. Round keys are derived from w by an
//               invertible 32-bit mix. Pseudo-random, not exactly uniform:
//               at most 2^32 permutations per coordinate; the pairwise
//               position statistics are tested for n = 9, 17, 33, the full
//               distribution (all n!) for n = 4, 5.
// A shared cyclic shift (pi(r) = r + c mod n) is deliberately not used: on a
// ring it puts consecutive hops into adjacent strata.
#pragma once

#include <vector>

#include "kernels/base/common.h"

namespace dynamiq {

constexpr int kPermTableMaxN = 8;     // largest n served by the exact table
constexpr int kSwapOrNotRounds = 10;  // rounds of the n > 8 shuffle

// A 32-bit bijective mixer (the "lowbias32" constants of C. Wellons' hash
// prospector): every output bit depends on every input bit.
DQ_HD uint32_t perm_mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// floor(w * n / 2^32): a uniform index in [0, n) from a uniform 32-bit word.
DQ_HD uint32_t perm_mulhi(uint32_t w, uint32_t n) {
  return uint32_t((uint64_t(w) * uint64_t(n)) >> 32);
}

// Swap-or-not evaluation of rank x's image under the permutation keyed by w.
// Round j: h = mix(w ^ c_j) (independent of x), partner key k = floor(h n / 2^32),
// round function F(hi) = bit hi of g = h * odd when n <= 32 (a random
// function table of 32 bits: cheap, and off the x-dependency chain), else the
// top bit of mix(h + c * hi).
template <bool kSmall>  // kSmall: n <= 32
DQ_HD uint32_t perm_swap_or_not_t(uint32_t n, uint32_t x, uint32_t w) {
  for (uint32_t j = 0; j < uint32_t(kSwapOrNotRounds); ++j) {
    const uint32_t h = perm_mix32(w ^ (0x9e3779b9u * (j + 1u)));
    const uint32_t k = perm_mulhi(h, n);
    const uint32_t g = h * 0x2545f491u;
    const uint32_t xp = k >= x ? k - x : k + n - x;  // (k - x) mod n: the partner of x
    const uint32_t hi = x > xp ? x : xp;               // same for both members of the pair
    uint32_t bit;
    if constexpr (kSmall)
      bit = (g >> (hi & 31u)) & 1u;
    else
      bit = perm_mix32(h + 0x85ebca6bu * hi) >> 31;
    x = bit ? xp : x;
  }
  return x;
}

DQ_HD uint32_t perm_swap_or_not(uint32_t n, uint32_t x, uint32_t w) {
  return n <= 32u ? perm_swap_or_not_t<true>(n, x, w) : perm_swap_or_not_t<false>(n, x, w);
}

// What a kernel needs to evaluate pi_i(rank) from the shared word w_i.
struct PermParams {
  uint32_t n = 1;                  // world size
  uint32_t rank = 0;
  uint32_t nfact = 1;              // n! for n <= kPermTableMaxN
  const int32_t* column = nullptr; // n <= kPermTableMaxN: column_rank of the table (nfact entries; int32 so CPU loops can gather)
};

DQ_HD uint32_t perm_eval(const PermParams& p, uint32_t w) {
  if (p.n <= 1) return 0;
  if (p.n == 2) return p.rank ^ (w >> 31);
  if (p.n <= uint32_t(kPermTableMaxN)) return uint32_t(p.column[perm_mulhi(w, p.nfact)]);
  return perm_swap_or_not(p.n, p.rank, w);
}

// ---- host side ----------------------------------------------------------------

// column[m] = (m-th permutation of {0..n-1} in lexicographic order)(rank), for
// 3 <= n <= kPermTableMaxN. Built once per (n, rank) and cached for the life
// of the process (thread-safe); the pointer stays valid.
const int32_t* perm_table_column(int n, int rank);

// The same column as bytes (column8[m] == column[m]), followed by 3 zero bytes
// of padding so that a 32-bit load at any m stays inside (the CPU strata
// gather: 40 KB for n = 8 instead of 161 KB). Cached like perm_table_column.
const uint8_t* perm_table_column8(int n, int rank);

// The m-th permutation of {0..n-1} in lexicographic order (Lehmer decoding),
// n <= 12. Exposed for tests.
std::vector<uint8_t> perm_lexicographic(int n, uint64_t m);

// PermParams for a rank of a world (fills the table column when needed).
PermParams make_perm_params(int n, int rank);

}  // namespace dynamiq
