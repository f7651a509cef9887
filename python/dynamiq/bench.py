"""Measure dynamiq against the backend's own collective on your process group.

    python -m dynamiq.bench --local 2                       # 2 Gloo processes on this machine
    torchrun --nproc_per_node 8 -m dynamiq.bench --sizes 16M,64M,256M --json bench.json --plot bench.png

For each collective (all-reduce, the only one this tool times; dynamiq.reduce_scatter
is timed by experiments/bench/bench_reduce_scatter.py), each size, and each row -- the
backend's own collective (Gloo or NCCL) first, then every dynamiq mode at every
topology -- the tool runs warm-up iterations, then
timed ones, and reports the median over the timed iterations of the slowest
rank's time, the algorithm and bus bandwidth (nccl-tests' convention:
busbw = algbw * 2(n-1)/n for all-reduce), the speedup over the backend's
collective, the bytes each rank put on the wire, and the error: vNMSE =
||result - exact||^2 / ||exact||^2 against the float64 sum of the inputs.

The inputs are gradient-like: layers of log-uniform length with per-layer
scales spread over four decades, heavy-tailed values (Student t, 3 degrees of
freedom) within a layer, a component shared by all ranks plus one of each
rank's own. Every value is an integer multiple of a power of two per layer,
small enough that any order of summation over the ranks is exact in the
bucket's dtype: the exact rows (the backend's own, none, lossless) must
report vNMSE 0, which every run checks.

One table row is printed as each measurement ends (nccl-tests style, on
rank 0); --json writes every row with its per-iteration times, --plot a PNG
of speedup against size.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch  # noqa: F401  (loads libtorch before the extension)

from . import _C, _load

PROG = "python -m dynamiq.bench"
DYNAMIQ_MODES = tuple(_C.available_modes())  # the codec registry's list
EXACT_MODES = tuple(m for m in DYNAMIQ_MODES if _C.mode_is_exact(m))
DEFAULT_MODES = "none,dynamiq:3,dynamiq:5,dynamiq:8,lossless,bitsplit:4"
DEFAULT_SIZES = "1M,16M,64M"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_DTYPE_SIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
# significand bits (with the implicit one) and smallest positive value of each bucket dtype
_DTYPE_BITS = {"float32": (24, 2.0 ** -149), "bfloat16": (8, 2.0 ** -133), "float16": (11, 2.0 ** -24)}
MAX_SIZE = 1 << 36


class UsageError(Exception):
    """Bad command-line input: reported as one line on stderr, exit code 2."""


# ---- command line ------------------------------------------------------------------------------
def parse_size(text: str) -> int:
    """'64K', '1M', '1MiB', '1MB', '4096' -> bytes (K, M, G are powers of 1024, as in nccl-tests)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([KMG]?)(?:I?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise UsageError(f"bad size {text!r}: expected a byte count like 4096, 256K, 16M or 1G")
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if value != int(value) or not 0 < value <= MAX_SIZE:
        raise UsageError(f"bad size {text!r}: expected a whole number of bytes in [1, 64G]")
    return int(value)


def parse_sizes(text: str, dtype: str) -> List[int]:
    esize = _DTYPE_SIZE[dtype]
    sizes = []
    for tok in text.split(","):
        if not tok.strip():
            raise UsageError(f"bad size list {text!r}: an empty entry")
        b = parse_size(tok)
        if b % esize:
            raise UsageError(f"bad size {tok.strip()!r}: {b} bytes is not a whole number of {dtype} elements "
                             f"({esize} bytes each)")
        if b not in sizes:
            sizes.append(b)
    return sorted(sizes)


# A row's "mode:VALUE" sets the mode's first declared parameter (bits for dynamiq and bitsplit,
# error_bound for bounded: csrc/kernels/<codec>/<codec>_scheme.cc); without VALUE, the mode's
# default, or for a parameter without one this benchmark's (gradient_like's scale for a bound).
_BENCH_DEFAULTS = {"error_bound": 1e-5}


def primary_param(mode: str) -> Optional[str]:
    """The parameter a "mode:VALUE" row sets: the mode's first declared one (None: no parameter)."""
    from .config import mode_params

    return next(iter(mode_params(mode)), None)


@dataclass(frozen=True)
class ModeSpec:
    mode: str
    bits: Optional[float] = None  # the value of primary_param(mode); None: its default

    @property
    def value(self) -> Optional[float]:
        """The primary parameter's value this row runs with (given, else the mode's or the bench's default)."""
        if self.bits is not None:
            return self.bits
        name = primary_param(self.mode)
        if name is None:
            return None
        from .config import param_default

        d = param_default(self.mode, name)
        return float(d) if d is not None else _BENCH_DEFAULTS.get(name)

    @property
    def label(self) -> str:
        v = self.value
        return self.mode if v is None else f"{self.mode}:{v:g}"


def parse_modes(text: str) -> List[ModeSpec]:
    out = []
    for tok in text.split(","):
        tok = tok.strip()
        mode, _, bits = tok.partition(":")
        if mode not in DYNAMIQ_MODES:
            forms = [m if primary_param(m) is None else f"{m}[:{primary_param(m).upper()}]" for m in DYNAMIQ_MODES]
            raise UsageError(f"unknown mode {tok!r}: expected one of {', '.join(forms)}")
        if bits and primary_param(mode) is None:
            raise UsageError(f"mode {tok!r}: {mode} takes no parameter")
        b = None
        if bits:
            try:
                b = float(bits)
            except ValueError:
                raise UsageError(f"mode {tok!r}: bit width {bits!r} is not a number") from None
        spec = ModeSpec(mode, b)
        if spec not in out:
            out.append(spec)
    return out


def parse_topologies(text: str) -> List[str]:
    from .config import topologies

    known = topologies()  # the C++ topology registry's list
    out = []
    for tok in text.split(","):
        tok = tok.strip()
        if tok not in known:
            raise UsageError(f"unknown topology {tok!r}: expected one of {', '.join(known)}")
        if tok not in out:
            out.append(tok)
    return out


def parse_config_overrides(items: Sequence[str]) -> dict:
    """['block_bytes=262144', 'rounding=nearest'] -> {'block_bytes': 262144, 'rounding': 'nearest'}."""
    import dataclasses

    from .config import Config

    fields = {f.name for f in dataclasses.fields(Config)} - {"mode", "topology", "bits"}
    out = {}
    for item in items:
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or key not in fields:
            raise UsageError(f"bad --config {item!r}: expected FIELD=VALUE with FIELD one of {', '.join(sorted(fields))}")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        out[key] = tuple(value) if isinstance(value, list) else value
    return out


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line on stderr, exit code 2 (argparse prints its usage too)
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter,
                epilog="Modes: none, dynamiq[:BITS] (budget in bits per coordinate, 2 < BITS <= 16), lossless, "
                       "bitsplit[:BITS] (integer code width 2..8), bounded[:E] (absolute error bound, default 1e-5). "
                       "The backend's own collective always runs first "
                       "at each size (the speedup baseline).")
    p.add_argument("--local", type=int, metavar="N",
                   help="spawn N processes on this machine joined by a Gloo group on loopback (default when not "
                        "launched by torchrun: 2)")
    p.add_argument("--collectives", default="allreduce", help="comma-separated (default allreduce; known: "
                   + ", ".join(COLLECTIVES) + ")")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help=f"bytes per rank, comma-separated, K/M/G = 2^10/2^20/2^30 "
                   f"(default {DEFAULT_SIZES})")
    p.add_argument("--modes", default=DEFAULT_MODES, help=f"dynamiq rows, comma-separated (default {DEFAULT_MODES})")
    p.add_argument("--topologies", default="ring,butterfly", help="comma-separated, of dynamiq.available_topologies() "
                   "(hierarchical: with --config local_size=K or under torchrun; default ring,butterfly)")
    p.add_argument("--dtype", default="float32", choices=sorted(_DTYPE_SIZE), help="bucket dtype (default float32)")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations per row (default 2)")
    p.add_argument("--iters", type=int, default=5, help="timed iterations per row; the median is reported (default 5)")
    p.add_argument("--config", action="append", default=[], metavar="FIELD=VALUE",
                   help="a dynamiq.Config field for every dynamiq row, e.g. block_bytes=262144 (repeatable)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data (and of dynamiq's rounding)")
    p.add_argument("--cpu-threads", type=int, default=None,
                   help="threads per dynamiq CPU codec call (dynamiq.set_cpu_threads; default: as configured)")
    p.add_argument("--backend", default=None, help="under torchrun: the process group's backend if the tool makes "
                   "it (default nccl when CUDA is available, else gloo)")
    p.add_argument("--timeout", type=float, default=300.0, help="process group timeout in seconds (default 300)")
    p.add_argument("--json", default=None, metavar="PATH", help="write every row (per-iteration times too) as JSON")
    p.add_argument("--plot", default=None, metavar="PATH", help="write a PNG of speedup against size (matplotlib)")
    p.add_argument("--quiet", action="store_true", help="print only the final table")
    return p


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    colls = []
    for c in args.collectives.split(","):
        c = c.strip()
        if c not in COLLECTIVES:
            raise UsageError(f"unknown collective {c!r}: expected one of {', '.join(COLLECTIVES)}")
        if c not in colls:
            colls.append(c)
    args.collective_list = colls
    args.size_list = parse_sizes(args.sizes, args.dtype)
    args.mode_list = parse_modes(args.modes)
    args.topology_list = parse_topologies(args.topologies)
    args.overrides = parse_config_overrides(args.config)
    if args.warmup < 0 or args.iters < 1:
        raise UsageError("--warmup must be >= 0 and --iters >= 1")
    if args.local is not None and not 2 <= args.local <= 256:
        raise UsageError(f"--local {args.local}: expected 2..256 processes")
    if args.cpu_threads is not None and not 1 <= args.cpu_threads <= 256:
        raise UsageError(f"--cpu-threads {args.cpu_threads}: expected 1..256")
    if args.timeout <= 0:
        raise UsageError("--timeout must be positive")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--plot needs matplotlib (pip install matplotlib)") from None
    # every Config this run will make, so that a bad bit width fails here and not inside a collective,
    # and what the group would refuse at the first collective (config.run_problem: a topology that
    # does not run the collective, hierarchical without ranks per node)
    from .config import ConfigError, run_problem, topologies

    world = args.local or int(os.environ.get("WORLD_SIZE", "0") or 0) or 2
    for c in args.collective_list:
        for spec in args.mode_list:
            for topo in args.topology_list:
                try:
                    problem = run_problem(make_config(spec, topo, args), world, COLLECTIVES[c].api)
                except ConfigError as e:
                    raise UsageError(f"mode {spec.label!r}: {e}") from None
                if problem:
                    ok = [t for t in topologies(COLLECTIVES[c].api)
                          if not run_problem(make_config(spec, t, args), world, COLLECTIVES[c].api)]
                    hint = " (--config local_size=K)" if "local_size" in problem else ""
                    raise UsageError(f"{spec.label} {c} on topology {topo!r} cannot run on {world} ranks: "
                                     f"{problem.replace('dynamiq: ', '')}{hint}; the topologies it runs on here: "
                                     f"{', '.join(ok) or 'none'}")
    return args


