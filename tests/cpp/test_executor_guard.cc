// The executor's own bound on a two-part message's announced dynamic size (executor.cc,
// "dynamic part larger than its bound"). Every codec's dynamic_bytes must validate the static
// part and stay within max_dynamic_bytes (codec.h); the executor checks it again before it
// posts the second part's receive into a buffer sized for that bound, so a codec that breaks
// the contract cannot make a peer's bytes overflow the buffer. Mutation #13 of
// scripts/mutate/mutants.txt (the check removed) survived the suite, whose only two-part codec
// (lossless) validates the size itself; this test uses a codec that does not.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "hook/collective/executor.h"
#include "hook/collective/schedule.h"
#include "hook/transport/inproc_transport.h"
#include "kernels/lossless/lossless_codec.h"

namespace dynamiq {
namespace {

// The lossless codec, except that dynamic_bytes returns the header's field unchecked, and the
// liar's compress announces (and sends) a dynamic part 64 bytes longer than the bound.
class UncheckedTwoPartCodec final : public Codec {
 public:
  explicit UncheckedTwoPartCodec(bool liar) : liar_(liar) {}
  std::string name() const override { return "unchecked-two-part"; }
  size_t static_bytes(const Plan& p, const Block& b) const override { return in_.static_bytes(p, b); }
  size_t max_dynamic_bytes(const Plan& p, const Block& b) const override {
    return in_.max_dynamic_bytes(p, b) + (liar_ ? kExtra : 0);
  }
  size_t dynamic_bytes(const uint8_t* static_part, const Plan&, const Block&) const override {
    uint32_t d;
    std::memcpy(&d, static_part + 8, 4);  // lossless header: dynamic_bytes at [8, 12)
    return d;
  }
  size_t compress(const Local& x, const Plan& p, const Block& b, const RngCtx& rng, uint8_t* out) const override {
    const size_t n = in_.compress(x, p, b, rng, out);
    if (!liar_) return n;
    const uint32_t d = uint32_t(in_.max_dynamic_bytes(p, b) + kExtra);  // past the honest bound
    std::memcpy(out + 8, &d, 4);
    const uint16_t crc = lossless::crc16(out, lossless::kHeaderBytes - 2);
    std::memcpy(out + lossless::kHeaderBytes - 2, &crc, 2);
    const size_t total = in_.static_bytes(p, b) + d;  // within this codec's (inflated) buffer
    std::memset(out + n, 0, total - n);
    return total;
  }
  void decompress(const uint8_t* in, size_t n, const Plan& p, const Block& b, const Output& y) const override {
    in_.decompress(in, n, p, b, y);
  }
  void decompress_accumulate(const uint8_t* in, size_t n, const Local& x, const Plan& p, const Block& b,
                             float* acc) const override {
    in_.decompress_accumulate(in, n, x, p, b, acc);
  }
  size_t decompress_accumulate_recompress(const uint8_t* in, size_t n, const Local& x, const Plan& p,
                                          const Block& b, const RngCtx& rng, uint8_t* out) const override {
    return in_.decompress_accumulate_recompress(in, n, x, p, b, rng, out);
  }

 private:
  static constexpr size_t kExtra = 64;
  LosslessCodec in_;
  bool liar_;
};

TEST(ExecutorGuard, AnnouncedDynamicPartBeyondItsBoundIsMalformed) {
  const int n = 2;
  const int64_t numel = 4096;
  const Plan plan = make_lossless_plan(DType::kF32, numel, n);
  const BlockTable bt = make_blocks(plan, 4096);
  InprocWorld world(n, std::chrono::seconds(10));  // exact receive sizes: the parts travel apart
  std::vector<std::string> errors(n);
  std::vector<int> malformed(n, 0);
  world.run([&](int r, Transport& t) {
    const UncheckedTwoPartCodec codec(/*liar=*/r == 0);
    std::vector<float> x(static_cast<size_t>(numel), float(r + 1));
    const Program prog = make_program(kTopologyRing, r, n, bt);
    ExecArgs ea;
    ea.bucket = x.data();
    ea.out.bucket = x.data();
    ExecStats st;
    try {
      execute(t, codec, plan, bt, prog, ea, st);
    } catch (const MalformedMessage& e) {
      malformed[size_t(r)] = 1;
      errors[size_t(r)] = e.what();
      world.fail(r, e.what());
    } catch (const Error& e) {
      errors[size_t(r)] = e.what();
      world.fail(r, e.what());
    }
  });
  // rank 1 receives the inflated announcement first and must refuse it
  EXPECT_EQ(malformed[1], 1) << errors[1];
  EXPECT_NE(errors[1].find("dynamic part larger than its bound"), std::string::npos) << errors[1];
}

}  // namespace
}  // namespace dynamiq
