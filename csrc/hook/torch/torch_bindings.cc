// Python bindings: argument checks, dtype mapping, GIL release. Everything
// else lives in the torch-free core.
#include <torch/extension.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "kernels/dynamiq/dynamiq_codec.h"
#include "kernels/dynamiq/dynamiq_format.h"
#include "kernels/lossless/lossless_codec.h"
#include "kernels/base/parallel.h"
#include "kernels/base/cpu_isa.h"
#include "hook/collective/auto_mode.h"
#include "hook/collective/collective.h"
#include "hook/transport/inproc_transport.h"
#include "hook/transport/staging_transport.h"
#include "hook/torch/registry_bindings.h"
#include "hook/torch/torch_c10d_transport.h"
#ifdef DYNAMIQ_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "kernels/base/cuda/cuda_device.h"
#include "kernels/base/cuda/cuda_memory.h"
#endif

namespace py = pybind11;
using namespace dynamiq;

namespace {

DType to_dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kF32;
    case at::kBFloat16: return DType::kBF16;
    case at::kHalf: return DType::kF16;
    default: throw Error(std::string("dynamiq: unsupported dtype ") + c10::toString(t.scalar_type()));
  }
}

ReduceOp to_op(const std::string& op) {
  if (op == "sum") return ReduceOp::kSum;
  if (op == "mean") return ReduceOp::kMean;
  throw Error("dynamiq: op must be 'sum' or 'mean', got '" + op + "'");
}

void check_tensor(const at::Tensor& t, bool allow_cuda) {
#ifdef DYNAMIQ_WITH_CUDA
  DQ_CHECK(t.device().is_cpu() || (allow_cuda && t.device().is_cuda()),
           "dynamiq: the C++ driver got a tensor on an unsupported device");
#else
  (void)allow_cuda;
  DQ_CHECK(t.device().is_cpu(), "dynamiq: the C++ driver got a non-CPU tensor (built without CUDA)");
#endif
  DQ_CHECK(t.is_contiguous(), "dynamiq: the C++ driver got a non-contiguous tensor");
  to_dtype(t);
}

const char* path_name(Path p) {
  switch (p) {
    case Path::kCompressed: return "compressed";
    case Path::kExactMode: return "exact";
    case Path::kExactTiny: return "exact-tiny";
    case Path::kExactNonfinite: return "exact-nonfinite";
    case Path::kExactBudget: return "exact-budget";
    case Path::kMixed: return "mixed";
  }
  return "?";
}

py::dict stats_dict(const CallStats& s) {
  py::dict d;
  d["path"] = path_name(s.path);
  d["numel"] = s.numel;
  d["bytes_sent"] = s.bytes_sent;
  d["bytes_received"] = s.bytes_received;
  d["messages_sent"] = s.messages_sent;
  d["meta_bytes_sent"] = s.meta_bytes_sent;
  d["bits_per_coord"] = s.bits_per_coord;
  py::dict h;
  const int widths[5] = {1, 2, 4, 8, 16};
  for (int i = 0; i < 5; ++i) h[py::int_(widths[i])] = s.width_units[i];
  d["width_units"] = h;
  d["blocks"] = s.blocks;
  d["t_local"] = s.t_local;
  d["t_header"] = s.t_header;
  d["t_meta"] = s.t_meta;
  d["t_plan"] = s.t_plan;
  d["t_kernel"] = s.t_kernel;
  d["t_wait"] = s.t_wait;
  d["t_post"] = s.t_post;
  d["t_total"] = s.t_total;
  d["pool_bytes"] = s.pool_bytes;
  d["slices"] = s.slices;
  d["alloc_passes"] = s.alloc_passes;
  d["alloc_exact"] = s.alloc_exact;
  d["alloc_fallbacks"] = s.alloc_fallbacks;
  d["inter_bytes_sent"] = s.inter_bytes_sent;  // topology hierarchical: sent between nodes
  d["t_intra"] = s.t_intra;
  d["t_inter"] = s.t_inter;
  if (s.auto_choice >= 0) {  // mode auto: the mode this bucket ran in, the model's predicted seconds
    d["auto_choice"] = mode_name(Mode(s.auto_choice));
    py::dict pr;
    pr["none"] = s.auto_predicted[0];
    pr["lossless"] = s.auto_predicted[1];
    pr["lossy"] = s.auto_predicted[2];
    d["auto_predicted"] = pr;
    d["auto_reprobe"] = s.auto_reprobe;
  } else {
    d["auto_choice"] = py::none();
  }
  if (s.has_u) {
    d["u"] = py::make_tuple(s.u, s.u_step);
  } else {
    d["u"] = py::none();
  }
  return d;
}