def make_config(spec: ModeSpec, topology: str, args: argparse.Namespace):
    from .config import Config

    kw = dict(args.overrides)
    kw.setdefault("seed", args.seed)
    kw.update(mode=spec.mode, topology=topology)
    name = primary_param(spec.mode)
    if name is not None and spec.value is not None:
        kw[name] = spec.value
    return Config(**kw)


# ---- gradient-like data -----------------------------------------------------------------------
def gradient_like(numel: int, rank: int, world: int, dtype: str, seed: int):
    """This rank's input: see the module docstring. Deterministic in (numel, rank, world, dtype, seed).

    Layer lengths, layer scales and the shared component come from `seed` alone (the
    same on every rank), the rest from (seed, rank)."""
    import torch

    shared = torch.Generator().manual_seed(seed * 1_000_003 + 17)
    own = torch.Generator().manual_seed(seed * 1_000_003 + 1009 * (rank + 1))

    def student_t(n: int, g) -> torch.Tensor:  # 3 degrees of freedom: z / sqrt(chi2_3 / 3)
        z = torch.randn(4, n, generator=g, dtype=torch.float64)
        return z[0] / (z[1:].square().sum(0) / 3).sqrt()

    x = 0.3 * student_t(numel, shared) + student_t(numel, own)
    # layers: lengths log-uniform in [2^10, 2^20] elements; scales 10^U(-6, -2) (float16: 10^U(-3, 1))
    mant_bits, tiny = _DTYPE_BITS[dtype]
    k_max = 2 ** (mant_bits - 1 - max(1, math.ceil(math.log2(world)))) - 1  # n * k_max < 2^(mant_bits - 1)
    clip = 50.0  # |t| above 50 (p ~ 1e-5 per value) is clipped to the largest grid value
    start = 0
    while start < numel:
        length = int(2 ** (10 + 10 * torch.rand((), generator=shared).item()))
        # (float16: three decades higher, so that the grid stays above its smallest value)
        scale = 10 ** ((-3 if dtype == "float16" else -6) + 4 * torch.rand((), generator=shared).item())
        end = min(numel, start + length)
        # grid step: a power of two, so every sum of n grid values is exact in the dtype
        step = max(2.0 ** math.floor(math.log2(scale * clip / k_max)), tiny)
        seg = x[start:end]
        seg.copy_(torch.clamp(torch.round(seg * scale / step), -k_max, k_max) * step)
        start = end
    return x.to(getattr(torch, dtype))


