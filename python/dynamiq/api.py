"""`dynamiq.all_reduce`, `dynamiq.reduce_scatter`, `dynamiq.all_gather` and `dynamiq.simulate`."""

from __future__ import annotations

import threading
from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from . import _C
from ._groups import _not_a_member, resolve_group, transport_for  # noqa: F401 (resolve_group: re-exported)
from ._worker import worker_for
from .config import AUTO, Config, exact_modes, topologies, topology_supports


def _exact_list() -> str:
    return " or ".join(repr(m) for m in exact_modes())

DynamiqError = _C.DynamiqError
TransportError = _C.TransportError
MalformedMessage = _C.MalformedMessage

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Input error codes shared with the C++ driver (csrc/hook/collective/collective.h InputError).
_ERR_DTYPE, _ERR_LAYOUT, _ERR_DEVICE, _ERR_SHAPE = 1, 2, 3, 7

# Collective kinds of the C++ driver (csrc/hook/collective/config.h Collective).
_KINDS = {"all_reduce": 0, "reduce_scatter": 1, "all_gather": 2}

# Direct all_reduce calls number their collectives per group in the upper half
# of the sequence space; hooks use the lower half. The sequence number keys the
# randomness and is part of the fingerprint ranks compare.
DIRECT_SEQ_BASE = 1 << 63
_direct_seq: Dict[str, int] = {}
_seq_lock = threading.Lock()


def check_tensor(t: torch.Tensor, group_name: Optional[str] = None) -> Tuple[int, str]:
    """(error code, message) for a tensor dynamiq cannot all-reduce; (0, "") if fine."""
    if t.layout != torch.strided:
        return _ERR_LAYOUT, (
            f"dynamiq: {t.layout} tensors are not supported; all-reduce them with torch.distributed "
            "(the DDP hook does so itself for sparse gradients)")
    if t.dtype not in SUPPORTED_DTYPES:
        return _ERR_DTYPE, (
            f"dynamiq: dtype {t.dtype} is not supported; use torch.float32, torch.bfloat16 or "
            "torch.float16 (cast the tensor, or all-reduce it with torch.distributed)")
    if t.device.type == "cuda":
        if not _C.built_with_cuda():
            return _ERR_DEVICE, (
                "dynamiq: CUDA tensors are not supported by this build (it was built without nvcc); "
                "reinstall with the CUDA toolkit on the PATH, or all-reduce CPU tensors over Gloo")
        if not torch.cuda.is_available():
            return _ERR_DEVICE, "dynamiq: a CUDA tensor, but torch.cuda.is_available() is False"
    if t.device.type in ("cpu", "cuda"):
        # the C++ transport factory's word on the group's backend for this device
        why = transport_for(group_name, t.device.type)[1] if group_name is not None else ""
        if why:
            return _ERR_DEVICE, why
    else:
        return _ERR_DEVICE, f"dynamiq: tensors on device {t.device} are not supported; use a CPU or CUDA tensor"
    if not t.is_contiguous():
        return _ERR_LAYOUT, (
            "dynamiq: tensor is not contiguous; all_reduce works in place on contiguous memory: "
            "pass t.contiguous() and copy the result back")
    return 0, ""


def comm_device(t: Optional[torch.Tensor], group_name: str) -> str:
    """The device the collective's buffers (and header exchange) use for `t` on this group."""
    if t is not None and t.device.type == "cuda":
        return str(t.device)
    direct_cuda = transport_for(group_name, "cuda")[0]
    if transport_for(group_name, "cpu")[0] is None and direct_cuda is not None and not direct_cuda["host_staging"] \
            and torch.cuda.is_available():
        return f"cuda:{torch.cuda.current_device()}"  # an NCCL-only group: header on the GPU
    return "cpu"


def host_staged(device: str, group_name: str, config: Config) -> bool:
    """Whether a collective on `device` stages its CUDA buffers through page-locked host memory
    over the group's CPU backend (Gloo): asked for (`Config.host_staging`), or the group has no
    CUDA backend (NCCL). How several processes share one GPU."""
    if not device.startswith("cuda"):
        return False
    if config.host_staging:
        return True  # asked for (a group without Gloo is refused at the call, on every rank)
    entry = transport_for(group_name, "cuda")[0]  # the C++ transport factory's choice
    return bool(entry is not None and entry["host_staging"])