// A call's timeline (timeline.h) as Python data: {"rank", "world", "clock",
// "events": [dict per event]}; times in seconds of the steady clock.
py::dict timeline_dict(const Timeline& tl) {
  py::dict d;
  d["rank"] = tl.rank;
  d["world"] = tl.world;
  d["clock"] = "steady";
  py::list ev;
  for (const TimelineEvent& e : tl.events) {
    py::dict x;
    x["kind"] = timeline_kind_name(e.kind);
    x["name"] = e.name;
    x["part"] = e.part;
    x["slice"] = e.slice;
    x["op"] = e.op;
    x["block"] = e.block;
    x["peer"] = e.peer;
    x["tag"] = e.tag;
    x["bytes"] = e.bytes;
    x["t_post"] = e.t_post;
    x["t_start"] = e.t_start;
    x["t_end"] = e.t_end;
    if (e.kind == TimelineEvent::Kind::kRecv) x["t_need"] = e.t_need;
    x["exact"] = e.exact;
    ev.append(std::move(x));
  }
  d["events"] = std::move(ev);
  return d;
}

// Mode auto's state per (process group, config), for the life of the process
// (auto_mode.h): every rank's copy sees the same collectives, so they agree.
AutoState* auto_state_for(const std::string& group_name, const CollectiveConfig& cfg) {
  if (cfg.mode != kModeAuto) return nullptr;
  static std::mutex mu;
  static std::map<std::pair<std::string, uint64_t>, std::unique_ptr<AutoState>> states;
  std::lock_guard<std::mutex> lock(mu);
  auto& p = states[{group_name, cfg.fingerprint()}];
  if (!p) p = std::make_unique<AutoState>();
  return p.get();
}

// The posting for NCCL (each step's send and receive in one group) also on
// CPU buffers over Gloo when DYNAMIQ_ORDERED_POSTING=1: how its path through
// c10d is tested without a GPU. Results are the same either way.
bool ordered_posting_env() {
  const char* v = std::getenv("DYNAMIQ_ORDERED_POSTING");
  return v != nullptr && std::string(v) == "1";
}

#ifdef DYNAMIQ_WITH_CUDA
// The calling thread's (a group worker's) page-locked staging buffers for
// CUDA device `index`: kept between collectives, freed when the thread ends.
StagingPool& staging_pool(int index) {
  thread_local std::map<int, std::unique_ptr<StagingPool>> pools;
  auto& p = pools[index];
  if (!p) p = std::make_unique<StagingPool>(*cuda::device().staging());
  return *p;
}
#endif

