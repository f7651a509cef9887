"""FSDP2 (`torch.distributed.fsdp.fully_shard`) with dynamiq's reduce-scatter and all-gather.

    from torch.distributed.fsdp import fully_shard
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    state = dynamiq.fsdp.enable(model, dynamiq.Config(mode="dynamiq", bits=5.0))
    ...                                   # train as usual
    print(state.summary())

`enable` gives every `FSDPModule` of the model a `ReduceScatter` (gradients, in
the config's mode) and, with `all_gather="lossless"` (the default), an
`AllGather` (parameters, exact); both implement torch's interfaces
(`torch.distributed.fsdp._fully_shard._fsdp_api.ReduceScatter` / `AllGather`,
set with `set_custom_reduce_scatter` / `set_custom_all_gather`). HSDP: with
`fully_shard` over the shard dimension only, `replicate_group=` (or
`module.set_all_reduce_hook(dynamiq.fsdp.replicate_hook(config, group))`)
averages the reduce-scattered gradients over the replicate dimension with
`dynamiq.all_reduce`.

What FSDP hands over: a flat reduce-scatter input of n equal shards in the
reduce dtype (float32, or bf16/fp16 under `MixedPrecisionPolicy(reduce_dtype=...)`)
with op AVG (or SUM, or PREMUL_SUM with a factor, both handled), called
synchronously on the reduce-scatter stream; a flat all-gather output whose
slot for this rank is the input (in place). Tensors of a dtype dynamiq does not
carry (FSDP's uint8 all-gather of parameters of mixed dtypes, float64) go
through torch's own collective on FSDP's group, counted in `totals`.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, Optional

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard import _fsdp_api

if not (hasattr(_fsdp_api, "ReduceScatter") and hasattr(_fsdp_api, "AllGather")):
    # (an ImportError, not the AttributeError of the class statements below: code that
    # imports what it can, multiprocessing's fork-server preload among it, skips it)
    raise ImportError(f"dynamiq.fsdp needs FSDP2's custom collectives (torch.distributed.fsdp._fully_shard."
                      f"_fsdp_api.ReduceScatter and AllGather); torch {torch.__version__} does not have them")

from ._groups import _not_a_member, resolve_group
from ._worker import worker_for
from .api import (SUPPORTED_DTYPES, DynamiqError, comm_device, ready_event, run_collective, run_sharded,
                  shard_error, wait_ready)
from .config import Config, exact_modes
from .api import _exact_list, check_sharded_config
from .hook import _STREAM_STRIDE, _bind_lock, _fmt_bytes, _hooks_per_group

__all__ = ["AllGather", "FsdpState", "ReduceScatter", "ReplicateHook", "enable", "replicate_hook"]

_STATE_VERSION = 1
_KIND_NAMES = ("reduce_scatter", "all_gather", "all_reduce")


def _op_of(op) -> tuple:
    """FSDP's reduce op -> (dynamiq op, factor applied to the result)."""
    t = getattr(op, "op", op)  # a ReduceOp object (PREMUL_SUM) or a RedOpType (SUM, AVG)
    if op is None or t == dist.ReduceOp.SUM:
        return "sum", None
    if t == dist.ReduceOp.AVG:
        return "mean", None
    if t == dist.ReduceOp.PREMUL_SUM:
        factor = getattr(op, "factor", None)
        if isinstance(factor, (int, float)):
            return "sum", float(factor)  # sum of (factor x_i) = factor * (sum of x_i), applied once after
    raise DynamiqError(f"dynamiq.fsdp: reduce op {op!r} is not supported (SUM, AVG and PREMUL_SUM with a "
                       "scalar factor are)")


def _as_work(fut: torch.futures.Future) -> dist.Work:
    return torch._C._distributed_c10d._create_work_from_future(fut)


