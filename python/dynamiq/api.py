"""`dynamiq.all_reduce` and `dynamiq.simulate`."""

from __future__ import annotations

import threading
from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from . import _C
from ._groups import _group_devices, _not_a_member, resolve_group  # noqa: F401 (resolve_group: re-exported)
from ._worker import worker_for
from .config import Config

DynamiqError = _C.DynamiqError
TransportError = _C.TransportError
MalformedMessage = _C.MalformedMessage

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Input error codes shared with the C++ driver (csrc/hook/collective/collective.h InputError).
_ERR_DTYPE, _ERR_LAYOUT, _ERR_DEVICE = 1, 2, 3

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
    devs = _group_devices.get(group_name) if group_name is not None else None
    if t.device.type == "cuda":
        if not _C.built_with_cuda():
            return _ERR_DEVICE, (
                "dynamiq: CUDA tensors are not supported by this build (it was built without nvcc); "
                "reinstall with the CUDA toolkit on the PATH, or all-reduce CPU tensors over Gloo")
        if devs is not None and "cuda" not in devs:
            return _ERR_DEVICE, (
                "dynamiq: CUDA tensors need an NCCL process group (init_process_group('nccl') or "
                "backend='cpu:gloo,cuda:nccl'); this group cannot send them. Note: the CUDA path has "
                "not run on a GPU yet (see the README)")
    elif t.device.type == "cpu":
        if devs is not None and "cpu" not in devs:
            return _ERR_DEVICE, (
                "dynamiq: CPU tensors need a Gloo process group (or backend='cpu:gloo,cuda:nccl'); "
                "move the tensor to the GPU for an NCCL group")
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
    devs = _group_devices.get(group_name, frozenset(("cpu",)))
    if "cpu" not in devs and "cuda" in devs and torch.cuda.is_available():
        return f"cuda:{torch.cuda.current_device()}"  # an NCCL-only group: header on the GPU
    return "cpu"


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
                   u: Optional[tuple] = None, device: Optional[str] = None) -> dict:
    """Runs one collective synchronously on the calling thread (the group worker).

    Validates the tensor; a rank with bad input still takes part in the header
    exchange so that its peers raise at once instead of timing out. `device`:
    where the collective's buffers and header live (`comm_device`, evaluated on
    the thread that issued the collective: the current CUDA device is per
    thread); None evaluates it here.
    """
    code, msg = check_tensor(tensor, group_name)
    cpp = config._to_cpp()
    if device is None:
        device = comm_device(tensor if not code else None, group_name)
    if code:
        try:
            _C.all_reduce(None, group_name, cpp, op, seq, None, code, device)
        except DynamiqError:
            pass
        raise DynamiqError(msg)
    return _C.all_reduce(tensor.view(-1) if tensor.dim() != 1 else tensor, group_name, cpp, op, seq, u, 0,
                         device)


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
    group, or CUDA with an NCCL group in a CUDA build, a path that has not run
    on a GPU yet); on return every rank holds the same result, `sum` or `mean` of the
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


def simulate(tensors: Sequence[torch.Tensor], config: Optional[Config] = None, op: str = "sum",
             call_index: int = 0, return_stats: bool = False, timeout: float = 300.0):
    """Runs the collective over an in-process transport, one tensor per simulated rank.

    Uses the very same C++ schedule, codec and wire format as a real run: the
    results and bytes equal those of the `call_index`-th `dynamiq.all_reduce`
    call on a fresh group of `len(tensors)` ranks with the same config. Inputs
    are not modified. Returns every rank's result (and, with
    `return_stats=True`, every rank's statistics).
    """
    if op not in ("sum", "mean"):
        raise ValueError(f"dynamiq.simulate: op must be 'sum' or 'mean', got {op!r}")
    if len(tensors) < 1:
        raise ValueError("dynamiq.simulate: need at least one tensor")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"dynamiq.simulate: timeout must be a positive number of seconds, got {timeout!r}")
    timeout = min(float(timeout), 1e9)  # (inf: no limit; the C++ clock counts at most ~292 years)
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
    stats = _C.simulate([w.view(-1) for w in work], config._to_cpp(), op,
                        DIRECT_SEQ_BASE + int(call_index), float(timeout))
    return (work, stats) if return_stats else work


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
