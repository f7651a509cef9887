// Shared definitions for the torch-free kernel layer: host/device qualifiers,
// element types, and the error type every layer above propagates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#if defined(__CUDACC__)
#define DQ_HD __host__ __device__ __forceinline__
#define DQ_DEVICE __device__ __forceinline__
#else
#define DQ_HD inline
#define DQ_DEVICE inline
#endif

namespace dynamiq {

// Element type of a bucket. Values are part of the config fingerprint: never renumber.
enum class DType : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

DQ_HD int dtype_size(DType t) { return t == DType::kF32 ? 4 : 2; }

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "float32";
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
  }
  return "?";
}

// Every failure inside the core (bad config, malformed message, transport
// error, timeout) is reported as this exception; the Python binding turns it
// into a RuntimeError subclass with the same message. Nothing in the core
// aborts the process: an abort would leave the peers blocked in recv.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A message from a peer that fails validation (size, header, offsets).
class MalformedMessage : public Error {
 public:
  explicit MalformedMessage(const std::string& what) : Error("malformed message: " + what) {}
};

#define DQ_CHECK(cond, msg)                                  \
  do {                                                       \
    if (!(cond)) throw ::dynamiq::Error(std::string(msg));   \
  } while (0)

template <typename T>
DQ_HD T ceil_div(T a, T b) { return (a + b - 1) / b; }

}  // namespace dynamiq