# ---- collectives --------------------------------------------------------------------------------
class Collective:
    """One collective the tool measures. To add one (reduce-scatter), subclass and register it in
    COLLECTIVES: the input and output tensors, the backend's own call, dynamiq's call (returning
    its statistics), the exact float64 result, and the bus bandwidth factor."""

    name = "?"

    def busbw_factor(self, world: int) -> float:
        raise NotImplementedError

    def raw_wire_bytes(self, size: int, world: int) -> float:
        """Bytes one rank sends in the bandwidth-optimal uncompressed algorithm (ring)."""
        raise NotImplementedError

    def buffers(self, x0, world: int) -> Tuple[object, object]:
        """(input, output) tensors for an input x0; they may be the same tensor (in place)."""
        raise NotImplementedError

    def prepare(self, x0, inp, out) -> None:
        """Untimed: restore the input before each iteration."""
        inp.copy_(x0)

    def run_backend(self, inp, out, group) -> None:
        raise NotImplementedError

    def run_dynamiq(self, inp, out, cfg, group) -> dict:
        raise NotImplementedError

    def exact(self, x0, group):
        """The exact result on this rank, float64."""
        raise NotImplementedError


class AllReduce(Collective):
    name, api = "allreduce", "all_reduce"  # (api: the collective's name in config.topology_supports)

    def busbw_factor(self, world: int) -> float:
        return 2.0 * (world - 1) / world

    def raw_wire_bytes(self, size, world):
        return 2.0 * (world - 1) / world * size

    def buffers(self, x0, world):
        x = x0.clone()
        return x, x

    def run_backend(self, inp, out, group):
        import torch.distributed as dist

        dist.all_reduce(inp, group=group)

    def run_dynamiq(self, inp, out, cfg, group):
        # The collective the DDP hook runs, called here on this thread (dynamiq.all_reduce
        # runs the same on dynamiq's worker thread and returns no statistics).
        from .api import _next_direct_seq, resolve_group, run_collective

        _, name = resolve_group(group)
        return run_collective(inp, name, cfg, "sum", _next_direct_seq(name))

    def exact(self, x0, group):
        import torch.distributed as dist

        ref = x0.double()
        dist.all_reduce(ref, group=group)  # sums of grid values: exact in float64 in any order
        return ref


