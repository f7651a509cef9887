// The codec registry: see registry.h.
#include "kernels/registry.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>

namespace dynamiq {

// The built-in modes, one line each: name (Config.mode), id (part of the wire
// fingerprint: never renumber or reuse one), the scheme factory and the
// parameter declarations that the codec's folder defines in its *_scheme.cc.
#define DQ_BUILTIN_CODECS(X)                                        \
  X("none", 0, make_identity_scheme, identity_params)               \
  X("dynamiq", 1, make_dynamiq_scheme, dynamiq_params)              \
  X("lossless", 2, make_lossless_scheme, lossless_params)           \
  X("bitsplit", 3, make_bitsplit_scheme, bitsplit_params)           \
  X("bounded", 4, make_bounded_scheme, bounded_params)

#define DQ_DECLARE_FACTORY(name, id, factory, params) \
  std::unique_ptr<Scheme> factory(const ParamSet& p); \
  std::vector<ParamDecl> params();
DQ_BUILTIN_CODECS(DQ_DECLARE_FACTORY)
#undef DQ_DECLARE_FACTORY

namespace {

struct Entry {
  std::string name;
  Mode id;
  SchemeFactory make_scheme;
  std::vector<ParamDecl> params;
  std::map<std::string, DeviceCodecFactory, std::less<>> devices;
  bool builtin = false;  // one of DQ_BUILTIN_CODECS (not register_codec's)
};

class Registry {
 public:
  Registry() {
#define DQ_REGISTER(name, id, factory, params) add(name, Mode(id), factory, params(), true);
    DQ_BUILTIN_CODECS(DQ_REGISTER)
#undef DQ_REGISTER
  }

  void add(const std::string& name, Mode id, SchemeFactory f, std::vector<ParamDecl> params, bool builtin = false) {
    DQ_CHECK(!name.empty(), "register_codec: empty mode name");
    DQ_CHECK(f != nullptr, "register_codec: mode '" + name + "' has no scheme factory");
    for (size_t i = 0; i < params.size(); ++i) {
      const ParamDecl& d = params[i];
      DQ_CHECK(!d.name.empty(), "register_codec: mode '" + name + "': a parameter without a name");
      for (size_t j = 0; j < i; ++j)
        DQ_CHECK(params[j].name != d.name, "register_codec: mode '" + name + "': parameter '" + d.name +
                                               "' is declared twice");
      if (d.has_default) d.check(d.def, d.show(d.def) + " (its default)");
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& e : entries_) {
      DQ_CHECK(e->name != name, "register_codec: mode '" + name + "' is already registered");
      DQ_CHECK(e->id != id, "register_codec: mode '" + name + "': id " + std::to_string(int(id)) +
                                " is taken by mode '" + e->name + "'");
    }
    auto e = std::make_unique<Entry>();
    e->name = name;
    e->id = id;
    e->make_scheme = std::move(f);
    e->params = std::move(params);
    e->builtin = builtin;
    entries_.push_back(std::move(e));
  }

  void add_device(std::string_view mode, std::string_view device, DeviceCodecFactory f) {
    DQ_CHECK(f.make_codec != nullptr, "register_device_codec: no codec factory for mode '" + std::string(mode) +
                                          "' on device '" + std::string(device) + "'");
    std::lock_guard<std::mutex> lock(mu_);
    Entry* e = by_name(mode);
    DQ_CHECK(e != nullptr, "register_device_codec: unknown mode '" + std::string(mode) + "' (registered: " +
                               names_locked() + ")");
    const bool added = e->devices.emplace(std::string(device), std::move(f)).second;
    DQ_CHECK(added, "register_device_codec: mode '" + std::string(mode) + "' already has a codec on device '" +
                        std::string(device) + "'");
  }

  // Entries are never removed or moved, so a pointer stays valid; its name,
  // id and scheme factory never change.
  const Entry* find(Mode id) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& e : entries_)
      if (e->id == id) return e.get();
    return nullptr;
  }

  Mode id_of(std::string_view name) const {
    std::lock_guard<std::mutex> lock(mu_);
    const Entry* e = by_name(name);
    if (!e) throw Error("unknown mode '" + std::string(name) + "' (registered: " + names_locked() + ")");
    return e->id;
  }