class FsdpState:
    """What `enable` made: the configs, sequence numbers, allocator state and statistics of
    every `ReduceScatter`, `AllGather` and `ReplicateHook` it set on a model.

    Attributes:
      config: the reduce-scatter's (and replicate all-reduce's) `Config`.
      all_gather_config: the all-gather's `Config` (mode "lossless" or "none"), or None.
      comms: name -> comm object (the FSDPModule's qualified name; "" for the root;
        replicate hooks as "replicate:<name>").
      totals: per collective ("reduce_scatter", "all_gather", "all_reduce"): calls,
        bytes_sent, meta_bytes_sent, t_total (seconds), and calls through torch
        ("fallback": a dtype dynamiq does not carry). Not in state_dict.

    `state_dict()` / `load_state_dict()` hold the configs, the sequence numbers (they key
    all randomness, so a resumed run draws the same random numbers) and each
    reduce-scatter's allocator state (DynamiQ's carried offset u), as `HookState` does
    for DDP.
    """

    def __init__(self, config: Optional[Config] = None, all_gather_config: Optional[Config] = None) -> None:
        self.config = config if config is not None else Config()
        if not isinstance(self.config, Config):
            raise TypeError(f"dynamiq.fsdp: config must be a dynamiq.Config, got {type(self.config).__name__}")
        if all_gather_config is not None and all_gather_config.mode not in exact_modes():
            raise DynamiqError(f"dynamiq.fsdp: the all-gather runs in an exact mode ({_exact_list()}), not "
                               f"{all_gather_config.mode!r} (parameters must arrive exact)")
        self.all_gather_config = all_gather_config
        self.comms: Dict[str, Any] = {}
        self._seq: Dict[str, int] = {}  # user group name -> sequence number of its next collective
        self._lock = threading.Lock()
        self.totals: Dict[str, Dict[str, float]] = {
            k: {"calls": 0, "bytes_sent": 0, "meta_bytes_sent": 0, "t_total": 0.0, "fallback": 0}
            for k in _KIND_NAMES}

    def __repr__(self) -> str:
        return (f"dynamiq.fsdp.FsdpState({self.config!r}, all_gather={self.all_gather_config!r}; "
                f"{len(self.comms)} comms)")

    # -- sequence numbers --------------------------------------------------------------
    def _next_seq(self, user_name: str, name: str) -> int:
        """The next sequence number on a group (by the user group's name). The first use of a
        group takes this state's range there, as a DDP HookState does (the k-th hook or FSDP
        state on a group in a process starts at k * 2**48), unless load_state_dict set it."""
        with _bind_lock:
            seq = self._seq.get(user_name)
            if seq is None:
                k = _hooks_per_group.get(name, 0)
                _hooks_per_group[name] = k + 1
                seq = k * _STREAM_STRIDE
            self._seq[user_name] = seq + 1
        return seq

    def _record(self, kind: str, stats: Optional[dict], fallback: bool = False) -> None:
        with self._lock:
            t = self.totals[kind]
            t["calls"] += 1
            if fallback:
                t["fallback"] += 1
                return
            t["bytes_sent"] += stats["bytes_sent"]
            t["meta_bytes_sent"] += stats["meta_bytes_sent"]
            t["t_total"] += stats["t_total"]

    # -- checkpointing ---------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "version": _STATE_VERSION,
            "config": self.config.to_dict(),
            "all_gather_config": self.all_gather_config.to_dict() if self.all_gather_config else None,
            "seq": dict(self._seq),
            "alloc_u": {name: [float(c.alloc_u[0]), float(c.alloc_u[1])]
                        for name, c in self.comms.items() if getattr(c, "alloc_u", None) is not None},
        }

    def load_state_dict(self, d: dict) -> None:
        """Restores configs, sequence numbers and allocator states (after `enable`, before
        the first step of the resumed run; on every rank)."""
        if d.get("version") != _STATE_VERSION:
            raise ValueError(f"dynamiq.fsdp: state version {d.get('version')!r} is not supported")
        self.config = Config.from_dict(d["config"])
        agc = d.get("all_gather_config")
        self.all_gather_config = Config.from_dict(agc) if agc else None
        for c in self.comms.values():
            c.config = self.all_gather_config if isinstance(c, AllGather) else self.config
            if hasattr(c, "alloc_u"):
                c.alloc_u = None
        self._seq = {str(k): int(v) for k, v in d["seq"].items()}
        for name, u in d["alloc_u"].items():
            if name in self.comms:
                self.comms[name].alloc_u = (float(u[0]), float(u[1]))

    # -- logging ---------------------------------------------------------------------
    def summary(self) -> str:
        """One line: per collective, calls so far, bytes sent and time (this rank)."""
        parts = []
        for k in _KIND_NAMES:
            t = self.totals[k]
            if t["calls"]:
                fb = f", {int(t['fallback'])} through torch" if t["fallback"] else ""
                parts.append(f"{k} {int(t['calls'])} calls, sent {_fmt_bytes(t['bytes_sent'])} + "
                             f"{_fmt_bytes(t['meta_bytes_sent'])} stats, {1e3 * t['t_total']:.0f} ms{fb}")
        return "dynamiq.fsdp: " + ("; ".join(parts) if parts else "no collective yet")

    # -- one collective ----------------------------------------------------------------
    def _issue(self, kind: str, comm, output: torch.Tensor, input: torch.Tensor, group, config: Config,
               op: str, factor: Optional[float]) -> Optional[torch.futures.Future]:
        """Queues one reduce-scatter or all-gather on dynamiq's worker for `group`; None on
        a rank outside the group."""
        if _not_a_member(group):
            return None
        g = group if group is not None else dist.group.WORLD
        own, name = resolve_group(g)
        world, rank = dist.get_world_size(own), dist.get_rank(own)
        seq = self._next_seq(g.group_name, name)
        error = shard_error(kind, output, input, world, name)
        ev = ready_event(input, name) if not error[0] else None
        device = comm_device(None if error[0] else input, name)
        u = getattr(comm, "alloc_u", None)

        def work():
            wait_ready(input, ev)
            if ev is not None:  # in use on our stream: FSDP must not free them under us
                input.record_stream(torch.cuda.current_stream(input.device))
                output.record_stream(torch.cuda.current_stream(output.device))
            stats = run_sharded(kind, output, input, name, world, rank, config, op, seq, u, device, error)
            if factor is not None:
                output.mul_(factor)
            if stats.get("u") is not None:
                comm.alloc_u = tuple(stats["u"])
            comm.last_stats = stats
            self._record(kind, stats)
            return output

        return worker_for(name).submit(work, device=input.device if ev is not None else None)