COLLECTIVES: Dict[str, Collective] = {"allreduce": AllReduce()}


# ---- one row ------------------------------------------------------------------------------------
@dataclass
class Row:
    collective: str
    size: int  # bytes per rank
    count: int  # elements per rank
    dtype: str
    mode: str  # the backend's name ("gloo", "nccl") or a dynamiq mode
    bits: Optional[float]
    topology: Optional[str]
    world: int
    times: List[float] = field(default_factory=list)
    time: Optional[float] = None  # median, seconds
    algbw: Optional[float] = None  # bytes / s
    busbw: Optional[float] = None
    speedup: Optional[float] = None
    wire_bytes: Optional[float] = None  # bytes one rank sent per call (data + metadata, max over ranks)
    wire_ratio: Optional[float] = None  # wire_bytes / the bytes of the uncompressed ring (Collective.raw_wire_bytes)
    param: Optional[str] = None  # what `bits` holds: the mode's primary parameter (bits, error_bound)
    bits_per_coord: Optional[float] = None  # dynamiq's statistic (for lossless an upper bound, not the wire's)
    path: Optional[str] = None
    vnmse: Optional[float] = None  # mean over the timed iterations, max over ranks
    ranks_identical: Optional[bool] = None
    error: Optional[str] = None

    @property
    def label(self) -> str:
        return self.mode if self.bits is None else f"{self.mode}:{self.bits:g}"


