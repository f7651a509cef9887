#include "kernels/dynamiq/permutation.h"

#include <map>
#include <memory>
#include <mutex>

namespace dynamiq {

std::vector<uint8_t> perm_lexicographic(int n, uint64_t m) {
  DQ_CHECK(n >= 1 && n <= 12, "perm_lexicographic: n must be in [1, 12]");
  std::vector<uint64_t> fact(size_t(n) + 1, 1);
  for (int i = 1; i <= n; ++i) fact[size_t(i)] = fact[size_t(i) - 1] * uint64_t(i);
  DQ_CHECK(m < fact[size_t(n)], "perm_lexicographic: index out of range");
  std::vector<uint8_t> unused;
  for (int i = 0; i < n; ++i) unused.push_back(uint8_t(i));
  std::vector<uint8_t> out;
  for (int i = n - 1; i >= 0; --i) {
    const uint64_t d = m / fact[size_t(i)];
    m %= fact[size_t(i)];
    out.push_back(unused[size_t(d)]);
    unused.erase(unused.begin() + int64_t(d));
  }
  return out;
}

const int32_t* perm_table_column(int n, int rank) {
  DQ_CHECK(n >= 3 && n <= kPermTableMaxN, "perm_table_column: n must be in [3, 8]");
  DQ_CHECK(rank >= 0 && rank < n, "perm_table_column: rank out of range");
  static std::mutex mu;
  static auto* cache = new std::map<std::pair<int, int>, std::unique_ptr<std::vector<int32_t>>>();
  std::lock_guard<std::mutex> lk(mu);
  auto& slot = (*cache)[{n, rank}];
  if (!slot) {
    uint64_t nf = 1;
    for (int i = 2; i <= n; ++i) nf *= uint64_t(i);
    auto col = std::make_unique<std::vector<int32_t>>(size_t(nf));
    // Walk the permutations in lexicographic order with next_permutation
    // semantics written out (no per-index Lehmer decoding).
    std::vector<uint8_t> p(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) p[size_t(i)] = uint8_t(i);
    for (uint64_t m = 0; m < nf; ++m) {
      (*col)[size_t(m)] = p[size_t(rank)];
      // next permutation
      int i = n - 2;
      while (i >= 0 && p[size_t(i)] >= p[size_t(i) + 1]) --i;
      if (i < 0) break;
      int j = n - 1;
      while (p[size_t(j)] <= p[size_t(i)]) --j;
      std::swap(p[size_t(i)], p[size_t(j)]);
      for (int a = i + 1, b = n - 1; a < b; ++a, --b) std::swap(p[size_t(a)], p[size_t(b)]);
    }
    slot = std::move(col);
  }
  return slot->data();
}

const uint8_t* perm_table_column8(int n, int rank) {
  const int32_t* col = perm_table_column(n, rank);  // checks n and rank
  static std::mutex mu;
  static auto* cache = new std::map<std::pair<int, int>, std::unique_ptr<std::vector<uint8_t>>>();
  std::lock_guard<std::mutex> lk(mu);
  auto& slot = (*cache)[{n, rank}];
  if (!slot) {
    size_t nf = 1;
    for (int i = 2; i <= n; ++i) nf *= size_t(i);
    auto c8 = std::make_unique<std::vector<uint8_t>>(nf + 3, uint8_t(0));
    for (size_t m = 0; m < nf; ++m) (*c8)[m] = uint8_t(col[m]);
    slot = std::move(c8);
  }
  return slot->data();
}

PermParams make_perm_params(int n, int rank) {
  DQ_CHECK(n >= 1, "permutation: world size must be >= 1");
  DQ_CHECK(rank >= 0 && rank < n, "permutation: rank out of range");
  PermParams p;
  p.n = uint32_t(n);
  p.rank = uint32_t(rank);
  if (n >= 3 && n <= kPermTableMaxN) {
    uint32_t nf = 1;
    for (int i = 2; i <= n; ++i) nf *= uint32_t(i);
    p.nfact = nf;
    p.column = perm_table_column(n, rank);
  }
  return p;
}

}  // namespace dynamiq
