// host_memory(): see codec.h.
#include <cstring>
#include <new>

#include "kernels/codec.h"

namespace dynamiq {
namespace {

class HostMemory final : public Memory {
 public:
  std::string name() const override { return "host"; }
  void* allocate(size_t bytes) const override { return ::operator new[](bytes > 0 ? bytes : 1); }
  void release(void* p) const override { ::operator delete[](p); }
  void to_host(void* dst, const void* src, size_t bytes) const override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void from_host(void* dst, const void* src, size_t bytes) const override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
};

}  // namespace

const Memory& host_memory() {
  static const HostMemory m;
  return m;
}

}  // namespace dynamiq