def _row_dict(r: "Row") -> dict:
    """A row for --json: its primary parameter under its own name (a bounded row records
    "error_bound", not "bits")."""
    d = asdict(r)
    if r.param is not None and r.param != "bits":
        d[r.param] = d.pop("bits")
    return d


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reduce(values: List[float], op, device) -> List[float]:
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return t.tolist()


def _sq_dist(out, ref, chunk: int = 1 << 20) -> float:
    """|out - ref|^2 in float64, a chunk at a time (no full-size float64 temporaries)."""
    o, r = out.reshape(-1), ref.reshape(-1)
    total = 0.0
    for i in range(0, o.numel(), chunk):
        total += float((o[i:i + chunk].double() - r[i:i + chunk]).square().sum().item())
    return total


def _checksum(t) -> float:
    """A position-weighted sum of the result's bits: equal on ranks that hold identical results."""
    import torch

    bits = t.view(torch.int32 if t.element_size() == 4 else torch.int16).to(torch.int64)
    w = torch.arange(1, bits.numel() + 1, dtype=torch.int64, device=bits.device) % 65521
    return float(int((bits * w).sum().item()) % (1 << 50))


def measure(coll: Collective, row: Row, x0, ref, run: Callable, args, device) -> Row:
    import torch.distributed as dist

    inp, out = coll.buffers(x0, row.world)
    ref_norm = float(ref.square().sum().item())
    stats = None
    for _ in range(args.warmup):
        coll.prepare(x0, inp, out)
        run(inp, out)
    _sync(device)
    times, errs = [], []
    wire, bpc = 0.0, 0.0
    for i in range(args.iters):
        coll.prepare(x0, inp, out)
        _sync(device)
        dist.barrier()
        t0 = time.perf_counter()
        stats = run(inp, out)
        _sync(device)
        dt = time.perf_counter() - t0
        err = _sq_dist(out, ref)
        errs.append(err / ref_norm if ref_norm > 0 else (0.0 if err == 0 else math.inf))
        times.append(dt)
        if stats:
            wire = max(wire, float(stats["bytes_sent"] + stats["meta_bytes_sent"]))
            bpc = max(bpc, float(stats.get("bits_per_coord", 0.0)))
    n = len(times)
    agg = _reduce(times + [wire, bpc, statistics.fmean(errs), _checksum(out)], dist.ReduceOp.MAX, device)
    lo = _reduce([_checksum(out)], dist.ReduceOp.MIN, device)
    row.times = agg[:n]
    row.time = statistics.median(row.times)
    row.algbw = row.size / row.time
    row.busbw = row.algbw * coll.busbw_factor(row.world)
    if stats:
        row.wire_bytes = agg[n]
        row.wire_ratio = row.wire_bytes / coll.raw_wire_bytes(row.size, row.world)
        row.bits_per_coord = agg[n + 1] or None
        row.path = stats.get("path")
    row.vnmse = agg[n + 2]
    row.ranks_identical = agg[n + 3] == lo[0]
    return row


