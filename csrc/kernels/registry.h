// The codec registry: the one place a mode is listed. An entry maps
//   name (Config.mode) -> id (CollectiveConfig::mode, part of the wire
//   fingerprint) -> scheme factory (validates the config, plans) -> the
//   scheme's CPU codec -> per device, the device codec factory.
// The built-in modes are one line each in registry.cc; the CUDA library adds
// their CUDA codecs (registry_cuda.cu, when the CUDA device is first used), so
// the torch-free core needs no CUDA. register_codec adds a mode at run time
// (tests/cpp/negate_codec registers a test-only codec this way).
// docs/architecture.md "Adding a codec" has the steps.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hook/collective/config.h"
#include "kernels/scheme.h"

namespace dynamiq {

// Builds a mode's scheme for a config: throws Error for a config the mode
// rejects (group sizes, eps, widths, bits, ...), so that a config it accepts
// never fails inside a collective for its own sake.
using SchemeFactory = std::function<std::unique_ptr<Scheme>(const CollectiveConfig& cfg)>;

// A mode's part on one kind of device (Device::name()), registered by that
// device's library.
struct DeviceCodecFactory {
  // The device version of the scheme's CPU codec `host` (same wire bytes),
  // running on d.stream().
  std::function<std::unique_ptr<Codec>(const Codec& host, const Device& d)> make_codec;
  // The scheme's local pass on device data, with Scheme::local_pass's
  // contract (statistics written to host memory). Only a mode whose scheme
  // has statistics needs one; the others take Device::has_nonfinite.
  std::function<bool(const Codec& host, const Device& d, const void* data, DType dtype, int64_t numel,
                     float* host_stats)>
      local_pass;
};

// `host` as the CPU codec class C a device codec factory is written for
// (Error if the scheme's codec is another).
template <class C>
const C& host_codec_as(const Codec& host) {
  const C* c = dynamic_cast<const C*>(&host);
  if (c == nullptr) throw Error("device codec factory: unexpected CPU codec '" + host.name() + "'");
  return *c;
}

// Adds a mode. Throws Error for an empty name or factory, or a name or id
// that is taken, and for id 255 or the name "auto" (mode auto, config.h kModeAuto).
// Entries stay for the life of the process.
void register_codec(const std::string& name, Mode id, SchemeFactory make_scheme);
// Adds (mode, device)'s device codec factory. Throws Error for an unknown
// mode, a missing make_codec, or a pair that already has one.
void register_device_codec(std::string_view mode, std::string_view device, DeviceCodecFactory f);

struct ModeInfo {
  std::string name;
  Mode id;
};
// Every registered mode, by id.
std::vector<ModeInfo> registered_modes();
// The id of a registered mode; throws Error naming the registered ones.
Mode mode_id(std::string_view name);
// The name of a registered mode, "?" for an id nobody registered.
const char* mode_name(Mode id);

// The scheme of cfg.mode (its factory, then Scheme::mode() set to cfg.mode).
// Throws Error for an unregistered mode and for a config the mode rejects.
std::unique_ptr<Scheme> make_scheme(const CollectiveConfig& cfg);

// (mode, d.name())'s device codec for the CPU codec `host`, and its device
// local pass. Throw Error when the device has none for the mode.
std::unique_ptr<Codec> make_device_codec(Mode mode, const Codec& host, const Device& d);
bool device_local_pass(Mode mode, const Codec& host, const Device& d, const void* data, DType dtype,
                       int64_t numel, float* host_stats);

}  // namespace dynamiq
