// The codec registry (kernels/registry.h): the built-in modes keep the ids
// the wire fingerprint was recorded with, bad registrations are refused, and
// a device's codecs and statistics pass come from the registry: a test
// device whose memory is host memory and whose registered codecs are the CPU
// ones runs the driver's device path and gives the host path's bits.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "hook/collective/collective.h"
#include "hook/transport/inproc_transport.h"
#include "kernels/bitsplit/bitsplit_codec.h"
#include "kernels/dynamiq/dynamiq_codec.h"
#include "kernels/dynamiq/dynamiq_stats.h"
#include "kernels/identity/identity_codec.h"
#include "hook/collective/config.h"
#include "kernels/registry.h"

namespace dynamiq {
namespace {

TEST(Registry, BuiltInModesKeepTheirWireIds) {
  const std::vector<std::pair<std::string, int>> builtin = {{"none", 0}, {"dynamiq", 1}, {"lossless", 2}, {"bitsplit", 3}, {"bounded", 4}};
  const std::vector<ModeInfo> listed = registered_modes();
  ASSERT_GE(listed.size(), builtin.size());
  for (size_t i = 0; i < builtin.size(); ++i) {
    const auto& [name, id] = builtin[i];
    EXPECT_EQ(listed[i].name, name);  // by id: the built-ins first
    EXPECT_EQ(int(listed[i].id), id);
    EXPECT_EQ(int(mode_id(name)), id);
    EXPECT_EQ(mode_name(Mode(id)), name);
    CollectiveConfig c;
    c.mode = Mode(id);
    if (name == "bounded") c.params.set("error_bound", double(1e-3));  // its scheme needs a bound
    EXPECT_EQ(make_scheme(c)->mode(), Mode(id)) << name;
  }
  EXPECT_EQ(kModeNone, mode_id("none"));
  EXPECT_EQ(CollectiveConfig().mode, mode_id("none"));
  EXPECT_TRUE(make_scheme(CollectiveConfig())->identity());
  for (const char* m : {"dynamiq", "lossless", "bitsplit"}) {
    CollectiveConfig c;
    c.mode = mode_id(m);
    EXPECT_FALSE(make_scheme(c)->identity()) << m;
  }
}

TEST(Registry, RefusesBadRegistrationsAndUnknownModes) {
  const SchemeFactory f = [](const ParamSet&) { return make_scheme(kModeNone, ParamSet()); };
  EXPECT_THROW(register_codec("dynamiq", Mode(201), f), Error);  // name taken
  EXPECT_THROW(register_codec("registry-test", Mode(1), f), Error);  // id taken
  EXPECT_THROW(register_codec("", Mode(202), f), Error);
  EXPECT_THROW(register_codec("registry-test", Mode(203), nullptr), Error);
  EXPECT_EQ(std::string(mode_name(Mode(201))), "?");  // nothing was added
  try {
    mode_id("no-such-mode");
    ADD_FAILURE() << "mode_id accepted an unknown name";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("none, dynamiq, lossless, bitsplit"), std::string::npos) << e.what();
  }
  CollectiveConfig c;
  c.mode = Mode(250);
  EXPECT_THROW(make_scheme(c), Error);
  DeviceCodecFactory d;
  d.make_codec = [](const Codec&, const Device&) { return std::make_unique<IdentityCodec>(); };
  EXPECT_THROW(register_device_codec("no-such-mode", "registry-test", d), Error);
  EXPECT_THROW(register_device_codec("none", "registry-test", DeviceCodecFactory()), Error);  // no make_codec
}

// Host memory, CPU codecs: the device path without a device.
class HostTestDevice final : public Device {
 public:
  HostTestDevice() {
    static const bool registered = [] {
      DeviceCodecFactory id;
      id.make_codec = [](const Codec&, const Device& d) {
        ++static_cast<const HostTestDevice&>(d).codecs_made;
        return std::make_unique<IdentityCodec>();
      };
      register_device_codec("none", "host-test", id);
      DeviceCodecFactory bs;
      bs.make_codec = [](const Codec& host, const Device& d) {
        ++static_cast<const HostTestDevice&>(d).codecs_made;
        return std::make_unique<BitsplitCodec>(host_codec_as<BitsplitCodec>(host).params());
      };
      register_device_codec("bitsplit", "host-test", bs);
      DeviceCodecFactory dq;
      dq.make_codec = [](const Codec& host, const Device& d) {
        ++static_cast<const HostTestDevice&>(d).codecs_made;
        return std::make_unique<DynamiqCodec>(host_codec_as<DynamiqCodec>(host).params());
      };
      dq.local_pass = [](const Codec& host, const Device& d, const void* data, DType dtype, int64_t numel,
                         float* stats) {
        ++static_cast<const HostTestDevice&>(d).stats_passes;
        return dynamiq_local_stats(data, dtype, numel, host_codec_as<DynamiqCodec>(host).params().fmt.S, stats);
      };
      register_device_codec("dynamiq", "host-test", dq);
      return true;  // (no "lossless": a mode this device lacks)
    }();
    (void)registered;
  }
  std::string name() const override { return "host-test"; }
  const Memory& memory() const override { return host_memory(); }
  void* stream() const override { return nullptr; }
  bool has_nonfinite(const void* data, DType dtype, int64_t numel) const override {
    ++scans;
    return dynamiq::has_nonfinite(data, dtype, numel);
  }
  mutable std::atomic<int> codecs_made{0}, stats_passes{0}, scans{0};
};

std::vector<std::vector<float>> run(const CollectiveConfig& cfg, int n, const Device* device, int64_t numel,
                                    std::vector<std::string>* errors = nullptr) {
  std::vector<std::vector<float>> x(static_cast<size_t>(n), std::vector<float>(static_cast<size_t>(numel)));
  std::mt19937 g(5);
  std::normal_distribution<float> d(0.f, 1.f);
  for (auto& v : x)
    for (auto& e : v) e = d(g);
  InprocWorld world(n, std::chrono::seconds(30));
  world.run([&](int r, Transport& t) {
    CallArgs a;
    a.data = x[size_t(r)].data();
    a.numel = numel;
    a.seq = 3;
    a.device = device;
    try {
      all_reduce(t, cfg, a);
    } catch (const Error& e) {
      if (!errors) throw;
      (*errors)[size_t(r)] = e.what();
    }
  });
  return x;
}

TEST(Registry, TheDevicePathUsesTheRegisteredDeviceCodecs) {
  const HostTestDevice dev;
  const int n = 3;
  const int64_t numel = 256 * 30 + 7;
  for (const char* m : {"none", "bitsplit", "dynamiq"}) {
    SCOPED_TRACE(m);
    CollectiveConfig cfg;
    cfg.mode = mode_id(m);
    if (std::string(m) != "none") cfg.params.set("bits", 4.0);
    cfg.block_bytes = 4096;
    const int made = dev.codecs_made, passes = dev.stats_passes, scans = dev.scans;
    EXPECT_EQ(run(cfg, n, &dev, numel), run(cfg, n, nullptr, numel));  // bit for bit
    EXPECT_GT(dev.codecs_made, made);
    EXPECT_EQ(dev.stats_passes > passes, std::string(m) == "dynamiq");  // the registered statistics pass
    EXPECT_EQ(dev.scans > scans, std::string(m) == "bitsplit");          // the device's non-finite scan
  }
  // A mode without a codec for the device: every rank raises, none hangs.
  CollectiveConfig cfg;
  cfg.mode = mode_id("lossless");
  std::vector<std::string> errors(static_cast<size_t>(n));
  run(cfg, n, &dev, numel, &errors);
  for (int r = 0; r < n; ++r) EXPECT_NE(errors[size_t(r)].find("has no codec for device 'host-test'"), std::string::npos)
      << "rank " << r << ": " << errors[size_t(r)];
}

}  // namespace
}  // namespace dynamiq