// One collective over a process group: `tensor` is the all-reduce's bucket
// (in place) or the reduce-scatter's or all-gather's input, `output` the
// reduce-scatter's output (null otherwise).
py::dict run_on_group(Collective kind, std::optional<at::Tensor> tensor, std::optional<at::Tensor> output,
                      const std::string& group_name, const CollectiveConfig& cfg, const std::string& op,
                      uint64_t seq, std::optional<std::pair<double, double>> u, int local_error,
                      const std::string& device, int64_t caller_numel, bool staging, bool timeline = false,
                      const PrecomputedLocalPass* local_pass = nullptr) {
  CallArgs a;
  Timeline tl;
  if (timeline) a.timeline = &tl;
  a.local_pass = local_pass;
  a.kind = kind;
  a.caller_numel = caller_numel;
  a.op = to_op(op);
  a.seq = seq;
  a.local_error = InputError(local_error);
  PlanState ps;
  if (u) {
    ps.has_u = true;
    ps.u = u->first;
    ps.step = u->second;
  }
  a.plan_state = &ps;
  a.auto_state = auto_state_for(group_name, cfg);
  // where the buffers live: the tensor's device (also passed for a rank with
  // bad input, whose header exchange must run on the group's device)
  const c10::Device dev(device);
  DQ_CHECK(dev.is_cpu() || dev.is_cuda(), "dynamiq: device must be cpu or cuda");
#ifndef DYNAMIQ_WITH_CUDA
  DQ_CHECK(dev.is_cpu(), "dynamiq: this build has no CUDA support (built without nvcc)");
#endif
  if (a.local_error == InputError::kNone) {
    DQ_CHECK(tensor.has_value(), "dynamiq: all_reduce needs a tensor");
    check_tensor(*tensor, true);
    DQ_CHECK(tensor->device().type() == dev.type(), "dynamiq: the tensor is not on the given device");
    a.data = tensor->data_ptr();
    a.dtype = to_dtype(*tensor);
    a.numel = tensor->numel();
    // kept alive for ever if the collective fails (receives may still write into it)
    a.keep_alive = std::make_shared<at::Tensor>(*tensor);
    if (kind == Collective::kReduceScatter) {
      DQ_CHECK(output.has_value(), "dynamiq: reduce_scatter needs an output tensor");
      check_tensor(*output, true);
      DQ_CHECK(output->device() == tensor->device() && output->scalar_type() == tensor->scalar_type(),
               "dynamiq: reduce_scatter output and input differ in device or dtype");
      a.output = output->data_ptr();
      a.keep_alive = std::make_shared<std::pair<at::Tensor, at::Tensor>>(*tensor, *output);
    }
  }
  CallStats s;
  bool ordered = false, one_part = false, host_staged = false;
  {
    py::gil_scoped_release no_gil;
#ifdef DYNAMIQ_WITH_CUDA
    // Everything runs on this thread's current stream: the group worker's
    // stream of its own (python/dynamiq/_worker.py), which waits for an event
    // after the bucket's producer. The kernels, copies, allocations and waits
    // go there (cuda::StreamScope), and so does the NCCL operations' stream
    // handoff (torch syncs NCCL's stream with the current stream, and
    // Work::wait makes the current stream wait). Nothing waits for or holds up
    // the training's kernels on its own stream.
    std::optional<c10::cuda::CUDAGuard> guard;
    std::optional<cuda::StreamScope> stream_scope;
    if (dev.is_cuda()) {
      guard.emplace(tensor ? tensor->device() : dev);
      a.device = &cuda::device();
      stream_scope.emplace(c10::cuda::getCurrentCUDAStream().stream());
    }
#endif
    // The transport entry for the group's backends and the buffers' device
    // (transport_factory.h): Gloo for CPU buffers, NCCL for CUDA ones, or CUDA
    // buffers staged through page-locked host memory over the group's CPU
    // backend (Gloo): the group has no CUDA backend, or the config asks for it
    // (several processes on one GPU; staging_transport.h). Other backends are
    // refused here, on every rank alike.
    const c10::intrusive_ptr<c10d::ProcessGroup> pg = C10dTransport::resolve(group_name);
    const TransportEntry& entry =
        choose_transport(C10dTransport::backends_of(*pg), dev.is_cuda() ? "cuda" : "cpu", staging);
    const bool staged = entry.host_staging;
    host_staged = staged;
    C10dTransport inner(pg, staged ? c10::Device(c10::kCPU) : tensor && dev.is_cuda() ? tensor->device() : dev,
                        entry, ordered_posting_env());
    std::optional<StagingTransport> staged_tr;
#ifdef DYNAMIQ_WITH_CUDA
    if (staged) staged_tr.emplace(inner, staging_pool(guard ? int(guard->current_device().index()) : 0));
#endif
    Transport& tr = staged_tr ? static_cast<Transport&>(*staged_tr) : static_cast<Transport&>(inner);
    ordered = tr.posts_in_order();
    one_part = tr.sends_whole_messages();
    // an output that is not one shard of the input: reported, so that every rank raises
    if (output && a.local_error == InputError::kNone && output->numel() * tr.size() != a.numel)
      a.local_error = InputError::kShape;
    s = collective(tr, cfg, a);
  }
  py::dict d = stats_dict(s);
  if (timeline) d["timeline"] = timeline_dict(tl);
  d["ordered_posting"] = ordered;  // posted as for NCCL (see C10dTransport)
  d["one_part_messages"] = one_part;  // two-part (lossless) messages sent as one (Gloo)
  d["host_staging"] = host_staged;  // CUDA buffers staged through host memory
  return d;
}

py::dict run_all_reduce(std::optional<at::Tensor> tensor, const std::string& group_name,
                        const CollectiveConfig& cfg, const std::string& op, uint64_t seq,
                        std::optional<std::pair<double, double>> u, int local_error,
                        const std::string& device, bool staging, bool timeline,
                        std::shared_ptr<PrecomputedLocalPass> local_pass) {
  return run_on_group(Collective::kAllReduce, std::move(tensor), std::nullopt, group_name, cfg, op, seq, u,
                      local_error, device, -1, staging, timeline, local_pass.get());
}

Collective to_kind(int kind) {
  DQ_CHECK(kind >= 0 && kind <= 2, "dynamiq: collective kind must be 0, 1 or 2");
  return Collective(kind);
}

// A reduce-scatter (tensors = (input, output)) or all-gather (tensors =
// (buffer, buffer): world shards, this rank's filled in).
py::dict run_sharded(int kind, std::optional<std::pair<at::Tensor, at::Tensor>> tensors,
                     const std::string& group_name, const CollectiveConfig& cfg, const std::string& op,
                     uint64_t seq, std::optional<std::pair<double, double>> u, int local_error,
                     const std::string& device, int64_t caller_numel, bool staging, bool timeline) {
  const Collective k = to_kind(kind);
  DQ_CHECK(k != Collective::kAllReduce, "dynamiq: use all_reduce for an all-reduce");
  std::optional<at::Tensor> input, output;
  if (tensors) {
    input = tensors->first;
    if (k == Collective::kReduceScatter) output = tensors->second;
  }
  return run_on_group(k, input, output, group_name, cfg, op, seq, u, local_error, device, caller_numel, staging,
                      timeline);
}

