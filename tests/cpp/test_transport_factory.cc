// The transport factory (hook/transport/transport_factory.h): which entry
// carries a tensor over a group with given backends, the refusal of the
// backends it does not serve (named, with what it serves), and the message
// semantics each entry declares as the executor uses them: a world that
// matches messages as the entry says (exact-size receives, posting order)
// runs lossless with two-part messages and the NCCL posting for NCCL, one-part
// messages for Gloo, and the same bits either way.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "hook/collective/collective.h"
#include "hook/transport/inproc_transport.h"
#include "hook/transport/transport_factory.h"

namespace dynamiq {
namespace {

std::string refusal(const GroupBackends& b, const char* device, bool staging = false) {
  try {
    choose_transport(b, device, staging);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TransportFactory, BackendStringsAsTorchWritesThem) {
  EXPECT_EQ(parse_backend_config("gloo"), (GroupBackends{{"cpu", "gloo"}, {"cuda", "gloo"}}));
  EXPECT_EQ(parse_backend_config("cpu:gloo,cuda:nccl"), (GroupBackends{{"cpu", "gloo"}, {"cuda", "nccl"}}));
  EXPECT_EQ(parse_backend_config(" CPU:Gloo , cuda:NCCL "), (GroupBackends{{"cpu", "gloo"}, {"cuda", "nccl"}}));
  EXPECT_EQ(parse_backend_config("cuda:nccl"), (GroupBackends{{"cuda", "nccl"}}));
  EXPECT_TRUE(parse_backend_config("").empty());
}

TEST(TransportFactory, EachBackendAndDeviceGetsItsEntry) {
  const GroupBackends gloo{{"cpu", "gloo"}, {"cuda", "gloo"}}, nccl{{"cuda", "nccl"}},
      both{{"cpu", "gloo"}, {"cuda", "nccl"}};
  const TransportEntry& g = choose_transport(gloo, "cpu", false);
  EXPECT_EQ(g.describe(), "gloo (cpu)");
  EXPECT_FALSE(g.semantics.ordered);
  EXPECT_TRUE(g.semantics.shorter_receives);
  const TransportEntry& n = choose_transport(both, "cuda", false);
  EXPECT_EQ(n.describe(), "nccl (cuda)");
  EXPECT_TRUE(n.semantics.ordered);
  EXPECT_FALSE(n.semantics.shorter_receives);
  EXPECT_TRUE(n.coalesced);
  EXPECT_EQ(&choose_transport(nccl, "cuda", false), &n);
  // CUDA tensors over Gloo: staged through host memory, asked for or not
  for (const GroupBackends* b : {&gloo, &both}) {
    const TransportEntry& s = choose_transport(*b, "cuda", true);
    EXPECT_EQ(s.describe(), "gloo (cuda, staged through host memory)");
    EXPECT_TRUE(s.host_staging);
    EXPECT_EQ(s.semantics.shorter_receives, g.semantics.shorter_receives) << "Gloo moves the staged bytes";
  }
  EXPECT_TRUE(choose_transport(gloo, "cuda", false).host_staging);
  EXPECT_EQ(transport_entries().size(), 3u);
}

TEST(TransportFactory, UnservedBackendsAreRefusedNamingThemAndWhatIsServed) {
  const std::string served = "dynamiq sends over gloo (cpu), nccl (cuda), gloo (cuda, staged through host memory)";
  for (const char* name : {"ucc", "mpi", "fake"})
    for (const char* dev : {"cpu", "cuda"}) {
      const std::string e = refusal(parse_backend_config(name), dev);
      EXPECT_NE(e.find(std::string("cannot send ") + dev + " tensors over this process group (backends: cpu:" +
                       name + ",cuda:" + name + ")"),
                std::string::npos)
          << e;
      EXPECT_NE(e.find(served), std::string::npos) << e;
      EXPECT_NE(e.find(std::string("backend '") + name + "' is not supported"), std::string::npos) << e;
    }
  // known backends on the wrong device: refused without blaming them
  const std::string cpu_on_nccl = refusal({{"cuda", "nccl"}}, "cpu");
  EXPECT_NE(cpu_on_nccl.find("(backends: cuda:nccl)"), std::string::npos) << cpu_on_nccl;
  EXPECT_EQ(cpu_on_nccl.find("not supported"), std::string::npos) << cpu_on_nccl;
  EXPECT_NE(refusal({{"cuda", "nccl"}}, "cuda", true).find("cannot send cuda tensors with host staging"),
            std::string::npos);
  EXPECT_NE(refusal({{"cpu", "gloo"}}, "xpu").find("cannot send xpu tensors"), std::string::npos);
  // a UCC side the entry does not need is left alone
  EXPECT_EQ(choose_transport({{"cpu", "gloo"}, {"cuda", "ucc"}}, "cuda", false).describe(),
            "gloo (cuda, staged through host memory)");
}

struct PostingRun {
  std::vector<std::vector<float>> out;
  int64_t posted = 0;      // transport messages
  int64_t codec_msgs = 0;  // messages the executor counts (a two-part message once)
  std::vector<std::string> order_violations;
  std::string deadlock;
};

// A lossless all-reduce over a world that matches messages as `s` declares.
PostingRun run_as(const MessageSemantics& s, const std::vector<std::vector<float>>& in) {
  const int n = int(in.size());
  PostingRun r;
  r.out = in;
  InprocWorld world(n, std::chrono::seconds(60));
  world.set_posts_in_order(s.ordered);
  world.set_accepts_shorter_messages(s.shorter_receives);
  std::vector<int64_t> msgs(size_t(n), 0);
  world.run([&](int rank, Transport& t) {
    EXPECT_EQ(t.sends_whole_messages(), !s.ordered && s.shorter_receives);
    CollectiveConfig cfg;
    cfg.mode = mode_id("lossless");
    cfg.block_bytes = 4096;
    CallArgs a;
    a.data = r.out[size_t(rank)].data();
    a.numel = int64_t(r.out[size_t(rank)].size());
    msgs[size_t(rank)] = all_reduce(t, cfg, a).messages_sent;
  });
  r.posted = world.messages_posted();
  for (int64_t m : msgs) r.codec_msgs += m;
  if (s.ordered) {
    r.order_violations = world.nccl_order_violations();
    r.deadlock = world.nccl_stream_deadlock();
  }
  return r;
}

TEST(TransportFactory, TheExecutorPostsAsEachEntryDeclares) {
  const int n = 3;
  std::mt19937 g(5);
  std::normal_distribution<float> d(0.f, 1e-3f);
  std::vector<std::vector<float>> in(size_t(n), std::vector<float>(20011));
  for (auto& v : in)
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = d(g);
      if (i % 13 == 0) {  // a random bit pattern: exponents the code table lacks, escapes (second parts)
        const uint32_t w = uint32_t(g()) & 0xBFFFFFFFu;  // (finite)
        std::memcpy(&v[i], &w, 4);
      }
    }
  const PostingRun gloo = run_as(choose_transport({{"cpu", "gloo"}}, "cpu", false).semantics, in);
  const PostingRun nccl = run_as(choose_transport({{"cuda", "nccl"}}, "cuda", false).semantics, in);
  EXPECT_EQ(gloo.posted, gloo.codec_msgs) << "Gloo: a two-part message travels as one";
  EXPECT_GT(nccl.posted, nccl.codec_msgs) << "exact-size receives: second parts travel on their own";
  EXPECT_EQ(nccl.codec_msgs, gloo.codec_msgs);
  EXPECT_TRUE(nccl.order_violations.empty()) << nccl.order_violations[0];
  EXPECT_EQ(nccl.deadlock, "");
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(0, std::memcmp(gloo.out[size_t(r)].data(), nccl.out[size_t(r)].data(), in[0].size() * 4)) << r;
}

}  // namespace
}  // namespace dynamiq