# ---- table, JSON, plot ---------------------------------------------------------------------------
_COLUMNS = [  # header, unit, width
    ("collective", "", 10), ("size", "(B)", 11), ("count", "(elements)", 11), ("type", "", 8),
    ("mode", "", 11), ("topology", "", 9), ("time", "(us)", 11), ("algbw", "(GB/s)", 8), ("busbw", "(GB/s)", 8),
    ("speedup", "", 8), ("wire/rank", "(B)", 11), ("wire/raw", "", 8), ("vNMSE", "", 9),
]


def table_header(args, world: int, backend: str, device) -> str:
    import torch

    from . import __version__

    lines = [
        f"# {PROG}: {world} ranks, backend {backend}, device {device.type}, dtype {args.dtype}, "
        f"dynamiq {__version__}, torch {torch.__version__}",
        f"# warm-up {args.warmup}, timed {args.iters} iterations per row; time = median over iterations of the "
        "slowest rank; algbw = size / time",
        "# busbw = algbw * 2(n-1)/n (all-reduce); speedup = the backend's time / this row's time at the same size",
        "# wire/rank = bytes one rank sent per call (data + metadata, max over ranks; not measured for the backend)",
        "# wire/raw = wire/rank / the bytes an uncompressed ring sends, 2(n-1)/n * size",
        "# vNMSE = |result - exact|^2 / |exact|^2 against the float64 sum, on gradient-like data "
        f"(seed {args.seed}); 0 for exact rows",
        "#",
        "# " + " ".join(h.rjust(w) for h, _, w in _COLUMNS),
        "# " + " ".join(u.rjust(w) for _, u, w in _COLUMNS),
    ]
    return "\n".join(lines)


def format_row(r: Row) -> str:
    def f(v, fmt, none="-"):
        return none if v is None else format(v, fmt)

    if r.error:
        cells = [r.collective, str(r.size), str(r.count), r.dtype, r.label, r.topology or "-"]
        return "  " + " ".join(c.rjust(w) for c, (_, _, w) in zip(cells, _COLUMNS)) + "  failed: " + r.error
    cells = [r.collective, str(r.size), str(r.count), r.dtype, r.label, r.topology or "-",
             f(r.time * 1e6, ".1f"), f(r.algbw / 1e9, ".3f"), f(r.busbw / 1e9, ".3f"),
             f(r.speedup, ".2f") + ("x" if r.speedup is not None else ""),
             f(r.wire_bytes, ".0f"), f(r.wire_ratio, ".3f"),
             "0" if r.vnmse == 0 else f(r.vnmse, ".2e")]
    line = "  " + " ".join(c.rjust(w) for c, (_, _, w) in zip(cells, _COLUMNS))
    if r.ranks_identical is False:
        line += "  RANKS DIFFER"
    return line


def fmt_size(b: int) -> str:
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= div and b % div == 0:
            return f"{b // div}{unit}"
    return str(b)