py::list run_simulate(std::vector<at::Tensor> tensors, const CollectiveConfig& cfg,
                      const std::string& op, uint64_t seq, double timeout_s, bool timeline) {
  const int n = int(tensors.size());
  DQ_CHECK(n >= 1, "dynamiq.simulate: need at least one tensor");
  for (auto& t : tensors) {
    check_tensor(t, false);
    DQ_CHECK(t.scalar_type() == tensors[0].scalar_type() && t.numel() == tensors[0].numel(),
             "dynamiq.simulate: all tensors must have the same dtype and size");
  }
  std::vector<CallStats> stats(static_cast<size_t>(n));
  std::vector<Timeline> tls(static_cast<size_t>(n));
  {
    py::gil_scoped_release no_gil;
    InprocWorld world(n, std::chrono::milliseconds(int64_t(timeout_s * 1000)));
    world.run([&](int r, Transport& tr) {
      CallArgs a;
      if (timeline) a.timeline = &tls[size_t(r)];
      a.data = tensors[size_t(r)].data_ptr();
      a.dtype = to_dtype(tensors[size_t(r)]);
      a.numel = tensors[size_t(r)].numel();
      a.op = to_op(op);
      a.seq = seq;
      PlanState ps;  // as a real call: one allocator state for all slices of the bucket
      a.plan_state = &ps;
      AutoState as;  // mode auto: a fresh group (its first bucket)
      a.auto_state = &as;
      stats[size_t(r)] = all_reduce(tr, cfg, a);
    });
  }
  py::list out;
  for (size_t r = 0; r < stats.size(); ++r) {
    py::dict d = stats_dict(stats[r]);
    if (timeline) d["timeline"] = timeline_dict(tls[r]);
    out.append(std::move(d));
  }
  return out;
}

// simulate() of a reduce-scatter (inputs[r] -> outputs[r]) or all-gather
// (inputs[r] is rank r's buffer of world shards, its own filled; outputs ignored).
py::list run_simulate_sharded(int kind, std::vector<at::Tensor> inputs, std::vector<at::Tensor> outputs,
                              const CollectiveConfig& cfg, const std::string& op, uint64_t seq, double timeout_s) {
  const Collective k = to_kind(kind);
  const int n = int(inputs.size());
  DQ_CHECK(n >= 1 && outputs.size() == inputs.size(), "dynamiq.simulate: one input and one output per rank");
  for (int r = 0; r < n; ++r) {
    check_tensor(inputs[size_t(r)], false);
    check_tensor(outputs[size_t(r)], false);
    DQ_CHECK(inputs[size_t(r)].scalar_type() == inputs[0].scalar_type() &&
                 inputs[size_t(r)].numel() == inputs[0].numel() &&
                 outputs[size_t(r)].scalar_type() == inputs[0].scalar_type(),
             "dynamiq.simulate: all tensors must have the same dtype and size");
    if (k == Collective::kReduceScatter)
      DQ_CHECK(outputs[size_t(r)].numel() * n == inputs[0].numel(), "dynamiq.simulate: output is not one shard");
  }
  std::vector<CallStats> stats(static_cast<size_t>(n));
  {
    py::gil_scoped_release no_gil;
    InprocWorld world(n, std::chrono::milliseconds(int64_t(timeout_s * 1000)));
    world.run([&](int r, Transport& tr) {
      CallArgs a;
      a.kind = k;
      a.data = inputs[size_t(r)].data_ptr();
      a.output = k == Collective::kReduceScatter ? outputs[size_t(r)].data_ptr() : nullptr;
      a.dtype = to_dtype(inputs[size_t(r)]);
      a.numel = inputs[size_t(r)].numel();
      a.op = to_op(op);
      a.seq = seq;
      PlanState ps;
      a.plan_state = &ps;
      stats[size_t(r)] = collective(tr, cfg, a);
    });
  }
  py::list out;
  for (auto& s : stats) out.append(stats_dict(s));
  return out;
}

// ---- codec parameters (kernels/params.h): Python values <-> ParamValue -------------------------

bool is_number(const py::handle& o) { return !py::isinstance<py::bool_>(o) && (py::isinstance<py::int_>(o) || py::isinstance<py::float_>(o)); }

