"""The DDP communication hook, in torch's convention:

    state = dynamiq.HookState(config)                       # before or after init_process_group
    ddp_model.register_comm_hook(state, dynamiq.comm_hook)

and `dynamiq.register(ddp_model, config)`, the one-call shortcut built on them.
"""

import concurrent.futures
import gc
import threading
import weakref
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from . import _C
from ._groups import _alive, _not_a_member, resolve_group
from ._worker import worker_for
from .api import DIRECT_SEQ_BASE, DynamiqError, comm_device_for, ready_event, run_collective, wait_ready
from .config import Config

_STATE_VERSION = 1

# Hook states bound so far per dynamiq group name: the k-th starts its sequence
# numbers at k * _STREAM_STRIDE (direct all_reduce calls use 2**63 and up).
_STREAM_STRIDE = 1 << 48
_hooks_per_group: Dict[str, int] = {}
_bind_lock = threading.Lock()  # binding a state: its groups, its model, its range of sequence numbers


class HookState:
    """State of dynamiq's DDP communication hook on one model (torch's convention, as
    `PowerSGDState`): `ddp_model.register_comm_hook(state, dynamiq.comm_hook)`.

    `HookState(config=None, process_group=None)` may be made before
    `torch.distributed.init_process_group` (a trainer takes it at construction:
    Lightning's `DDPStrategy(ddp_comm_state=..., ddp_comm_hook=...)`). It binds
    at its model's first bucket, on every rank alike: it finds the DDP model it is
    registered on, takes its process group (or checks that `process_group`, when
    given, is that group), makes dynamiq's own group with the same ranks and
    its worker thread, and takes its range of sequence numbers. One state
    serves one model: a bucket of another model raises `DynamiqError`.
    `dynamiq.register(ddp_model, config)` makes, binds and registers one at once.

    Attributes:
      config: the `Config` used for the next bucket (default `Config()`). Assign a new
        Config on every rank between steps to switch mode or topology
        (`state.config = state.config.replace(mode="none")`); ranks that
        disagree raise at the next bucket.
      process_group: the group gradients are averaged over: the one given, or
        once bound the model's (None before that).
      own_group, group_name: the process group dynamiq sends on, its own with the
        ranks, backend and timeout of `process_group`, and its name (None until bound).
      world_size: the size of that group (None until bound).
      step: completed optimizer steps seen by the hook (advanced after the
        last bucket of each backward pass).
      seq: sequence number of the next collective; with `config.seed` it keys
        all randomness, so restoring it (via `load_state_dict`) resumes the same
        random stream. The k-th state bound on a group in a process
        (k = 0, 1, ...) starts at k * 2**48, so two models trained side by side
        (a GAN's two networks) never draw the same random numbers; a state
        loaded before it is bound keeps the loaded value.
      alloc_u: per bucket index, the state (u, bracketing step) of the fast
        width allocator (appendix A), carried across steps. Keyed by bucket index; DDP
        rebuilds buckets after the first iteration, and a bucket whose size
        changed simply starts from the previous u.
      last_step_stats: per-bucket statistics of the last completed step (bytes
        sent, bits per coordinate, width histogram, time split, path taken,
        `element_size` of the bucket's dtype; dynamiq buckets: `alloc_exact`,
        slices whose widths came from an exact search, and `alloc_fallbacks`,
        of those the fast allocator's fallbacks after the statistics moved too
        far since the last step). `summary()` is one line of them, `scalars()`
        the same numbers by name (for TensorBoard).
      totals: running sums over all steps of this rank: `bytes_sent` (the
        all-reduces of the buckets) and `meta_bytes_sent` (dynamiq's
        statistics all-reduces), as in last_step_stats; `buckets`; buckets per
        path; exact allocator searches and fallbacks. Not in state_dict.
      timeline: False by default; True adds each bucket's per-operation
        timeline to its statistics (`last_step_stats[i]["timeline"]`,
        docs/api.md); a switch applies from the next bucket on. Not in
        state_dict; nothing on the wire changes.
      stats_ahead: True by default: a CPU bucket's statistics pass runs on a
        helper thread as soon as DDP hands the bucket over, while the worker
        may still be sending earlier buckets (results and bytes unchanged);
        False runs it on the worker, in turn.

    Tuning: lower `bits` sends less but adds error; "butterfly" needs fewer
    hops (error grows more slowly with world size) but each hop carries more.
    `block_bytes` trades pipelining depth against per-message overhead.
    """

    __slots__ = ("_config", "process_group", "own_group", "group_name", "world_size", "step", "seq", "alloc_u",
                 "last_step_stats", "_current", "totals", "_model", "_param_ids", "_seq_loaded", "timeline",
                 "stats_ahead", "__weakref__")

    def __init__(self, config: Optional[Config] = None, process_group: Optional[dist.ProcessGroup] = None) -> None:
        self.config = config if config is not None else Config()
        if process_group is not None and not isinstance(process_group, dist.ProcessGroup):
            raise TypeError("dynamiq.HookState: process_group must be a torch.distributed.ProcessGroup or None, "
                            f"got {type(process_group).__name__}")
        self.process_group = process_group
        self.own_group: Optional[dist.ProcessGroup] = None
        self.group_name: Optional[str] = None
        self.world_size: Optional[int] = None
        self.step = 0
        self.seq = 0
        self.alloc_u: Dict[int, tuple] = {}
        self.last_step_stats: List[dict] = []
        self._current: List[dict] = []
        self.totals: Dict[str, Any] = {"bytes_sent": 0, "meta_bytes_sent": 0, "buckets": 0, "paths": {},
                                       "alloc_exact": 0, "alloc_fallbacks": 0}
        self._model = None  # weakref to the DDP model once bound (None: unbound, or bound without one)
        self._param_ids: frozenset = frozenset()
        self._seq_loaded = False
        self.timeline = False
        self.stats_ahead = True

    @property
    def config(self) -> Config:
        return self._config

    @config.setter
    def config(self, config: Config) -> None:
        if not isinstance(config, Config):
            raise TypeError(f"dynamiq: HookState.config must be a dynamiq.Config, got {type(config).__name__}")
        self._config = config

    def __repr__(self) -> str:
        where = f"group {self.group_name!r}, world {self.world_size}" if self.group_name else "not bound yet"
        return f"dynamiq.HookState({self.config!r}; {where}; step {self.step})"

    # -- pickling (a trainer that starts its ranks with spawn sends the state along) -----
    def __getstate__(self) -> dict:
        if self.group_name is not None or self.process_group is not None:
            raise TypeError("dynamiq.HookState: a state holding a process group cannot be pickled; pickle an "
                            "unbound HookState(config) (made without process_group), or save state_dict()")
        return {"state_dict": self.state_dict(), "seq_loaded": self._seq_loaded}

    def __setstate__(self, d: dict) -> None:
        HookState.__init__(self)
        self.load_state_dict(d["state_dict"])
        self._seq_loaded = d["seq_loaded"]

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
        """Restores config, step, sequence number and allocator state (before the first
        backward after a restart; before or after the state is bound)."""
        if d.get("version") != _STATE_VERSION:
            raise ValueError(f"dynamiq: hook state version {d.get('version')!r} is not supported")
        self.config = Config.from_dict(d["config"])
        self.step = int(d["step"])
        self.seq = int(d["seq"])
        self.alloc_u = {int(k): (float(v[0]), float(v[1])) for k, v in d["alloc_u"].items()}
        self._seq_loaded = True

    # -- logging ---------------------------------------------------------------------
    def scalars(self, prefix: str = "dynamiq/") -> Dict[str, float]:
        """The last completed step's statistics as named numbers, summed over its buckets
        (empty before the first step). For TensorBoard:

            for name, value in state.scalars().items():
                writer.add_scalar(name, value, global_step=state.step)

        Keys (after `prefix`): `buckets`; `bytes_sent` and `meta_bytes_sent` (this rank,
        as in last_step_stats); `ring_bytes`, what a ring all-reduce of the raw buckets
        sends per rank, 2 (n-1)/n x their bytes (Gloo's and NCCL's all-reduce send that
        much); `saved_fraction` = 1 - (bytes_sent + meta_bytes_sent) / ring_bytes
        (negative: dynamiq sent more; absent on one rank); `bits_per_coord`, the buckets'
        plan bits per coordinate weighted by size (for lossless the raw width, its upper
        bound; `saved_fraction` has what it saved); `t_codec_ms` (local pass, plan,
        codec kernels), `t_wire_ms` (header exchange, statistics all-reduce, waiting for
        and posting messages) and `t_total_ms`, summed over buckets; `alloc_exact`;
        `paths/<path>`, buckets per path.
        """
        stats = self.last_step_stats
        if not stats:
            return {}
        n = self.world_size or 1
        raw = sum(s["numel"] * s.get("element_size", 4) for s in stats)
        numel = sum(s["numel"] for s in stats)
        out: Dict[str, float] = {
            "buckets": float(len(stats)),
            "bytes_sent": float(sum(s["bytes_sent"] for s in stats)),
            "meta_bytes_sent": float(sum(s["meta_bytes_sent"] for s in stats)),
            "ring_bytes": 2.0 * (n - 1) / n * raw,
            "bits_per_coord": sum(s["bits_per_coord"] * s["numel"] for s in stats) / max(1, numel),
            "t_codec_ms": 1e3 * sum(s.get("t_local", 0.0) + s.get("t_plan", 0.0) + s.get("t_kernel", 0.0)
                                    for s in stats),
            "t_wire_ms": 1e3 * sum(s.get("t_header", 0.0) + s.get("t_meta", 0.0) + s.get("t_wait", 0.0)
                                   + s.get("t_post", 0.0) for s in stats),
            "t_total_ms": 1e3 * sum(s.get("t_total", 0.0) for s in stats),
            "alloc_exact": float(sum(s.get("alloc_exact", 0) for s in stats)),
        }
        if out["ring_bytes"] > 0:
            out["saved_fraction"] = 1.0 - (out["bytes_sent"] + out["meta_bytes_sent"]) / out["ring_bytes"]
        for s in stats:
            key = "paths/" + s["path"]
            out[key] = out.get(key, 0.0) + 1.0
        return {prefix + k: v for k, v in out.items()}

    def summary(self) -> str:
        """One line on the last completed step, to print or log after each optimizer step:

            dynamiq step 12: 4 buckets on 2 ranks, sent 1.3 MB + 2.1 kB stats of 8.4 MB
            (ring all-reduce of the raw buckets): 84.5% saved, 4.98 bits/coord, paths
            compressed 3, exact-tiny 1; codec 3.1 ms, wire 8.2 ms, total 12.0 ms

        (one line; the numbers of `scalars()`)."""
        sc = self.scalars(prefix="")
        if not sc:
            return "dynamiq: no step completed yet"
        paths = ", ".join(f"{k[len('paths/'):]} {int(v)}" for k, v in sorted(sc.items()) if k.startswith("paths/"))
        saved = f"{100.0 * sc['saved_fraction']:.1f}% saved" if "saved_fraction" in sc else "one rank: nothing sent"
        nb = int(sc["buckets"])
        return (f"dynamiq step {self.step}: {nb} bucket{'s' if nb != 1 else ''} on {self.world_size} ranks, "
                f"sent {_fmt_bytes(sc['bytes_sent'])} + {_fmt_bytes(sc['meta_bytes_sent'])} stats "
                f"of {_fmt_bytes(sc['ring_bytes'])} (ring all-reduce of the raw buckets): {saved}, "
                f"{sc['bits_per_coord']:.2f} bits/coord, paths {paths}; "
                f"codec {sc['t_codec_ms']:.1f} ms, wire {sc['t_wire_ms']:.1f} ms, total {sc['t_total_ms']:.1f} ms")

    # -- binding (at the first bucket, or at register) ---------------------------------
    def _bind(self, model: Optional[torch.nn.parallel.DistributedDataParallel]) -> None:
        """Binds the state to `model` (None: not found), with its process group; makes
        dynamiq's group for it. Collective over the group's members (all bind alike)."""
        model_group = getattr(model, "process_group", None) if model is not None else None
        g = self.process_group
        if g is not None and model_group is not None and not _same_group(g, model_group):
            raise DynamiqError(
                f"dynamiq: process-group mismatch: the HookState was made for {_describe(g)} but its DDP model "
                f"averages over {_describe(model_group)}; pass the model's group (or none) to HookState")
        if g is None:
            g = model_group
        if g is not None and (_not_a_member(g) or not _alive(g)):
            raise DynamiqError(f"dynamiq: process-group mismatch: this rank is not a member of the HookState's "
                               f"process group, or that group was destroyed ({_describe(g)})")
        own, name = resolve_group(g)
        self.process_group = g if g is not None else dist.group.WORLD
        self.own_group = own
        self.group_name = name
        self.world_size = dist.get_world_size(own)
        if model is not None:
            self._model = weakref.ref(model)
            self._param_ids = frozenset(id(p) for p in model.parameters())

    def _claim_stream(self) -> None:
        """Takes this state's range of sequence numbers on its group (the k-th state bound
        on the group in this process starts at k * 2**48, unless one was loaded)."""
        k = _hooks_per_group.get(self.group_name, 0)
        if (k + 1) * _STREAM_STRIDE > DIRECT_SEQ_BASE:
            raise DynamiqError(f"dynamiq: {k} hook states already bound on this group in this "
                               "process; their random streams would overlap")
        if not self._seq_loaded:
            self.seq = k * _STREAM_STRIDE
        _hooks_per_group[self.group_name] = k + 1

    def _check_bucket(self, bucket: dist.GradBucket) -> None:
        """Binds an unbound state (first bucket); else checks that `bucket` is of its model."""
        if self.group_name is None:
            with _bind_lock:
                if self.group_name is None:
                    models = _ddp_models_holding(self)
                    if len(models) > 1:
                        raise DynamiqError(
                            f"dynamiq.comm_hook: one HookState is registered on {len(models)} DDP models; "
                            "it holds one model's sequence numbers and allocator state: make a HookState per model")
                    self._bind(models[0] if models else None)
                    self._claim_stream()
                    return
        if self.process_group is not None and not _alive(self.process_group):
            raise DynamiqError(f"dynamiq: process-group mismatch: the HookState's process group "
                               f"{_describe(self.process_group)} was destroyed; make a new HookState for the new group")
        if self._model is None:
            return  # bound without a model (a hook registered other than by register_comm_hook)
        model = self._model()
        params = bucket.parameters()
        if model is None or (params and id(params[0]) not in self._param_ids):
            raise DynamiqError(
                "dynamiq.comm_hook: this HookState is already bound to another DDP model "
                f"({'no longer alive' if model is None else _describe_model(model)}) and got a bucket of a "
                "model it was not bound to; make one HookState per model")

    # -- bookkeeping (runs on the worker thread, in bucket order) -------------------------
    def _record(self, index: int, stats: dict, is_last: bool, element_size: int) -> None:
        stats = dict(stats, bucket=index, step=self.step, element_size=element_size)
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