def write_plot(path: str, rows: List[Row], title: str) -> None:
    """Speedup over the backend against size: a colour per mode, a line style per topology."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colls = sorted({r.collective for r in rows})
    fig, axes = plt.subplots(1, len(colls), figsize=(8 * len(colls), 5), squeeze=False)
    labels = list(dict.fromkeys(r.label for r in rows if r.topology is not None))
    colors = {lab: plt.get_cmap("tab10")(i % 10) for i, lab in enumerate(labels)}
    topos = list(dict.fromkeys(r.topology for r in rows if r.topology is not None))
    styles = {t: ("-", "--", ":", "-.")[i % 4] for i, t in enumerate(topos)}
    sizes = sorted({r.size for r in rows})
    for ax, coll in zip(axes[0], colls):
        series: Dict[Tuple[str, str], List[Tuple[int, float]]] = {}
        for r in rows:
            if r.collective == coll and r.topology is not None and r.speedup is not None:
                series.setdefault((r.label, r.topology), []).append((r.size, r.speedup))
        for (lab, topo), pts in series.items():
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=colors[lab],
                    linestyle=styles[topo], label=f"{lab} {topo}")
        ax.axhline(1.0, color="black", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [fmt_size(b) for b in sizes])
        ax.minorticks_off()
        ax.set_xlabel("size per rank (bytes)")
        ax.set_ylabel("speedup over the backend's own collective")
        ax.set_title(f"{coll}: {title}", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def machine_info(device) -> dict:
    import torch

    from . import __version__, cpu_isa, cpu_threads

    info = {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "dynamiq": __version__, "cpus": os.cpu_count(), "cpu_isa": cpu_isa(), "dynamiq_cpu_threads": cpu_threads(),
            "torch_threads": torch.get_num_threads()}
    try:
        with open("/proc/cpuinfo") as f:
            model = [ln for ln in f if ln.startswith("model name")]
        if model:
            info["cpu"] = model[0].split(":", 1)[1].strip()
    except OSError:
        pass
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


# ---- the run on every rank ---------------------------------------------------------------------
def run_rank(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Every rank calls this with the same arguments once the process group exists. Returns the exit code."""
    import torch
    import torch.distributed as dist

    from . import set_cpu_threads

    rank, world = dist.get_rank(), dist.get_world_size()
    backend = str(dist.get_backend())
    device = torch.device("cpu")
    if "nccl" in backend:
        device = torch.device("cuda", torch.cuda.current_device())
    if args.cpu_threads is not None:
        set_cpu_threads(args.cpu_threads)
    say = rank == 0 and not args.quiet
    # the machine's load around the run, on rank 0 over the tree of every local rank (their parent:
    # this tool's process with --local, torchrun's agent under torchrun): printed and in --json
    monitor = _load.LoadMonitor(root=os.getppid() if args.local or "TORCHELASTIC_RUN_ID" in os.environ
                                else None) if rank == 0 else None
    header = table_header(args, world, backend, device)
    if say:
        print(header, flush=True)
    rows: List[Row] = []
    group_broken = False
    total = len(args.collective_list) * len(args.size_list) * (1 + len(args.mode_list) * len(args.topology_list))
    for cname in args.collective_list:
        coll = COLLECTIVES[cname]
        for size in args.size_list:
            count = size // _DTYPE_SIZE[args.dtype]
            x0 = gradient_like(count, rank, world, args.dtype, args.seed).to(device)
            ref = coll.exact(x0, None)
            cases = [(backend.split(":")[-1].split(",")[0], None, None)] + \
                [(s, s, t) for s in args.mode_list for t in args.topology_list]
            base_time = None
            for label, spec, topo in cases:
                row = Row(cname, size, count, args.dtype, spec.mode if spec else label,
                          spec.bits if spec else None, topo, world)
                if spec is not None and spec.value is not None:
                    row.bits = float(spec.value)  # the primary parameter's value (row.param names it)
                    row.param = primary_param(spec.mode)
                if group_broken:
                    row.error = "not run: an earlier row broke the process group"
                else:
                    try:
                        if spec is None:
                            def run(inp, out):
                                coll.run_backend(inp, out, None)
                        else:
                            cfg = make_config(spec, topo, args)

                            def run(inp, out, cfg=cfg):
                                return coll.run_dynamiq(inp, out, cfg, None)
                        measure(coll, row, x0, ref, run, args, device)
                        if spec is None:
                            base_time = row.time
                        if base_time:
                            row.speedup = base_time / row.time
                    except Exception as e:  # noqa: BLE001 - a failed row is reported, not fatal
                        row.error = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                        if "Timeout" in row.error or "Connection" in row.error or "TransportError" in row.error:
                            group_broken = True
                rows.append(row)
                if say:
                    print(format_row(row), flush=True)
    failed = [r for r in rows if r.error]
    inexact = [r for r in rows if not r.error and (r.mode in EXACT_MODES or r.topology is None) and r.vnmse != 0]
    if rank == 0:
        if args.quiet:
            print(header)
            print("\n".join(format_row(r) for r in rows))
        load = monitor.finish()
        print(_load.format_record(load), flush=True)
        if inexact:
            print(f"# WARNING: {len(inexact)} exact row(s) with vNMSE != 0: " +
                  ", ".join(f"{r.label} {r.topology or ''} {r.size} B" for r in inexact), flush=True)
        payload = {"tool": PROG, "argv": list(argv), "world": world, "backend": backend, "device": str(device),
                   "dtype": args.dtype, "warmup": args.warmup, "iters": args.iters, "seed": args.seed,
                   "config_overrides": {k: list(v) if isinstance(v, tuple) else v for k, v in args.overrides.items()},
                   "machine": machine_info(device), "load": load, "time_unit": "s", "bandwidth_unit": "bytes/s",
                   "rows": [_row_dict(r) for r in rows]}
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump(payload, f, indent=1)
            print(f"# wrote {args.json}", flush=True)
        if args.plot:
            write_plot(args.plot, rows, f"{world} ranks, {backend}, {args.dtype}")
            print(f"# wrote {args.plot}", flush=True)
        if failed:
            print(f"# {len(failed)} of {total} rows failed", file=sys.stderr, flush=True)
    return 1 if failed or inexact else 0