// o as the declared type; false where it is not one (the caller raises with the allowed values).
bool to_param_value(const ParamDecl& d, const py::handle& o, ParamValue& v) {
  auto num = [](const py::handle& x, double& out) {
    if (!is_number(x)) return false;
    try {
      out = x.cast<double>();  // an int too large for a double: OverflowError -> refused
    } catch (const std::exception&) {
      PyErr_Clear();
      return false;
    }
    return true;
  };
  switch (d.type) {
    case ParamType::kNumber: return num(o, v.num);
    case ParamType::kInteger: return py::isinstance<py::int_>(o) && !py::isinstance<py::bool_>(o) && num(o, v.num);
    case ParamType::kBool:
      if (!py::isinstance<py::bool_>(o)) return false;
      v.num = o.cast<bool>() ? 1.0 : 0.0;
      return true;
    case ParamType::kChoice:
      if (!py::isinstance<py::str>(o)) return false;
      v.str = o.cast<std::string>();
      return true;
    case ParamType::kNumbers:
    case ParamType::kIntegers: {
      if (!py::isinstance<py::tuple>(o) && !py::isinstance<py::list>(o)) return false;
      for (const py::handle x : o) {
        double e;
        if (!num(x, e) || (d.type == ParamType::kIntegers && !py::isinstance<py::int_>(x))) return false;
        v.list.push_back(e);
      }
      return true;
    }
  }
  return false;
}

py::object from_param_value(const ParamDecl& d, const ParamValue& v) {
  switch (d.type) {
    case ParamType::kNumber: return d.integral ? py::object(py::int_(int64_t(v.num))) : py::object(py::float_(v.num));
    case ParamType::kInteger: return py::int_(int64_t(v.num));
    case ParamType::kBool: return py::bool_(v.num != 0.0);
    case ParamType::kChoice: return py::str(v.str);
    case ParamType::kNumbers: {
      py::tuple t(v.list.size());
      for (size_t i = 0; i < v.list.size(); ++i) t[i] = py::float_(v.list[i]);
      return t;
    }
    case ParamType::kIntegers: {
      py::tuple t(v.list.size());
      for (size_t i = 0; i < v.list.size(); ++i) t[i] = py::int_(int64_t(v.list[i]));
      return t;
    }
  }
  return py::none();
}

const ParamDecl& find_param(Mode mode, const std::string& name) {
  const auto& decls = mode_params(mode);
  for (const ParamDecl& d : decls)
    if (d.name == name) return d;
  std::string names;
  for (const ParamDecl& d : decls) names += (names.empty() ? "" : ", ") + d.name;
  throw Error(name + " is not a parameter of mode '" + mode_name(mode) + "' (its parameters: " +
              (names.empty() ? "none" : names) + ")");
}

void set_param(CollectiveConfig& c, const std::string& name, const py::object& value) {
  const ParamDecl& d = find_param(c.codec_mode(), name);
  ParamValue v;
  const std::string shown = py::repr(value).cast<std::string>();
  if (!to_param_value(d, value, v))
    throw Error(name + "=" + shown + " is invalid; allowed: " + d.allowed() + " for mode '" +
                mode_name(c.codec_mode()) + "'");
  try {
    d.check(v, shown);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " for mode '" + mode_name(c.codec_mode()) + "'");
  }
  c.params.set(name, std::move(v));
}

py::dict params_dict(const CollectiveConfig& c) {
  py::dict out;
  for (const auto& [name, v] : c.params.values()) out[py::str(name)] = from_param_value(find_param(c.codec_mode(), name), v);
  return out;
}

bool mode_is_exact(Mode id) {
  // A mode whose scheme refuses its defaults needs parameters of its own (bounded: an error
  // bound), which only a lossy mode has.
  try {
    return make_scheme(id, ParamSet())->exact();
  } catch (const Error&) {
    return false;
  }
}

const char* param_type_name(ParamType t) {
  switch (t) {
    case ParamType::kNumber: return "number";
    case ParamType::kInteger: return "integer";
    case ParamType::kBool: return "bool";
    case ParamType::kChoice: return "choice";
    case ParamType::kNumbers: return "numbers";
    case ParamType::kIntegers: return "integers";
  }
  return "?";
}

