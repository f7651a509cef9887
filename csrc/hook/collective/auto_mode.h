// Mode "auto": per bucket, one of the lossy mode (cfg.auto_lossy at cfg.bits),
// lossless and none, whichever a cost model predicts fastest. Every rank
// takes the same decision: it depends only on the config, the world size,
// the bucket's size and dtype, and numbers the ranks share through the
// header exchange (each rank puts its own measurements in the header's block of
// kHeaderSums numbers, zero in other modes so that every header has one length;
// the group's first bucket shares them in a header of its own before deciding;
// the mean over the ranks is what every rank uses for the next bucket):
//   link: bandwidth B (bytes/s a rank sends) from the execute time of the
//         group's mode-none buckets of >= 1 MB, latency L from the fastest
//         header exchange seen (or cfg.auto_bandwidth / auto_latency);
//   codec: per element costs of the lossy mode's local pass and kernels and
//         its wire bits per coordinate, and lossless's kernels and bits,
//         from a calibration all-reduce of 2^20 Gaussian float32 elements
//         over two in-process ranks, run once per process and config
//         (calibrate_codec; zero kernel cost for device buckets, not
//         measured there);
//   correction: per mode, measured / predicted time of its last bucket of
//         >= 1 MB (1 until the mode has run).
// For n ranks, N elements of e bytes, f = 2(n-1)/n (bytes a ring sends per
// byte of bucket), R the topology's rounds (ring 2(n-1), butterfly 2 log2 n,
// two-step 2), R_meta those of the statistics' all-reduce:
//   none:     R L + f N e / B
//   lossless: R L + f N bits_ll/8 / B + f N k_ll
//   lossy:    (R + R_meta) L + f N bits/8 / B + N local + f N k
// (kernels and wire added, not overlapped: a conservative model), each times
// its correction. Hysteresis: the previous choice stays unless another mode is
// predicted more than kAutoHysteresis (10 %) faster (measurements under load
// are noisy; near-equal modes would otherwise alternate). Re-probe: a mode's
// correction is measured only when it runs, so a mode the model underrates
// would never run again; once a mode has not run for kAutoReprobeBuckets
// predicted buckets of >= 1 MB and is predicted within kAutoReprobeSlack of
// the choice, the next such bucket runs it (at most one extra bucket in 64,
// each predicted at most 1.5x the choice's time). The group's first
// bucket runs none (no link measured yet,
// unless auto_bandwidth is given), and so does a bucket below
// min_compress_numel. Ties go to none, then lossless.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "hook/collective/collective.h"

namespace dynamiq {

constexpr double kAutoHysteresis = 0.10;
constexpr int64_t kAutoReprobeBuckets = 64;
constexpr double kAutoReprobeSlack = 1.5;

// Seconds per element, bits per coordinate (float32 calibration, see above).
struct CodecCost {
  double local = 0.0;   // local pass (statistics), per element
  double kernel = 0.0;  // codec kernels and plan of a 2-rank all-reduce, per element
  double bits = 32.0;   // wire bits per coordinate
};

// The codec cost of cfg.mode on this machine: measured at first use for each
// config (fingerprint), then cached for the process. Thread-safe.
CodecCost calibrate_codec(const CollectiveConfig& cfg);

// Per group (one per process group and config): kept by the caller across
// collectives, updated identically on every rank.
struct AutoState {
  // shared: the ranks' means from the last header (identical on every rank)
  bool shared = false;       // a header (or the first call's exchange) was absorbed
  double bandwidth = 0.0;    // 0: not measured yet
  double latency = 0.0;
  CodecCost lossy, lossless;
  double correction[3] = {1.0, 1.0, 1.0};  // none, lossless, lossy
  // this rank's own numbers, sent with the next header
  bool calibrated = false;
  CodecCost my_lossy, my_lossless;
  double my_bandwidth = 0.0;  // last sample (0: none yet)
  double my_latency = 0.0;    // fastest header exchange seen (0: none yet)
  double my_correction[3] = {0.0, 0.0, 0.0};  // 0: no sample
  int64_t calls = 0;
  int last_choice = -1;  // index (none, lossless, lossy) of the last predicted choice (shared: same on every rank)
  // per mode, predicted buckets of >= 1 MB since it last ran one (shared: from the agreed choices)
  int64_t since_run[3] = {0, 0, 0};
  std::unique_ptr<AutoState> inter;  // topology hierarchical: the inter-node ring's state

  std::vector<int64_t> report() const;       // this rank's numbers, as header sums
  void absorb(const std::vector<int64_t>& sums);  // the ranks' sums -> shared means
};

AutoState& inter_auto_state(AutoState& s);

struct AutoPrediction {
  Mode modes[3];         // none, lossless, lossy
  double seconds[3];     // predicted (corrected); 0 when not predicted
  int choice = 0;        // index into modes
  bool predicted = false;  // false: a rule chose (first call, tiny bucket)
  bool reprobe = false;    // the choice is a re-probe of a mode that has not run for a while
};

// The decision for a bucket from the shared numbers alone.
AutoPrediction auto_predict(const AutoState& s, const CollectiveConfig& cfg, int world, int64_t numel, DType dtype);

// all_reduce for cfg.mode == kModeAuto (not hierarchical: that runs this for
// its inter-node rings).
CallStats auto_all_reduce(Transport& tr, const CollectiveConfig& cfg, const CallArgs& a);

}  // namespace dynamiq