def _fmt_bytes(x: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if x >= scale:
            return f"{x / scale:.1f} {unit}"
    return f"{int(x)} B"


def _same_group(a: dist.ProcessGroup, b: dist.ProcessGroup) -> bool:
    return a is b or getattr(a, "group_name", None) == getattr(b, "group_name", None)


def _describe(g: dist.ProcessGroup) -> str:
    try:
        ranks = dist.get_process_group_ranks(g)
    except Exception:  # noqa: BLE001 - destroyed, or not a member
        ranks = "?"
    default = " (the default group)" if dist.is_initialized() and g is dist.group.WORLD else ""
    return f"group '{getattr(g, 'group_name', '?')}'{default} of ranks {ranks}"


def _describe_model(model: torch.nn.Module) -> str:
    params = list(model.parameters())
    inner = getattr(model, "module", model)
    return (f"a {type(inner).__name__} with {len(params)} parameters, "
            f"{sum(p.numel() for p in params)} elements")


def _ddp_models_holding(state: HookState) -> list:
    """The DDP models on which `state` is registered (DDP keeps (hook, state) pairs in
    `_comm_hooks`). A comm hook is handed no model; this finds it once per state, at its
    first bucket, by one pass over the objects the garbage collector tracks."""
    ddp, module = torch.nn.parallel.DistributedDataParallel, torch.nn.Module
    found = []
    for o in gc.get_objects():
        # by type, not isinstance: that reads `__class__` of every object, and some objects
        # warn when read (torch.distributed.reduce_op)
        t = type(o)
        if issubclass(t, module) and issubclass(t, ddp) and any(st is state for _, st in o._comm_hooks):
            found.append(o)
    return found


# Annotations are checked by DDP.register_comm_hook: keep them real types.
def comm_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """dynamiq's DDP communication hook: `ddp_model.register_comm_hook(state, dynamiq.comm_hook)`
    with a `dynamiq.HookState`. Averages the bucket over the state's process group with
    `state.config` and returns a Future of the result (DDP waits for it before the
    optimizer step). Raises `DynamiqError` for a state of another model or a process
    group other than the model's."""
    if not isinstance(state, HookState):
        raise DynamiqError(f"dynamiq.comm_hook: state must be a dynamiq.HookState, got {type(state).__name__} "
                           "(ddp_model.register_comm_hook(dynamiq.HookState(config), dynamiq.comm_hook))")
    state._check_bucket(bucket)
    buf = bucket.buffer()
    index = bucket.index()
    is_last = bucket.is_last()
    config = state.config  # snapshot: a switch applies from the next bucket on
    seq = state.seq
    state.seq += 1
    u = state.alloc_u.get(index)
    name = state.group_name
    timeline = bool(state.timeline)
    # the bucket's statistics now, beside earlier buckets' transfers (CPU buckets of a
    # compressing mode): the worker finds them done when the bucket's turn comes
    prep = None
    if state.stats_ahead and buf.layout == torch.strided and buf.device.type == "cpu" and config.mode != "none":
        prep = _prep_pool(name).submit(_precompute, buf, config)

    ev = ready_event(buf, name)
    device = comm_device_for(buf, name)  # on the caller's thread

    def work():
        result = buf
        try:
            wait_ready(buf, ev)
            if buf.layout == torch.strided:
                pre = None
                if prep is not None:
                    try:
                        pre = prep.result()
                    except Exception:  # noqa: BLE001 - the call runs its own pass and reports
                        pre = None
                stats = run_collective(buf, name, config, "mean", seq, u, device=device, timeline=timeline,
                                       local_pass=pre)
            else:
                result, stats = _sparse_mean(buf, state.own_group)
            state._record(index, stats, is_last, buf.element_size())
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


_prep_pools: Dict[str, "concurrent.futures.ThreadPoolExecutor"] = {}
_prep_lock = threading.Lock()


def _prep_pool(name: str) -> "concurrent.futures.ThreadPoolExecutor":
    """One helper thread per group for buckets' statistics passes (HookState.stats_ahead)."""
    with _prep_lock:
        pool = _prep_pools.get(name)
        if pool is None:
            pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"dynamiq-stats-{name}")
            _prep_pools[name] = pool
        return pool