py::list mode_info() {
  py::list out;
  for (const ModeInfo& e : registered_modes()) {
    py::list params;
    for (const ParamDecl& d : mode_params(e.id)) {
      py::dict p;
      p["name"] = d.name;
      p["type"] = param_type_name(d.type);
      p["default"] = d.has_default ? from_param_value(d, d.def) : py::none();
      p["doc"] = d.doc;
      p["allowed"] = d.allowed();
      p["lo"] = d.lo;
      p["hi"] = d.hi;
      p["lo_open"] = d.lo_open;
      p["integral"] = d.integral;
      p["also"] = d.also;
      p["choices"] = d.choices;
      p["size"] = d.size;
      p["fingerprint"] = d.fingerprint;
      params.append(p);
    }
    py::dict m;
    m["name"] = e.name;
    m["id"] = int(e.id);
    m["exact"] = mode_is_exact(e.id);
    m["builtin"] = e.builtin;
    m["params"] = params;
    out.append(m);
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "dynamiq C++ core (compressed all-reduce over c10d point-to-point)";
#if defined(DYNAMIQ_REQUIRES_X86_64_V3)
  // This file is compiled for the baseline ISA; the kernels are not.
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") ||
      !__builtin_cpu_supports("bmi2") || !__builtin_cpu_supports("f16c")) {
    throw std::runtime_error(
        "dynamiq was built for x86-64-v3 (AVX2, FMA, BMI2, F16C) and this CPU lacks them; rebuild with "
        "-C cmake.define.DYNAMIQ_CPU_ARCH= (empty) or DYNAMIQ_CPU_ARCH=native");
  }
#endif

  static py::exception<Error> dq_error(m, "DynamiqError", PyExc_RuntimeError);
  static py::exception<TransportError> tr_error(m, "TransportError", dq_error.ptr());
  static py::exception<MalformedMessage> mm_error(m, "MalformedMessage", dq_error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const TransportError& e) {
      py::set_error(tr_error, e.what());
    } catch (const MalformedMessage& e) {
      py::set_error(mm_error, e.what());
    } catch (const Error& e) {
      py::set_error(dq_error, e.what());
    }
  });

  py::class_<CollectiveConfig>(m, "CollectiveConfig")
      .def(py::init<>())
      .def_property(
          "mode", [](const CollectiveConfig& c) { return int(c.mode); },
          [](CollectiveConfig& c, int v) {
            DQ_CHECK(v >= 0 && v <= 255, "dynamiq: mode id must be in [0, 255]");
            c.mode = Mode(v);
          })
      .def_property(
          "topology", [](const CollectiveConfig& c) { return int(c.topology); },
          [](CollectiveConfig& c, const py::object& v) { c.topology = topology_of(v); })
      .def_readwrite("seed", &CollectiveConfig::seed)
      .def("set_param", &set_param, py::arg("name"), py::arg("value"),
           "Sets a parameter of the config's codec mode (auto_lossy's for mode auto: set mode and "
           "auto_lossy first), checked against the mode's declaration (DynamiqError naming the "
           "mode's parameters, or the values allowed).")
      .def_property_readonly("params", [](const CollectiveConfig& c) { return params_dict(c); },
                             "The parameters set, by name.")
      .def_readwrite("block_bytes", &CollectiveConfig::block_bytes)
      .def_readwrite("min_compress_numel", &CollectiveConfig::min_compress_numel)
      .def_readwrite("window_bytes", &CollectiveConfig::window_bytes)
      .def_readwrite("max_collective_bytes", &CollectiveConfig::max_collective_bytes)
      .def_readwrite("local_size", &CollectiveConfig::local_size)
      .def_property(
          "intra_mode", [](const CollectiveConfig& c) { return int(c.intra_mode); },
          [](CollectiveConfig& c, int v) {
            DQ_CHECK(v >= 0 && v <= 255, "dynamiq: mode id must be in [0, 255]");
            c.intra_mode = Mode(v);
          })
      .def_property(
          "auto_lossy", [](const CollectiveConfig& c) { return int(c.auto_lossy); },
          [](CollectiveConfig& c, int v) {
            DQ_CHECK(v >= 0 && v <= 255, "dynamiq: mode id must be in [0, 255]");
            c.auto_lossy = Mode(v);
          })
      .def_readwrite("auto_bandwidth", &CollectiveConfig::auto_bandwidth)
      .def_readwrite("auto_latency", &CollectiveConfig::auto_latency)
      .def("fingerprint", &CollectiveConfig::fingerprint);

  m.attr("MODE_AUTO") = int(kModeAuto);
  m.def(
      "validate_config",
      [](const CollectiveConfig& c) {
        make_scheme(c.codec_mode(), c.params);
        if (const TopologyDef& t = topology_def(c.topology); t.validate) t.validate(c);
      },
      py::arg("config"),
      "Builds the mode's scheme from the config once and discards it: raises DynamiqError for a "
      "config the C++ codecs or allocator reject (group sizes, eps, widths, bits), so that a config "
      "that passes never fails inside a collective.");

  m.def(
      "config_problem",
      [](const CollectiveConfig& c, int world) -> std::string {
        const TopologyDef& t = topology_def(c.topology);
        return t.group_problem ? t.group_problem(c, world) : std::string();
      },
      py::arg("config"), py::arg("world"),
      "'' or why every rank of a group of `world` ranks would refuse the config at its first collective, "
      "as its topology's registry entry says (hierarchical: no ranks per node, a local_size that does not "
      "divide the world).");

  m.def("all_reduce", &run_all_reduce, py::arg("tensor"), py::arg("group_name"), py::arg("config"),
        py::arg("op"), py::arg("seq"), py::arg("u") = py::none(), py::arg("local_error") = 0,
        py::arg("device") = "cpu", py::arg("staging") = false, py::arg("timeline") = false,
        py::arg("local_pass") = nullptr,
        "In-place all-reduce of a contiguous tensor (CPU with Gloo; CUDA with NCCL in a CUDA "
        "build, or with staging=True over the group's CPU backend through page-locked host memory) "
        "over the named process group. Releases the GIL. Returns the per-call statistics.");
  py::class_<PrecomputedLocalPass, std::shared_ptr<PrecomputedLocalPass>>(
      m, "PrecomputedLocalPass", "A bucket's statistics pass run ahead of its all-reduce (opaque).");
  m.def(
      "precompute_local_pass",
      [](const at::Tensor& t, const CollectiveConfig& cfg) -> std::shared_ptr<PrecomputedLocalPass> {
        if (!t.device().is_cpu() || !t.is_contiguous() || t.layout() != at::kStrided) return nullptr;
        const auto st = t.scalar_type();
        if (st != at::kFloat && st != at::kBFloat16 && st != at::kHalf) return nullptr;
        CallArgs a;
        a.data = t.data_ptr();
        a.dtype = to_dtype(t);
        a.numel = t.numel();
        auto out = std::make_shared<PrecomputedLocalPass>();
        bool ok;
        {
          py::gil_scoped_release no_gil;
          ok = precompute_local_pass(cfg, a, *out);
        }
        return ok ? out : nullptr;
      },
      py::arg("tensor"), py::arg("config"),
      "Runs the local pass (statistics, non-finite scan) of an all-reduce of a CPU tensor under "
      "config now; pass the result to all_reduce(local_pass=...) of the same tensor and config. "
      "None where there is nothing to precompute. Releases the GIL.");
  m.def("sharded", &run_sharded, py::arg("kind"), py::arg("tensors"), py::arg("group_name"), py::arg("config"),
        py::arg("op"), py::arg("seq"), py::arg("u") = py::none(), py::arg("local_error") = 0,
        py::arg("device") = "cpu", py::arg("caller_numel") = -1, py::arg("staging") = false,
        py::arg("timeline") = false,
        "A reduce-scatter (kind 1; tensors = (input, output)) or all-gather (kind 2; tensors = "
        "(buffer, buffer), this rank's shard filled in) over the named process group; shards "
        "already padded to padded_shard. Releases the GIL. Returns the per-call statistics.");
  m.def(
      "padded_shard",
      [](const CollectiveConfig& c, int kind, int world, int64_t shard) {
        return padded_shard(c, to_kind(kind), world, shard);
      },
      py::arg("config"), py::arg("kind"), py::arg("world"), py::arg("shard"),
      "The shard size a reduce-scatter (kind 1) or all-gather (kind 2) runs with: the shard "
      "itself, or the size to zero-pad each shard to so that the plan cuts at the shards.");
  m.def("simulate_sharded", &run_simulate_sharded, py::arg("kind"), py::arg("inputs"), py::arg("outputs"),
        py::arg("config"), py::arg("op"), py::arg("seq"), py::arg("timeout_s") = 300.0,
        "simulate() of a reduce-scatter or all-gather over an in-process transport.");
  m.def("simulate", &run_simulate, py::arg("tensors"), py::arg("config"), py::arg("op"),
        py::arg("seq"), py::arg("timeout_s") = 300.0, py::arg("timeline") = false,
        "Runs the same collective over an in-process transport, one tensor per simulated "
        "rank, in place. Returns each rank's statistics.");
  bind_topologies_and_transports(m);  // registry_bindings.cc
  m.def(
      "lossless_stats",
      [](const at::Tensor& t, int64_t block_bytes) {
        DQ_CHECK(t.device().is_cpu() && t.is_contiguous(),
                 "dynamiq.lossless_stats: expected a contiguous CPU tensor");
        DQ_CHECK(block_bytes >= 1024, "dynamiq.lossless_stats: block_bytes must be >= 1024");
        const DType dt = to_dtype(t);
        LosslessStats s;
        {
          py::gil_scoped_release nogil;
          s = lossless_stats(t.data_ptr(), dt, t.numel(), block_bytes);
        }
        py::dict d;
        d["numel"] = s.numel;
        d["blocks"] = s.blocks;
        d["raw_bytes"] = s.raw_bytes;
        d["coded_bytes"] = s.coded_bytes;
        d["ratio"] = s.ratio;
        d["exponent_bits"] = s.exponent_bits;
        d["exponent_entropy"] = s.exponent_entropy;
        d["block_exponent_entropy"] = s.block_exponent_entropy;
        py::dict f;
        for (int i = 0; i < lossless::kNumFormats; ++i)
          f[lossless::exp_format_name(lossless::ExpFormat(i))] = s.blocks_by_format[i];
        d["blocks_by_format"] = f;
        return d;
      },
      py::arg("tensor"), py::arg("block_bytes"),
      "Codes a tensor block by block as lossless mode codes one copy of it; returns the sizes, "
      "the achieved bits per exponent and the exponent entropies.");
  m.def("built_with_cuda", [] {
#ifdef DYNAMIQ_WITH_CUDA
    return true;
#else
    return false;
#endif
  });
  // A stream of the group worker's own (python/dynamiq/_worker.py): created here
  // rather than taken from torch's pool of 32 streams, which it would share with
  // other workers, NCCL's streams and Future callbacks (each thread then adds
  // its own cross-rank waits to the shared stream, and two ranks could
  // interleave them differently and wait for each other).
  m.def(
      "new_cuda_stream",
      [](int device) -> uintptr_t {
#ifdef DYNAMIQ_WITH_CUDA
        c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
        cudaStream_t st = nullptr;
        const cudaError_t e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
        DQ_CHECK(e == cudaSuccess, std::string("dynamiq: cannot create a CUDA stream: ") + cudaGetErrorString(e));
        return reinterpret_cast<uintptr_t>(st);
#else
        (void)device;
        throw Error("dynamiq: this build has no CUDA support (built without nvcc)");
#endif
      },
      py::arg("device"), "A new non-blocking CUDA stream on `device` (its handle); see destroy_cuda_stream.");
  m.def(
      "destroy_cuda_stream",
      [](uintptr_t stream, int device) {
#ifdef DYNAMIQ_WITH_CUDA
        c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
        release_device_codecs(reinterpret_cast<void*>(stream));  // the codecs made for it free on it first
        cudaStreamDestroy(reinterpret_cast<cudaStream_t>(stream));  // (its pending work still completes)
#else
        (void)stream;
        (void)device;
#endif
      },
      py::arg("stream"), py::arg("device"));
  m.def("cpu_isa", [] { return dynamiq_cpu_isa(); },
        "The vector ISA of the CPU kernels: avx2 on x86 (also on AVX-512 CPUs: no AVX-512 kernels are "
        "built), generic in a build without AVX2 (the portable scalar kernels).");
  m.def("cpu_threads", [] { return dynamiq_cpu_threads(); },
        "Threads one CPU codec call may use (env DYNAMIQ_CPU_THREADS, default 1).");
  m.def("set_cpu_threads", [](int n) { return dynamiq_set_cpu_threads(n); },
        "Sets the threads one CPU codec call may use; returns the previous value.");
  // The codec registry (kernels/registry.h) is the one list of modes: Python
  // takes the names and ids from here.
  m.def("available_modes", [] {
    py::list l;
    for (const ModeInfo& e : registered_modes()) l.append(e.name);
    return l;
  }, "The registered modes, by id.");
  m.def("mode_id", [](const std::string& name) { return int(mode_id(name)); }, py::arg("name"),
        "The id of a registered mode (CollectiveConfig.mode); DynamiqError for an unknown name.");
  m.def("mode_name", [](int id) { return std::string(id >= 0 && id <= 255 ? mode_name(Mode(id)) : "?"); },
        py::arg("id"), "The name of a registered mode id, '?' for another.");
  m.def("mode_is_exact", [](const std::string& name) { return mode_is_exact(mode_id(name)); }, py::arg("name"),
        "True for a registered mode whose result is exact (Scheme::exact: none, lossless).");
  m.def("mode_info", &mode_info,
        "Every registered mode, by id: {name, id, exact, builtin, params: [{name, type, default, doc, allowed, "
        "lo, hi, lo_open, integral, also, choices, size, fingerprint}]} (kernels/params.h).");
  m.def(
      "dynamiq_sg_bytes",
      [](int width, int supergroup_size, int group_size, bool hierarchical) {
        DQ_CHECK(dynamiq_width_index(width) >= 0, "dynamiq_sg_bytes: width must be one of 1, 2, 4, 8, 16");
        DQ_CHECK(supergroup_size > 0 && group_size > 0 && supergroup_size % group_size == 0,
                 "dynamiq_sg_bytes: supergroup_size must be a positive multiple of group_size");
        DynamiqFormat f;
        f.S = supergroup_size;
        f.s = group_size;
        f.hierarchical = hierarchical;
        return dynamiq_sg_bytes(width, f);
      },
      py::arg("width"), py::arg("supergroup_size"), py::arg("group_size"), py::arg("hierarchical"),
      "Wire bytes of one dynamiq super-group of the given width (kernels/dynamiq/dynamiq_format.h).");
}