def _local_rank(rank: int, world: int, args: argparse.Namespace, argv: List[str], store: str, q) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    code = 1
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=args.timeout))
        code = run_rank(args, argv)
        dist.destroy_process_group()
    finally:
        q.put((rank, code))


def run_local(args: argparse.Namespace, argv: List[str]) -> int:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="dynamiq-bench-") as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_local_rank, args=(r, args.local, args, argv, store, q), daemon=True)
                 for r in range(args.local)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        codes = {}
        while not q.empty():
            r, c = q.get()
            codes[r] = c
    bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0]
    if bad:
        print(f"{PROG}: error: rank process(es) exited abnormally: " +
              ", ".join(f"rank {r} exit code {c}" for r, c in bad), file=sys.stderr)
        return 1
    return codes.get(0, 1)


def run_torchrun(args: argparse.Namespace, argv: List[str]) -> int:
    import torch
    import torch.distributed as dist

    made = False
    if not dist.is_initialized():
        backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if "nccl" in backend:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
        made = True
    try:
        return run_rank(args, argv)
    finally:
        if made:
            dist.destroy_process_group()


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_args(argv)
        under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
        if under_torchrun and args.local is not None:
            raise UsageError("--local starts its own processes: do not combine it with torchrun")
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    if under_torchrun:
        return run_torchrun(args, argv)
    if args.local is None:
        args.local = 2
        print(f"# not launched by torchrun: running --local {args.local}", file=sys.stderr, flush=True)
    return run_local(args, argv)


if __name__ == "__main__":
    sys.exit(main())
