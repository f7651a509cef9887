"""The DDP communication hook: `dynamiq.register(ddp_model, config)`."""

from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from ._worker import worker_for
from .api import (DIRECT_SEQ_BASE, DynamiqError, comm_device_for, ready_event, resolve_group, run_collective,
                  wait_ready)
from .config import Config

_STATE_VERSION = 1

# Hooks registered so far per dynamiq group name: the k-th starts its sequence
# numbers at k * _STREAM_STRIDE (direct all_reduce calls use 2**63 and up).
_STREAM_STRIDE = 1 << 48
_hooks_per_group: Dict[str, int] = {}


class HookState:
    """State of dynamiq's DDP hook on one model.

    Attributes:
      config: the `Config` used for the next bucket. Assign a new Config on
        every rank between steps to switch mode or topology
        (`state.config = state.config.replace(mode="none")`); ranks that
        disagree raise at the next bucket.
      process_group, group_name: the process group dynamiq sends on: its own,
        with the ranks, backend and timeout of the model's group.
      step: completed optimizer steps seen by the hook (advanced after the
        last bucket of each backward pass).
      seq: sequence number of the next collective; with `config.seed` it keys
        all randomness, so restoring it (via `load_state_dict`) resumes the same
        random stream. The k-th model registered on a group in a process
        (k = 0, 1, ...) starts at k * 2**48, so two models trained side by side
        (a GAN's two networks) never draw the same random numbers.
      alloc_u: per bucket index, the state (u, bracketing step) of the fast
        width allocator (appendix A), carried across steps. Keyed by bucket index; DDP
        rebuilds buckets after the first iteration, and a bucket whose size
        changed simply starts from the previous u.
      last_step_stats: per-bucket statistics of the last completed step (bytes
        sent, bits per coordinate, width histogram, time split, path taken;
        dynamiq buckets: `alloc_exact`, slices whose widths came from an
        exact search, and `alloc_fallbacks`, of those the fast allocator's
        fallbacks after the statistics moved too far since the last step).
      totals: running sums over all steps of this rank: `bytes_sent` (the
        all-reduces of the buckets) and `meta_bytes_sent` (dynamiq's
        statistics all-reduces), as in last_step_stats; `buckets`; buckets per
        path; exact allocator searches and fallbacks. Not in state_dict.

    Tuning: lower `bits` sends less but adds error; "butterfly" needs fewer
    hops (error grows more slowly with world size) but each hop carries more.
    `block_bytes` trades pipelining depth against per-message overhead.
    """

    __slots__ = ("_config", "process_group", "group_name", "world_size", "step", "seq", "alloc_u",
                 "last_step_stats", "_current", "totals")

    def __init__(self, config: Config, process_group: dist.ProcessGroup, group_name: str) -> None:
        self.config = config
        self.process_group = process_group
        self.group_name = group_name
        self.world_size = dist.get_world_size(process_group)
        self.step = 0
        self.seq = 0
        self.alloc_u: Dict[int, tuple] = {}
        self.last_step_stats: List[dict] = []
        self._current: List[dict] = []
        self.totals: Dict[str, Any] = {"bytes_sent": 0, "meta_bytes_sent": 0, "buckets": 0, "paths": {},
                                       "alloc_exact": 0, "alloc_fallbacks": 0}

    @property
    def config(self) -> Config:
        return self._config

    @config.setter
    def config(self, config: Config) -> None:
        if not isinstance(config, Config):
            raise TypeError(f"dynamiq: HookState.config must be a dynamiq.Config, got {type(config).__name__}")
        self._config = config

    # -- checkpointing ---------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "version": _STATE_VERSION,
            "config": self.config.to_dict(),
            "step": self.step,
            "seq": self.seq,
            "alloc_u": {int(k): [float(v[0]), float(v[1])] for k, v in self.alloc_u.items()},
        }

    def load_state_dict(self, d: dict) -> None:
        if d.get("version") != _STATE_VERSION:
            raise ValueError(f"dynamiq: hook state version {d.get('version')!r} is not supported")
        self.config = Config.from_dict(d["config"])
        self.step = int(d["step"])
        self.seq = int(d["seq"])
        self.alloc_u = {int(k): (float(v[0]), float(v[1])) for k, v in d["alloc_u"].items()}

    # -- bookkeeping (runs on the worker thread, in bucket order) -------------------------
    def _record(self, index: int, stats: dict, is_last: bool) -> None:
        stats = dict(stats, bucket=index, step=self.step)
        self._current.append(stats)
        if stats.get("u") is not None:
            self.alloc_u[index] = tuple(stats["u"])
        self.totals["bytes_sent"] += stats["bytes_sent"]
        self.totals["meta_bytes_sent"] += stats["meta_bytes_sent"]
        self.totals["buckets"] += 1
        paths = self.totals["paths"]
        paths[stats["path"]] = paths.get(stats["path"], 0) + 1
        self.totals["alloc_exact"] += stats.get("alloc_exact", 0)
        self.totals["alloc_fallbacks"] += stats.get("alloc_fallbacks", 0)