def _finish(fut: Optional[torch.futures.Future], async_op: bool) -> Optional[dist.Work]:
    if fut is None:
        return None
    if async_op:
        return _as_work(fut)
    fut.wait()  # (CUDA: the caller's current stream then waits for the collective's)
    return None


class ReduceScatter(_fsdp_api.ReduceScatter):
    """FSDP2's reduce-scatter through dynamiq (`module.set_custom_reduce_scatter(...)`).

    `ReduceScatter(config)` alone, or made by `enable` (one per FSDPModule, sharing an
    `FsdpState`). `alloc_u` is this module's allocator state, carried across steps;
    `last_stats` the statistics of its last call."""

    def __init__(self, config: Optional[Config] = None, state: Optional[FsdpState] = None, name: str = "") -> None:
        self._state = state if state is not None else FsdpState(config)
        self.config = config if config is not None else self._state.config
        check_sharded_config(self.config, "reduce_scatter", "dynamiq.fsdp.ReduceScatter")
        self.name = name
        self.alloc_u: Optional[tuple] = None
        self.last_stats: Optional[dict] = None
        self._state.comms.setdefault(name, self)

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op=dist.ReduceOp.SUM, async_op: bool = False) -> Optional[dist.Work]:
        if input_tensor.dtype not in SUPPORTED_DTYPES:
            self._state._record("reduce_scatter", None, fallback=True)
            return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group, async_op=async_op)
        name, factor = _op_of(op)
        fut = self._state._issue("reduce_scatter", self, output_tensor, input_tensor, group, self.config, name,
                                 factor)
        return _finish(fut, async_op)


class AllGather(_fsdp_api.AllGather):
    """FSDP2's parameter all-gather through dynamiq (`module.set_custom_all_gather(...)`), in
    mode "lossless" (default: each shard compressed once by its owner, exact) or "none"."""

    def __init__(self, config: Optional[Config] = None, state: Optional[FsdpState] = None, name: str = "") -> None:
        config = config if config is not None else Config(mode="lossless")
        if config.mode not in exact_modes():
            raise DynamiqError(f"dynamiq.fsdp.AllGather: mode {config.mode!r} is not exact; parameters must "
                               f"arrive exact: use an exact mode ({_exact_list()})")
        self._state = state if state is not None else FsdpState(all_gather_config=config)
        self.config = config
        self.name = name
        self.last_stats: Optional[dict] = None
        self._state.comms.setdefault("all_gather:" + name, self)

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 async_op: bool = False) -> Optional[dist.Work]:
        if input_tensor.dtype not in SUPPORTED_DTYPES:
            self._state._record("all_gather", None, fallback=True)
            return dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)
        fut = self._state._issue("all_gather", self, output_tensor, input_tensor, group, self.config, "sum", None)
        return _finish(fut, async_op)


