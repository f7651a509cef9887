// What one run of the executor counts and times. The driver's CallStats
// extends it (collective.h), so the executor adds into a call's stats directly
// and slices of a bucket add up with ExecStats::add.
#pragma once

#include <cstdint>

namespace dynamiq {

struct ExecStats {
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  int64_t messages_sent = 0;  // block messages (a two-part message counts once)
  double t_kernel = 0.0;  // seconds inside codec kernels
  double t_wait = 0.0;    // seconds blocked waiting for the network
  double t_post = 0.0;    // seconds inside the transport's isend/irecv/test calls

  // Adds another run's counts and times (the one place that lists the fields).
  void add(const ExecStats& o) {
    bytes_sent += o.bytes_sent;
    bytes_received += o.bytes_received;
    messages_sent += o.messages_sent;
    t_kernel += o.t_kernel;
    t_wait += o.t_wait;
    t_post += o.t_post;
  }
};

}  // namespace dynamiq