# Annotations are checked by DDP.register_comm_hook: keep them real types.
def _hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    buf = bucket.buffer()
    index = bucket.index()
    is_last = bucket.is_last()
    config = state.config  # snapshot: a switch applies from the next bucket on
    seq = state.seq
    state.seq += 1
    u = state.alloc_u.get(index)
    name = state.group_name

    ev = ready_event(buf, name)
    device = comm_device_for(buf, name)  # on the caller's thread

    def work():
        result = buf
        try:
            wait_ready(buf, ev)
            if buf.layout == torch.strided:
                stats = run_collective(buf, name, config, "mean", seq, u, device=device)
            else:
                result, stats = _sparse_mean(buf, state.process_group)
            state._record(index, stats, is_last)
        finally:
            if is_last:
                state.last_step_stats = state._current
                state._current = []
                state.step += 1
        return result

    fut = worker_for(name).submit(work, device=buf.device if ev is not None else None)
    # DDP reads the hook's result in C++: a failure set with Future.set_exception
    # would reach `backward()` as "Unable to cast <message> to Tensor". A callback
    # that raises marks the chained Future failed, and backward() raises a
    # RuntimeError naming the exception: "... TransportError: dynamiq: ...".
    return fut.then(_result)


def _result(fut: torch.futures.Future) -> torch.Tensor:
    return fut.wait()


def _sparse_mean(grad: torch.Tensor, group: dist.ProcessGroup) -> tuple:
    """The mean of a sparse gradient (nn.Embedding(sparse=True); DDP gives each its own
    bucket), uncompressed: torch's sparse all-reduce on dynamiq's group, from the
    worker thread in bucket order like every other bucket. Stats path "sparse", with the
    bytes of this rank's indices and values as bytes_sent."""
    t = grad.coalesce()
    nbytes = t.indices().numel() * t.indices().element_size() + t.values().numel() * t.values().element_size()
    dist.all_reduce(t, group=group)
    t = t / dist.get_world_size(group)
    # only what is known here (torch does not say what its sparse all-reduce received)
    return t, {"path": "sparse", "numel": grad.numel(), "bytes_sent": nbytes, "meta_bytes_sent": 0,
               "bits_per_coord": 8.0 * nbytes / max(1, grad.numel()), "u": None,
               "width_units": {w: 0 for w in (1, 2, 4, 8, 16)}, "alloc_exact": 0, "alloc_fallbacks": 0,
               "alloc_passes": 0}


def register(ddp_model: torch.nn.parallel.DistributedDataParallel, config: Optional[Config] = None,
             process_group: Optional[dist.ProcessGroup] = None) -> HookState:
    """Registers dynamiq as the communication hook of a DDP model.

    Gradients are averaged over `process_group` (default: the model's group)
    with the given config. Returns the `HookState` (stats, config switching,
    `state_dict`). Call on every rank of the group, before the first backward
    pass: the first call for a group makes dynamiq's own process group with the
    same ranks (README, "API"; `dynamiq.api._private_group`).
    """
    if not isinstance(ddp_model, torch.nn.parallel.DistributedDataParallel):
        raise TypeError("dynamiq.register: expected a torch.nn.parallel.DistributedDataParallel model, "
                        f"got {type(ddp_model).__name__}")
    config = config if config is not None else Config()
    if not isinstance(config, Config):
        raise TypeError(f"dynamiq.register: config must be a dynamiq.Config, got {type(config).__name__}")
    pg = process_group if process_group is not None else getattr(ddp_model, "process_group", None)
    pg, name = resolve_group(pg)
    state = HookState(config, pg, name)
    k = _hooks_per_group.get(name, 0)
    if (k + 1) * _STREAM_STRIDE > DIRECT_SEQ_BASE:
        raise DynamiqError(f"dynamiq.register: {k} models already registered on this group in this "
                           "process; their random streams would overlap")
    state.seq = k * _STREAM_STRIDE
    ddp_model.register_comm_hook(state, _hook)  # raises for a model that has a hook already
    _hooks_per_group[name] = k + 1
    return state