def _precompute(buf: torch.Tensor, config: Config):
    try:
        return _C.precompute_local_pass(buf.view(-1) if buf.dim() != 1 else buf, config._to_cpp())
    except Exception:  # noqa: BLE001 - the call runs its own pass and reports what failed
        return None


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
    """Registers dynamiq as the communication hook of a DDP model; returns its `HookState`.

    The one-call form of `ddp_model.register_comm_hook(dynamiq.HookState(config), dynamiq.comm_hook)`
    that binds the state at once (the first call for a group makes dynamiq's own
    process group with the same ranks: `dynamiq._groups._private_group`). Gradients are
    averaged over the model's group; `process_group`, if given, must be that group.
    Call on every rank of the group, before the first backward pass.
    """
    if not isinstance(ddp_model, torch.nn.parallel.DistributedDataParallel):
        raise TypeError("dynamiq.register: expected a torch.nn.parallel.DistributedDataParallel model, "
                        f"got {type(ddp_model).__name__}")
    if config is not None and not isinstance(config, Config):
        raise TypeError(f"dynamiq.register: config must be a dynamiq.Config, got {type(config).__name__}")
    state = HookState(config, process_group)
    with _bind_lock:
        state._bind(ddp_model)
        ddp_model.register_comm_hook(state, comm_hook)  # raises for a model that has a hook already
        state._claim_stream()
    return state