class ReplicateHook:
    """HSDP's replicate-dimension all-reduce with dynamiq (`module.set_all_reduce_hook(hook)`):
    averages (op "mean") or sums FSDP's reduce-scattered gradient over `group` in place.
    Use with `fully_shard` over the shard dimension only (FSDP's own HSDP all-reduce runs
    before the hook)."""

    def __init__(self, config: Optional[Config] = None, group: Optional[dist.ProcessGroup] = None,
                 op: str = "mean", state: Optional[FsdpState] = None, name: str = "") -> None:
        if op not in ("sum", "mean"):
            raise ValueError(f"dynamiq.fsdp.replicate_hook: op must be 'sum' or 'mean', got {op!r}")
        self._state = state if state is not None else FsdpState(config)
        self.config = config if config is not None else self._state.config
        self.group = group
        self.op = op
        self.name = name
        self.alloc_u: Optional[tuple] = None
        self.last_stats: Optional[dict] = None
        self._state.comms.setdefault("replicate:" + name, self)

    def __call__(self, reduce_output: torch.Tensor) -> None:
        if _not_a_member(self.group):
            return
        if reduce_output.dtype not in SUPPORTED_DTYPES:
            self._state._record("all_reduce", None, fallback=True)
            dist.all_reduce(reduce_output, group=self.group)
            if self.op == "mean":
                reduce_output.div_(dist.get_world_size(self.group))
            return
        g = self.group if self.group is not None else dist.group.WORLD
        own, name = resolve_group(g)
        seq = self._state._next_seq(g.group_name, name)
        ev = ready_event(reduce_output, name)
        device = comm_device(reduce_output, name)
        u, config, op = self.alloc_u, self.config, self.op

        def work():
            wait_ready(reduce_output, ev)
            if ev is not None:
                reduce_output.record_stream(torch.cuda.current_stream(reduce_output.device))
            stats = run_collective(reduce_output, name, config, op, seq, u, device=device)
            if stats.get("u") is not None:
                self.alloc_u = tuple(stats["u"])
            self.last_stats = stats
            self._state._record("all_reduce", stats)
            return reduce_output

        worker_for(name).submit(work, device=reduce_output.device if ev is not None else None).wait()


def replicate_hook(config: Optional[Config] = None, group: Optional[dist.ProcessGroup] = None,
                   op: str = "mean") -> ReplicateHook:
    """A hook for `FSDPModule.set_all_reduce_hook` that all-reduces (default: averages)
    the reduce-scattered gradients over `group` (HSDP's replicate dimension; None: the
    default group) with dynamiq."""
    return ReplicateHook(config, group, op)


def enable(model: torch.nn.Module, config: Optional[Config] = None, all_gather: Optional[str] = "lossless",
           replicate_group: Optional[dist.ProcessGroup] = None, replace: bool = False) -> FsdpState:
    """Sets dynamiq's reduce-scatter (mode of `config`) and, unless `all_gather` is None,
    its all-gather (mode `all_gather`: "lossless" or "none") on every FSDPModule of
    `model` (call after `fully_shard`, on every rank). With `replicate_group` (HSDP over
    a shard-only `fully_shard`), also a `ReplicateHook` averaging over that group.
    Returns the `FsdpState` (statistics, checkpointing). A second call on the same model
    raises unless `replace=True` (the first call's state would stop counting without a word).
    Mode "auto" and topology "hierarchical", which run all-reduces only, are refused here."""
    from torch.distributed.fsdp import FSDPModule

    if all_gather is not None and all_gather not in exact_modes():
        raise ValueError(f"dynamiq.fsdp.enable: all_gather must be an exact mode ({_exact_list()}) or None, "
                         f"got {all_gather!r}")
    config = config if config is not None else Config()
    if not isinstance(config, Config):
        raise TypeError(f"dynamiq.fsdp.enable: config must be a dynamiq.Config, got {type(config).__name__}")
    check_sharded_config(config, "reduce_scatter", "dynamiq.fsdp.enable")
    if getattr(model, "_dynamiq_fsdp_state", None) is not None and not replace:
        raise DynamiqError("dynamiq.fsdp.enable: already enabled on this model; a second call would replace the "
                           "first's reduce-scatter and all-gather, whose FsdpState would then stop counting. Keep "
                           "the state the first call returned, or pass replace=True")
    ag_config = None if all_gather is None else Config(mode=all_gather, topology=config.topology, seed=config.seed)
    state = FsdpState(config, ag_config)
    found = 0
    for name, m in model.named_modules():
        if not isinstance(m, FSDPModule):
            continue
        found += 1
        m.set_custom_reduce_scatter(ReduceScatter(config, state, name))
        if ag_config is not None:
            m.set_custom_all_gather(AllGather(ag_config, state, name))
        if replicate_group is not None:
            m.set_all_reduce_hook(ReplicateHook(config, replicate_group, "mean", state, name))
    if not found:
        raise DynamiqError("dynamiq.fsdp.enable: the model has no FSDPModule; call "
                           "torch.distributed.fsdp.fully_shard on it (and its blocks) first")
    model._dynamiq_fsdp_state = state
    return state