  std::vector<ModeInfo> list() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<ModeInfo> out;
    for (const auto& e : entries_) out.push_back({e->name, e->id, e->builtin});
    std::sort(out.begin(), out.end(), [](const ModeInfo& a, const ModeInfo& b) { return a.id < b.id; });
    return out;
  }

  std::string names() const {
    std::lock_guard<std::mutex> lock(mu_);
    return names_locked();
  }

  bool has_device(Mode id, std::string_view device) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& e : entries_)
      if (e->id == id) return e->devices.find(device) != e->devices.end();
    return false;
  }
  // A copy of (mode, device)'s factory (registration may add others meanwhile).
  DeviceCodecFactory device(Mode id, const std::string& device) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& e : entries_) {
      if (e->id != id) continue;
      const auto it = e->devices.find(device);
      if (it == e->devices.end())
        throw Error("mode '" + e->name + "' has no codec for device '" + device + "' in this build");
      return it->second;
    }
    throw Error("mode id " + std::to_string(int(id)) + " is not registered");
  }

 private:
  // Caller holds mu_.
  Entry* by_name(std::string_view name) const {
    for (const auto& e : entries_)
      if (e->name == name) return e.get();
    return nullptr;
  }
  // The registered names by id, comma-separated. Caller holds mu_.
  std::string names_locked() const {
    std::vector<std::pair<Mode, std::string>> v;
    for (const auto& e : entries_) v.emplace_back(e->id, e->name);
    std::sort(v.begin(), v.end());
    std::ostringstream s;
    for (size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i].second;
    return s.str();
  }

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Entry>> entries_;
};

// Built on first use (so registration from static initialisers of other
// translation units works); never destroyed (threads may still use it at exit).
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

}  // namespace

void register_codec(const std::string& name, Mode id, SchemeFactory make_scheme, std::vector<ParamDecl> params) {
  DQ_CHECK(id != kModeAuto && name != "auto", "register_codec: id 255 and the name 'auto' are mode auto's");
  registry().add(name, id, std::move(make_scheme), std::move(params));
}

void register_device_codec(std::string_view mode, std::string_view device, DeviceCodecFactory f) {
  registry().add_device(mode, device, std::move(f));
}

std::vector<ModeInfo> registered_modes() { return registry().list(); }

Mode mode_id(std::string_view name) { return registry().id_of(name); }

const char* mode_name(Mode id) {
  const Entry* e = registry().find(id);
  return e ? e->name.c_str() : "?";
}

bool mode_is_registered(Mode id) { return registry().find(id) != nullptr; }

bool has_device_codec(Mode id, std::string_view device) { return registry().has_device(id, device); }

const std::vector<ParamDecl>& mode_params(Mode id) {
  const Entry* e = registry().find(id);
  if (!e)
    throw Error("mode id " + std::to_string(int(id)) + " is not available in this build (registered modes: " +
                registry().names() + ")");
  return e->params;
}

std::unique_ptr<Scheme> make_scheme(Mode mode, const ParamSet& given) {
  const Entry* e = registry().find(mode);
  if (!e) {
    if (mode == kModeAuto)  // (callers resolve auto to its candidates first)
      throw Error("mode 'auto' is not a codec: it picks one of auto_lossy, lossless and none per bucket");
    throw Error("mode id " + std::to_string(int(mode)) + " is not available in this build (registered modes: " +
                registry().names() + ")");
  }
  std::unique_ptr<Scheme> s = e->make_scheme(resolve_params(e->params, given, e->name));
  DQ_CHECK(s != nullptr, "mode '" + e->name + "': the scheme factory returned no scheme");
  s->mode_ = mode;
  return s;
}

std::unique_ptr<Codec> make_device_codec(Mode mode, const Codec& host, const Device& d) {
  return registry().device(mode, d.name()).make_codec(host, d);
}

bool device_local_pass(Mode mode, const Codec& host, const Device& d, const void* data, DType dtype,
                       int64_t numel, float* host_stats) {
  const DeviceCodecFactory f = registry().device(mode, d.name());
  if (!f.local_pass)
    throw Error(std::string("mode '") + mode_name(mode) + "' has no local pass for device '" + d.name() +
                "' in this build");
  return f.local_pass(host, d, data, dtype, numel, host_stats);
}

}  // namespace dynamiq