def comm_device_for(t: torch.Tensor, group_name: str) -> str:
    """comm_device for a tensor a collective was issued with (ignored if it is not valid input).

    Call it on the thread that issues the collective: the current CUDA device is per thread."""
    return comm_device(None if check_tensor(t, group_name)[0] else t, group_name)


def _next_direct_seq(group_name: str) -> int:
    with _seq_lock:
        k = _direct_seq.get(group_name, 0)
        _direct_seq[group_name] = k + 1
    return DIRECT_SEQ_BASE + k


def run_collective(tensor: torch.Tensor, group_name: str, config: Config, op: str, seq: int,
                   u: Optional[tuple] = None, device: Optional[str] = None, timeline: bool = False,
                   local_pass=None) -> dict:
    """Runs one collective synchronously on the calling thread (the group worker).

    Validates the tensor; a rank with bad input still takes part in the header
    exchange so that its peers raise at once instead of timing out. `device`:
    where the collective's buffers and header live (`comm_device`, evaluated on
    the thread that issued the collective: the current CUDA device is per
    thread); None evaluates it here. `timeline=True` adds the call's
    per-operation timeline to the statistics (`stats["timeline"]`, docs/api.md).
    `local_pass`: the bucket's statistics pass run ahead (`_C.precompute_local_pass` of
    this tensor and config), or None.
    """
    code, msg = check_tensor(tensor, group_name)
    cpp = config._to_cpp()
    if device is None:
        device = comm_device(tensor if not code else None, group_name)
    staging = host_staged(device, group_name, config)
    if code:
        try:
            _C.all_reduce(None, group_name, cpp, op, seq, None, code, device, staging=staging)
        except DynamiqError:
            pass
        raise DynamiqError(msg)
    return _C.all_reduce(tensor.view(-1) if tensor.dim() != 1 else tensor, group_name, cpp, op, seq, u, 0,
                         device, staging=staging, timeline=bool(timeline), local_pass=local_pass)


def ready_event(tensor: torch.Tensor, group_name: str) -> Optional["torch.cuda.Event"]:
    """For a CUDA tensor dynamiq accepts (or a sparse one, which the hook hands to torch):
    an event on the caller's current stream after which it is ready (None otherwise: CPU
    tensors, and bad input, which is reported on the worker)."""
    if tensor.device.type != "cuda":
        return None
    if tensor.layout == torch.strided and check_tensor(tensor, group_name)[0]:
        return None
    ev = torch.cuda.Event()
    ev.record(torch.cuda.current_stream(tensor.device))
    return ev


def wait_ready(tensor: torch.Tensor, ev: Optional["torch.cuda.Event"]) -> None:
    """On the group worker: order its work (on its own stream, current there: _worker.py)
    after the caller's producer of `tensor`."""
    if ev is not None:
        torch.cuda.current_stream(tensor.device).wait_event(ev)


