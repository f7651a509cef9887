// The codec registry: the one place a mode is listed. An entry maps
//   name (Config.mode) -> id (CollectiveConfig::mode, part of the wire
//   fingerprint) -> its parameters (params.h: name, type, default, range, doc,
//   fingerprint) -> scheme factory (validates the parameters together, plans)
//   -> the scheme's CPU codec -> per device, the device codec factory.
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

#include "kernels/params.h"
#include "kernels/scheme.h"

namespace dynamiq {

// Builds a mode's scheme from its parameters, resolved (resolve_params: each one checked against
// its declaration, every default filled in): throws Error for a combination the mode rejects
// (group sizes, eps, widths, bits, ...), so that parameters it accepts never fail inside a
// collective for their own sake.
using SchemeFactory = std::function<std::unique_ptr<Scheme>(const ParamSet& params)>;

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

// Adds a mode with its parameters. Throws Error for an empty name or factory, a name or id that
// is taken, id 255 or the name "auto" (mode auto, kModeAuto), and for a parameter named twice or
// whose default its own declaration refuses. Entries stay for the life of the process.
void register_codec(const std::string& name, Mode id, SchemeFactory make_scheme,
                    std::vector<ParamDecl> params = {});
// Adds (mode, device)'s device codec factory. Throws Error for an unknown
// mode, a missing make_codec, or a pair that already has one.
void register_device_codec(std::string_view mode, std::string_view device, DeviceCodecFactory f);

struct ModeInfo {
  std::string name;
  Mode id;
  bool builtin = false;  // registry.cc's own list; false for register_codec's (test-only codecs)
};
// Every registered mode, by id.
std::vector<ModeInfo> registered_modes();
// The id of a registered mode; throws Error naming the registered ones.
Mode mode_id(std::string_view name);
// The name of a registered mode, "?" for an id nobody registered.
const char* mode_name(Mode id);
bool mode_is_registered(Mode id);
// Whether (mode, device) has a device codec (Device::name(): "cuda" once cuda::device() was used).
bool has_device_codec(Mode id, std::string_view device);
// A registered mode's parameter declarations (Error for an unregistered one).
const std::vector<ParamDecl>& mode_params(Mode id);

// The scheme of `mode` for the given parameters: resolve_params, then the mode's factory, then
// Scheme::mode() set. Throws Error for an unregistered mode, a parameter the mode does not
// declare or a value its declaration refuses (naming the mode's parameters), and for a
// combination the factory rejects. (hook/collective/config.h has the CollectiveConfig form.)
std::unique_ptr<Scheme> make_scheme(Mode mode, const ParamSet& given);

// (mode, d.name())'s device codec for the CPU codec `host`, and its device
// local pass. Throw Error when the device has none for the mode.
std::unique_ptr<Codec> make_device_codec(Mode mode, const Codec& host, const Device& d);
bool device_local_pass(Mode mode, const Codec& host, const Device& d, const void* data, DType dtype,
                       int64_t numel, float* host_stats);

}  // namespace dynamiq
