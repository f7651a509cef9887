#include "hook/transport/sub_transport.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace dynamiq {

SubTransport::SubTransport(Transport& parent, std::vector<int> members, const Memory* memory)
    : parent_(parent), members_(std::move(members)), memory_(memory) {
  DQ_CHECK(!members_.empty(), "SubTransport: no members");
  for (size_t i = 0; i < members_.size(); ++i) {
    DQ_CHECK(members_[i] >= 0 && members_[i] < parent_.size(), "SubTransport: member out of range");
    DQ_CHECK(std::count(members_.begin(), members_.end(), members_[i]) == 1, "SubTransport: repeated member");
    if (members_[i] == parent_.rank()) rank_ = int(i);
  }
  DQ_CHECK(rank_ >= 0, "SubTransport: the calling rank is not a member");
}

void SubTransport::allreduce_sum_i64(int64_t* data, size_t count) {
  const int n = size();
  if (n == 1 || count == 0) return;
  const size_t bytes = count * sizeof(int64_t);
  // slot i: member i's vector (own slot: this rank's)
  std::vector<int64_t> all(size_t(n) * count);
  std::memcpy(all.data() + size_t(rank_) * count, data, bytes);
  void* buf = all.data();
  if (memory_) {
    buf = memory_->allocate(all.size() * sizeof(int64_t));
    memory_->from_host(buf, all.data(), all.size() * sizeof(int64_t));
  }
  try {
    std::vector<std::unique_ptr<Request>> reqs;
    group_start();
    for (int i = 1; i < n; ++i) {
      const int dst = (rank_ + i) % n, src = (rank_ - i + n) % n;
      uint8_t* b = static_cast<uint8_t*>(buf);
      reqs.push_back(isend(b + size_t(rank_) * bytes, bytes, dst, kSubAllreduceTag));
      reqs.push_back(irecv(b + size_t(src) * bytes, bytes, src, kSubAllreduceTag));
    }
    group_end();
    for (auto& r : reqs) r->wait();
  } catch (...) {
    // a device buffer receives may still write into is leaked, never freed
    throw;
  }
  if (memory_) {
    memory_->to_host(all.data(), buf, all.size() * sizeof(int64_t));
    memory_->release(buf);
  }
  for (size_t k = 0; k < count; ++k) {
    int64_t s = 0;
    for (int i = 0; i < n; ++i) s += all[size_t(i) * count + k];
    data[k] = s;
  }
}

}  // namespace dynamiq