def all_reduce(tensor: torch.Tensor, config: Optional[Config] = None,
               group: Optional[dist.ProcessGroup] = None, op: str = "sum",
               async_op: bool = False):
    """All-reduce `tensor` in place over `group` with dynamiq.

    Like `torch.distributed.all_reduce`: every rank passes a tensor of the same
    shape and dtype (float32, bfloat16 or float16, contiguous; CPU with a Gloo
    group, or CUDA in a CUDA build with an NCCL group, or with a Gloo one
    through page-locked host memory: `Config.host_staging`; the CUDA paths have
    not run on a GPU yet); on return every rank holds the same result, `sum` or `mean` of the
    inputs (exactly for mode "none" and "lossless", an unbiased estimate for
    the lossy modes).

    Returns None, or with `async_op=True` a `torch.futures.Future` whose value
    is the tensor; failures (peer gone, timeout, disagreeing configs) are
    raised from `wait()`.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"dynamiq.all_reduce: expected a torch.Tensor, got {type(tensor).__name__}")
    if op not in ("sum", "mean"):
        raise ValueError(f"dynamiq.all_reduce: op must be 'sum' or 'mean', got {op!r}")
    config = config if config is not None else Config()
    if not isinstance(config, Config):
        raise TypeError(f"dynamiq.all_reduce: config must be a dynamiq.Config, got {type(config).__name__}")
    if _not_a_member(group):
        return None  # as torch.distributed.all_reduce on a rank outside the group
    _, name = resolve_group(group)
    worker = worker_for(name)
    if not async_op and worker.on_worker():
        # a callback of one of this group's futures (fut.then(...)) runs on the
        # group's worker: waiting there for a collective queued behind it never ends
        raise DynamiqError("dynamiq.all_reduce: called with async_op=False from a callback of a dynamiq "
                           "Future (it runs on dynamiq's worker for this group, which would wait for "
                           "itself); use async_op=True there, or call from your own thread")
    seq = _next_direct_seq(name)

    ev = ready_event(tensor, name)
    device = comm_device_for(tensor, name)

    def work():
        wait_ready(tensor, ev)
        if ev is not None:  # in use on our stream (and NCCL's): a caller that drops it unwaited
            tensor.record_stream(torch.cuda.current_stream(tensor.device))  # must not free it under us
        run_collective(tensor, name, config, op, seq, device=device)
        return tensor

    fut = worker.submit(work, device=tensor.device if ev is not None else None)
    if async_op:
        return fut
    fut.wait()
    return None


def _op_of(op, fn: str) -> str:
    if op not in ("sum", "mean"):
        raise ValueError(f"dynamiq.{fn}: op must be 'sum' or 'mean', got {op!r}")
    return op


def _config_of(config, fn: str) -> Config:
    config = config if config is not None else Config()
    if not isinstance(config, Config):
        raise TypeError(f"dynamiq.{fn}: config must be a dynamiq.Config, got {type(config).__name__}")
    return config


def check_sharded_config(config: Config, collective: str, who: str) -> None:
    """Raises DynamiqError, where the config is given, for what a reduce-scatter or all-gather
    cannot run: mode "auto" (its cost model and its choice are the all-reduce's) and a topology
    that runs all-reduces only. (They would otherwise fail at the first collective, on every rank.)"""
    what = collective.replace("_", "-")
    if config.mode == AUTO:
        raise DynamiqError(f"{who}: mode 'auto' runs all-reduces only (it picks per bucket among "
                           f"{config.auto_lossy!r}, 'lossless' and 'none' from a cost model of the all-reduce); "
                           f"a {what} needs a mode named: e.g. {config.auto_lossy!r} or 'lossless'")
    if not topology_supports(config.topology, collective):
        only_ar = not any(topology_supports(config.topology, c) for c in ("reduce_scatter", "all_gather"))
        runs = "runs all-reduces only" if only_ar else f"runs no {what}"
        raise DynamiqError(f"{who}: topology {config.topology!r} {runs}; {'an' if what[0] in 'aeiou' else 'a'} "
                           f"{what} runs on {', '.join(repr(t) for t in topologies(collective))}")


def shard_error(kind: str, output: torch.Tensor, input: torch.Tensor, world: int,
                group_name: Optional[str] = None) -> Tuple[int, str]:
    """(error code, message) for an (output, input) pair that a reduce-scatter (`kind`
    "reduce_scatter": input of `world` equal shards, output of one) or an all-gather
    ("all_gather": the reverse) on `world` ranks cannot take; (0, "") if fine."""
    fn = f"dynamiq.{kind}"
    for what, t in (("input", input), ("output", output)):
        code, msg = check_tensor(t, group_name)
        if code:
            return code, msg.replace("dynamiq:", f"{fn}: the {what}:", 1).replace(
                "all_reduce works in place on contiguous memory", f"{kind} needs contiguous tensors")
    if output.dtype != input.dtype:
        return _ERR_SHAPE, (f"{fn}: output dtype {output.dtype} differs from input dtype {input.dtype}; "
                            "both must have the same dtype")
    if output.device != input.device:
        return _ERR_DEVICE, f"{fn}: output on {output.device} but input on {input.device}; use one device"
    if kind == "reduce_scatter":
        if input.numel() % world:
            return _ERR_SHAPE, (f"{fn}: an input of {input.numel()} elements does not split into {world} equal "
                                "shards (one per rank); pad it to a multiple of the world size")
        if output.numel() != input.numel() // world:
            return _ERR_SHAPE, (f"{fn}: the output has {output.numel()} elements, expected {input.numel() // world} "
                                f"(the input's {input.numel()} / {world} ranks)")
    elif output.numel() != input.numel() * world:
        return _ERR_SHAPE, (f"{fn}: the output has {output.numel()} elements, expected {input.numel() * world} "
                            f"({world} ranks x the input's {input.numel()})")
    return 0, ""


_staging = threading.local()


def _staging_buffer(slot: str, numel: int, like: torch.Tensor) -> torch.Tensor:
    """A buffer of `numel` elements for staging padded shards, kept per thread (the group's
    worker), slot, dtype and device, and reused by the next call that fits: a fresh 64 MB
    buffer each call cost 6x the copy itself in page faults (measured on the 2-core VM: 323 ms
    against 52 ms). It grows to the largest staged size and lives as long as the worker."""
    cache = getattr(_staging, "buffers", None)
    if cache is None:
        cache = _staging.buffers = {}
    key = (slot, like.dtype, like.device)
    buf = cache.get(key)
    if buf is None or buf.numel() < numel:
        cache.pop(key, None)  # (freed before the larger one is made)
        buf = cache[key] = torch.empty(numel, dtype=like.dtype, device=like.device)
    return buf[:numel]


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


def run_sharded(kind: str, output: torch.Tensor, input: torch.Tensor, group_name: str, world: int, rank: int,
                config: Config, op: str, seq: int, u: Optional[tuple] = None, device: Optional[str] = None,
                error: Tuple[int, str] = (0, "")) -> dict:
    """Runs one reduce-scatter or all-gather synchronously on the calling thread (the group
    worker); returns its statistics. `error`: this rank's `shard_error`, reported in the
    header exchange (so that the peers raise at once) and then raised here.

    A shard the plan cannot cut at (the mode's unit: a DynamiQ super-group, a bit-split
    unit; for the exact codecs a divisor in [64, 256] or the shard itself up to 4096
    elements) is staged: each shard zero-padded to the size `_C.padded_shard` names, and
    the result copied back (one extra pass over the input)."""
    cpp = config._to_cpp()
    code, msg = error
    if device is None:
        device = comm_device(input if not code else None, group_name)
    k = _KINDS[kind]
    staging = host_staged(device, group_name, config)
    if code:
        try:
            _C.sharded(k, None, group_name, cpp, op, seq, None, code, device, staging=staging)
        except DynamiqError:
            pass
        raise DynamiqError(msg)
    if kind == "reduce_scatter":
        m = output.numel()
        mp = _C.padded_shard(cpp, k, world, m)
        src = input.view(-1)
        if mp != m:
            src = _staging_buffer("input", world * mp, input)
            grid = src.view(world, mp)
            grid[:, :m].copy_(input.view(world, m))
            grid[:, m:].zero_()
        dst = output.view(-1)
        if mp != m or _overlaps(dst, src):
            dst = _staging_buffer("output", mp, output)
        stats = _C.sharded(k, (src, dst), group_name, cpp, op, seq, u, 0, device, input.numel(), staging=staging)
        if dst.data_ptr() != output.data_ptr():
            output.view(-1).copy_(dst[:m])
        return stats
    m = input.numel()
    mp = _C.padded_shard(cpp, k, world, m)
    buf = output.view(-1)
    if mp != m:
        buf = _staging_buffer("input", world * mp, output)
        slot = buf.view(world, mp)[rank]
        slot[m:].zero_()
        slot[:m].copy_(input.view(-1))
    else:
        slot = buf[rank * m:(rank + 1) * m]
        if slot.data_ptr() != input.data_ptr():  # (FSDP passes the output's own slot: nothing to copy)
            slot.copy_(input.view(-1))
    stats = _C.sharded(k, (buf, buf), group_name, cpp, "sum", seq, None, 0, device, output.numel(),
                       staging=staging)
    if mp != m:
        output.view(world, m).copy_(buf.view(world, mp)[:, :m])
    return stats


def _issue_sharded(kind: str, output, input, config, group, op: str, async_op: bool):
    fn = f"dynamiq.{kind}"
    for what, t in (("output", output), ("input", input)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: {what} must be a torch.Tensor, got {type(t).__name__}")
    if _not_a_member(group):
        return None  # as torch.distributed on a rank outside the group
    own, name = resolve_group(group)
    worker = worker_for(name)
    if not async_op and worker.on_worker():
        raise DynamiqError(f"{fn}: called with async_op=False from a callback of a dynamiq Future (it runs on "
                           "dynamiq's worker for this group, which would wait for itself); use async_op=True "
                           "there, or call from your own thread")
    world, rank = dist.get_world_size(own), dist.get_rank(own)
    seq = _next_direct_seq(name)
    error = shard_error(kind, output, input, world, name)
    ev = ready_event(input, name) if not error[0] else None
    device = comm_device(None if error[0] else input, name)

    def work():
        wait_ready(input, ev)
        if ev is not None:  # in use on our stream: a caller that drops them unwaited must not free them under us
            input.record_stream(torch.cuda.current_stream(input.device))
            output.record_stream(torch.cuda.current_stream(output.device))
        run_sharded(kind, output, input, name, world, rank, config, op, seq, device=device, error=error)
        return output

    fut = worker.submit(work, device=input.device if ev is not None else None)
    if async_op:
        return fut
    fut.wait()
    return None


def reduce_scatter(output: torch.Tensor, input: torch.Tensor, config: Optional[Config] = None,
                   group: Optional[dist.ProcessGroup] = None, op: str = "sum", async_op: bool = False):
    """Reduce-scatter with dynamiq: `input` holds n equal shards (n = the group's size),
    and `output` (input.numel() / n elements, same dtype and device) gets this rank's shard
    of the `sum` or `mean` over ranks, as `torch.distributed.reduce_scatter_tensor`.

    Every mode: exact for "none" and "lossless" (lossless bit-identical to none), an
    unbiased estimate for the lossy ones. Ring, butterfly (recursive halving) or two-step
    (`config.topology`): the all-reduce's reduce phase alone, so that a rank's shard is
    decoded from what it receives. `input` is not modified. Dtypes, devices and errors
    as `all_reduce`; a wrong output size, an input that does not split into n shards or
    output and input of different dtypes raise `DynamiqError` on every rank.

    Returns None, or with `async_op=True` a `torch.futures.Future` whose value is `output`.
    """
    config = _config_of(config, "reduce_scatter")
    check_sharded_config(config, "reduce_scatter", "dynamiq.reduce_scatter")
    return _issue_sharded("reduce_scatter", output, input, config, group,
                          _op_of(op, "reduce_scatter"), async_op)


def all_gather(output: torch.Tensor, input: torch.Tensor, config: Optional[Config] = None,
               group: Optional[dist.ProcessGroup] = None, async_op: bool = False):
    """All-gather with dynamiq: `output` (n x input.numel() elements) gets every rank's
    `input` in rank order, as `torch.distributed.all_gather_into_tensor`.

    Modes "lossless" (each shard compressed once by its owner and forwarded as it
    arrived: exact, fewer bytes) and "none"; the lossy modes raise `DynamiqError` (an
    all-gather carries parameters, which must arrive exact). `input` may be the output's
    own slot (in place, as FSDP passes it).

    Returns None, or with `async_op=True` a `torch.futures.Future` whose value is `output`.
    """
    config = _config_of(config, "all_gather")
    check_sharded_config(config, "all_gather", "dynamiq.all_gather")
    if config.mode not in exact_modes():
        raise DynamiqError(f"dynamiq.all_gather: mode {config.mode!r} is not exact; an all-gather runs in an exact "
                           f"mode ({_exact_list()}): parameters must arrive exact")
    return _issue_sharded("all_gather", output, input, config, group, "sum", async_op)


def simulate(tensors: Sequence[torch.Tensor], config: Optional[Config] = None, op: str = "sum",
             call_index: int = 0, return_stats: bool = False, timeout: float = 300.0,
             collective: str = "all_reduce", timeline: bool = False):
    """Runs the collective over an in-process transport, one tensor per simulated rank.

    Uses the very same C++ schedule, codec and wire format as a real run: the
    results and bytes equal those of the `call_index`-th direct dynamiq call
    (`all_reduce`, `reduce_scatter` or `all_gather`, as `collective` names it) on
    a fresh group of `len(tensors)` ranks with the same config. Inputs are not
    modified. Returns every rank's result (and, with `return_stats=True`, every
    rank's statistics): for "all_reduce" the reduced tensor; for "reduce_scatter"
    (each tensor a rank's input of n equal shards) the rank's shard, 1-D; for
    "all_gather" (each tensor a rank's shard) the gathered 1-D tensor.
    `timeline=True` (all-reduce only) adds each rank's per-operation timeline
    to its statistics (`stats[r]["timeline"]`; with return_stats=True).
    """
    if collective not in _KINDS:
        raise ValueError(f"dynamiq.simulate: collective must be one of {sorted(_KINDS)}, got {collective!r}")
    if op not in ("sum", "mean"):
        raise ValueError(f"dynamiq.simulate: op must be 'sum' or 'mean', got {op!r}")
    if len(tensors) < 1:
        raise ValueError("dynamiq.simulate: need at least one tensor")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"dynamiq.simulate: timeout must be a positive number of seconds, got {timeout!r}")
    timeout = min(float(timeout), 1e9)  # (inf: no limit; the C++ clock counts at most ~292 years)
    if timeline and collective != "all_reduce":
        raise ValueError("dynamiq.simulate: timeline=True is available for collective='all_reduce' only")
    config = config if config is not None else Config()
    t0 = tensors[0]
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"dynamiq.simulate: tensors[{i}] is not a tensor")
        if t.dtype not in SUPPORTED_DTYPES or t.layout != torch.strided:
            raise DynamiqError(check_tensor(t)[1])
        if t.shape != t0.shape or t.dtype != t0.dtype:
            raise ValueError("dynamiq.simulate: all tensors must have the same shape and dtype")
    work = [t.detach().to("cpu", copy=True).contiguous() for t in tensors]
    seq = DIRECT_SEQ_BASE + int(call_index)
    if collective == "all_reduce":
        stats = _C.simulate([w.view(-1) for w in work], config._to_cpp(), op, seq, float(timeout),
                            bool(timeline))
        return (work, stats) if return_stats else work
    if collective == "all_gather" and config.mode not in exact_modes():
        raise DynamiqError(f"dynamiq.simulate: an all-gather runs in an exact mode ({_exact_list()}), not "
                           f"{config.mode!r}")
    n = len(work)
    k = _KINDS[collective]
    cpp = config._to_cpp()
    if collective == "reduce_scatter":
        if t0.numel() % n:
            raise DynamiqError(f"dynamiq.simulate: an input of {t0.numel()} elements does not split into {n} shards")
        m = t0.numel() // n
        mp = _C.padded_shard(cpp, k, n, m)
        src = [w.view(-1) if mp == m else torch.nn.functional.pad(w.view(n, m), (0, mp - m)).reshape(-1)
               for w in work]
        dst = [w.new_zeros(mp) for w in work]
        stats = _C.simulate_sharded(k, src, dst, cpp, op, seq, float(timeout))
        out = [d[:m].clone() if mp != m else d for d in dst]
    else:
        m = t0.numel()
        mp = _C.padded_shard(cpp, k, n, m)
        bufs = []
        for r, w in enumerate(work):
            b = w.new_zeros((n, mp))
            b[r, :m] = w.view(-1)
            bufs.append(b.view(-1))
        stats = _C.simulate_sharded(k, bufs, bufs, cpp, op, seq, float(timeout))
        out = [b.view(n, mp)[:, :m].reshape(-1).clone() if mp != m else b for b in bufs]
    return (out, stats) if return_stats else out


def lossless_stats(tensor: torch.Tensor, block_bytes: int = 1 << 20) -> dict:
    """How well lossless mode codes `tensor` (float32, bfloat16 or float16, on the CPU).

    Codes one copy of the tensor block by block, as the collective does (blocks of about
    `block_bytes` raw bytes, the collective's default), and returns: `ratio` = bytes on the
    wire / raw bytes (headers and tables included), `exponent_bits` = achieved bits per coded
    exponent, `exponent_entropy` = order-0 entropy of the tensor's exponents (bits; the bound
    for one table per tensor), `block_exponent_entropy` = mean per-block entropy (the bound for
    per-block tables), and the number of blocks per exponent format. Nothing is sent.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"dynamiq.lossless_stats: expected a torch.Tensor, got {type(tensor).__name__}")
    code, msg = check_tensor(tensor)
    if code:
        raise DynamiqError(msg)
    return _C.lossless_stats(tensor.reshape(-1), int(block_bytes))
