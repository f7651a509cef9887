"""`dynamiq.Config`: what to compress and how, validated on construction."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Optional

TOPOLOGIES = ("ring", "butterfly", "twostep", "hierarchical")
AUTO = "auto"
_ALLOWED_WIDTHS = (1, 2, 4, 8, 16)
_DYNAMIQ_ROUNDING = ("correlated", "independent")
_BITSPLIT_ROUNDING = ("stochastic", "nearest")


def _modes() -> list:
    """The modes of this build, by id: the C++ codec registry's list (csrc/kernels/registry.h)."""
    from . import _C

    return list(_C.available_modes())


def _sg_bits(width: int, S: int, s: int, hierarchical: bool) -> float:
    """Wire bits per coordinate of a dynamiq super-group: the C++ wire format's size
    (csrc/kernels/dynamiq/dynamiq_format.h), asked from `_C`."""
    from . import _C

    return 8.0 * _C.dynamiq_sg_bytes(width, S, s, hierarchical) / S


class ConfigError(ValueError):
    """A `Config` field has a value outside its allowed range."""


def _err(field_name: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"dynamiq.Config: {field_name}={value!r} is invalid; allowed: {allowed}")


@dataclass(frozen=True)
class Config:
    """Configuration of dynamiq's compressed all-reduce.

    Every rank must use an equal Config; ranks that disagree are detected at
    the next collective and all raise the same `DynamiqError`.

    Fields:
      mode: "dynamiq" (lossy: variable 2/4/8-bit widths under a bit budget),
        "lossless" (exponent coding, bit-identical to "none"), "bitsplit"
        (INT2-INT8 group quantization), "bounded" (error-bounded: every
        compression's per-coordinate error <= error_bound; needs
        error_bound or error_bound_rel), "none" (uncompressed, through the
        same driver), or "auto": per bucket one of `auto_lossy`, "lossless"
        and "none", whichever a cost model (measured link bandwidth and
        latency, this machine's codec speed, the bucket's size) predicts
        fastest, the same on every rank (docs/modes.md "auto"; stats
        "auto_choice").
      topology: "ring", "butterfly" (any world size; on one that is not a
        power of two the extra ranks send to and receive from the chunk
        owners, slower than ring there: docs/modes.md "Choosing a topology"), or
        "twostep", or "hierarchical": ranks grouped by node (`local_size`
        consecutive ranks per node), a reduce-scatter inside each node in
        `intra_mode`, an all-reduce in `mode` between nodes over each local
        rank's shard (a ring per local rank), an all-gather inside each
        node; all-reduce only (not reduce-scatter / all-gather).
      local_size: ranks per node for topology "hierarchical"; None takes
        torchrun's LOCAL_WORLD_SIZE at each call. Must be equal on every rank
        and divide the world size (else every rank raises DynamiqError).
      intra_mode: mode of the intra-node phases of "hierarchical": "none"
        (default) or "lossless".
      auto_lossy: the lossy candidate of mode "auto": "dynamiq" (default) or
        "bitsplit", at `bits`.
      auto_bandwidth: mode "auto": link bandwidth in bytes/s per rank to
        assume instead of measuring it (None: measured from the group's
        collectives); auto_latency likewise, in seconds per message round.
      bits: dynamiq: budget in bits per coordinate including group and
        super-group scales: more than 2, at most 16, and at least the
        narrowest allowed width's cost with its scales (2.5625 for the
        default widths and sizes); bitsplit: integer code width 2..8 (the
        wire carries more: group scales and zeros, and at 2-3 bits the
        reserved spikes, so 3 bits, and 2 on float32 buckets, cost more
        than 4: docs/modes.md "Choosing bits")
      seed: seeds all randomness (stochastic and correlated rounding). Same
        seed and same collective sequence give the same bytes on the wire.
      widths: dynamiq widths allowed for a super-group, a subset of
        {1, 2, 4, 8, 16} (16 = raw bf16).
      allocator: dynamiq width allocation: "fast" (appendix A rule, offset
        carried across steps) or "exact" (section 3.2 threshold search).
      rounding: dynamiq: "correlated" (default) or "independent"; bitsplit:
        "stochastic" (default) or "nearest".
      group_size: elements per scale group (dynamiq 16; bitsplit 128 for
        5-8 bits, 32 for 2-4 bits). None picks the mode default.
      supergroup_size: dynamiq super-group size S (multiple of group_size).
        The CUDA kernels hold a super-group in a block's shared memory:
        5 S + 8 S / group_size + 16 bytes must fit in 48 KiB, and S <= 8192
        (a CUDA collective with more raises on every rank before sending).
      spike_reserve: bitsplit: keep each group's min and max exactly. None:
        on for 2 and 3 bits.
      log_scales: bitsplit: integer log2 scales (theta = 10).
      eps: dynamiq: the spacing parameter of the non-uniform levels
        f(eps, r) for widths (1, 2, 4, 8): four numbers in [0, 4] (0: evenly
        spaced levels; widths 1 and 2 have no interior levels and ignore
        it), -1 keeps a width's default (None: all defaults, 0.30 at 4 bits
        and 0.06 at 8). An eps whose levels collapse in float32 is refused.
      uniform_levels: dynamiq ablation: evenly spaced levels.
      hierarchical_scales: dynamiq: uint8 group scales under a bf16
        super-group scale (True, the format); False sends bf16 group scales
        (ablation).
      error_bound: bounded: the absolute error bound e of one compression
        (> 0, at most 2**126; rounded down to float32). A sum over n ranks
        is within n x e of the exact sum on every topology (docs/modes.md).
      error_bound_rel: bounded: a bound relative to the bucket's value
        range, in (0, 1]: e = error_bound_rel x the mean over ranks of each
        rank's max - min, resolved per collective and equal on all ranks.
        Give exactly one of error_bound and error_bound_rel.
      block_bytes: wire bytes per pipelined block (sub-chunk). 0 (default)
        picks per path: 1 MiB on the compressed paths, where the kernel of
        block k overlaps the transfer of block k+1, and 4 MiB on the exact
        paths (mode none, fallbacks, metadata), where there is only a sum to
        overlap and Gloo's per-message cost dominates on fast links
        (experiments/RESULTS.md has the sweep).
      min_compress_numel: buckets with fewer elements take the exact path
        (so does a dynamiq bucket whose last, partial super-group would put
        even the narrowest plan over the budget: stats path "exact-budget").
      window_bytes: receive buffers posted ahead per collective, and the most
        bytes of sent messages' buffers kept before waiting on the oldest
        send (rank-local; memory, not wire format).
      max_collective_bytes: a bucket of more bytes runs as several
        collectives of at most this many bytes (slices of one length, a
        multiple of 4096 elements, the last one possibly shorter), one after the
        other, each with its own statistics, plan and randomness: bounds
        dynamiq's working memory, which grows with the bucket (DDP's first
        step all-reduces the whole model as one bucket). 0: never split.
      host_staging: CUDA tensors go device -> page-locked host -> the
        group's CPU backend (Gloo) -> host -> device instead of through NCCL
        (rank-local, not part of the wire format; every rank of a group must
        choose alike). Automatic when the group has no CUDA backend. Lets
        several processes share one GPU (NCCL refuses two ranks on one
        device), and serves machines without NCCL between them.
    """

    VERSION = 1

    mode: str = "dynamiq"
    topology: str = "ring"
    bits: float = 5.0
    seed: int = 0
    widths: tuple = (2, 4, 8)
    allocator: str = "fast"
    rounding: Optional[str] = None
    group_size: Optional[int] = None
    supergroup_size: int = 256
    spike_reserve: Optional[bool] = None
    log_scales: bool = False
    eps: Optional[tuple] = None
    uniform_levels: bool = False
    hierarchical_scales: bool = True
    error_bound: Optional[float] = None
    error_bound_rel: Optional[float] = None
    block_bytes: int = 0
    min_compress_numel: int = 4096
    window_bytes: int = 16 * 1024 * 1024
    max_collective_bytes: int = 256 * 1024 * 1024
    host_staging: bool = False
    local_size: Optional[int] = None
    intra_mode: str = "none"
    auto_lossy: str = "dynamiq"
    auto_bandwidth: Optional[float] = None
    auto_latency: Optional[float] = None

    def __post_init__(self) -> None:
        modes = _modes()
        if self.mode not in modes + [AUTO]:
            raise _err("mode", self.mode, ", ".join(modes + [AUTO]))
        if self.topology not in TOPOLOGIES:
            raise _err("topology", self.topology, ", ".join(TOPOLOGIES))
        if self.local_size is not None and (not isinstance(self.local_size, int) or isinstance(self.local_size, bool)
                                            or not 1 <= self.local_size <= 1 << 16):
            raise _err("local_size", self.local_size, "None (torchrun's LOCAL_WORLD_SIZE) or an integer in [1, 65536]")
        if self.intra_mode not in ("none", "lossless"):
            raise _err("intra_mode", self.intra_mode, "'none', 'lossless' (the intra-node phases are exact)")
        # bounded is lossy too, but its error bound is no budget auto could trade against time
        lossy = [m for m in modes if m in ("dynamiq", "bitsplit")]
        if self.auto_lossy not in lossy:
            raise _err("auto_lossy", self.auto_lossy, ", ".join(lossy))
        for name in ("auto_bandwidth", "auto_latency"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0
                                  or math.isnan(float(v))):
                raise _err(name, v, "None (measured) or a number >= 0 (inf allowed)")
        for name in ("log_scales", "uniform_levels", "hierarchical_scales", "host_staging"):
            if not isinstance(getattr(self, name), bool):
                raise _err(name, getattr(self, name), "True, False")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed < 2**64:
            raise _err("seed", self.seed, "an integer in [0, 2**64)")
        def is_int(v):
            return isinstance(v, int) and not isinstance(v, bool)

        # a finite number in every mode (NaN would not survive the JSON round trip)
        try:
            finite = not isinstance(self.bits, bool) and isinstance(self.bits, (int, float)) and \
                math.isfinite(float(self.bits))
        except OverflowError:  # an int too large for a float
            finite = False
        if not finite:
            raise _err("bits", self.bits, "a finite number")
        widths = tuple(self.widths)
        object.__setattr__(self, "widths", widths)
        if not widths or any(not is_int(w) or w not in _ALLOWED_WIDTHS for w in widths) or \
                len(set(widths)) != len(widths):
            raise _err("widths", self.widths, "a non-empty subset of {1, 2, 4, 8, 16} without repeats")
        if self.group_size is not None and (not is_int(self.group_size) or not 1 <= self.group_size <= 4096):
            raise _err("group_size", self.group_size, "None or an integer in [1, 4096]")
        if not is_int(self.supergroup_size) or not 16 <= self.supergroup_size <= 65536:
            raise _err("supergroup_size", self.supergroup_size, "an integer in [16, 65536]")
        if self.allocator not in ("fast", "exact"):
            raise _err("allocator", self.allocator, "'fast', 'exact'")
        cmode = self.codec_mode
        if cmode == "dynamiq":
            if not 2.0 < float(self.bits) <= 16.0:
                raise _err("bits", self.bits, "2 < bits <= 16 for mode='dynamiq' (budget incl. metadata)")
            if self.rounding not in (None,) + _DYNAMIQ_ROUNDING:
                raise _err("rounding", self.rounding, "'correlated', 'independent' for mode='dynamiq'")
            s_grp = self.group_size if self.group_size is not None else 16
            if self.supergroup_size % s_grp == 0:
                floor = min(_sg_bits(w, self.supergroup_size, s_grp, self.hierarchical_scales) for w in widths)
                if float(self.bits) < floor:
                    raise _err("bits", self.bits, f">= {floor:.4f} for widths {widths} (the smallest width's "
                               "cost per coordinate including its scales)")
        if cmode == "bitsplit":
            if float(self.bits) != int(self.bits) or not 2 <= int(self.bits) <= 8:
                raise _err("bits", self.bits, "an integer width 2..8 for mode='bitsplit'")
            if self.rounding not in (None,) + _BITSPLIT_ROUNDING:
                raise _err("rounding", self.rounding, "'stochastic', 'nearest' for mode='bitsplit'")
        for name in ("error_bound", "error_bound_rel"):
            v = getattr(self, name)
            if v is None:
                continue
            if self.mode != "bounded":
                raise _err(name, v, "None unless mode='bounded'")
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise _err(name, v, "a number")
        if self.mode == "bounded":
            a, r = self.error_bound, self.error_bound_rel
            if (a is None) == (r is None):
                raise ConfigError("dynamiq.Config: mode='bounded' needs exactly one of error_bound (absolute) "
                                  "and error_bound_rel (relative to the value range)")
            if a is not None and not (0.0 < float(a) <= 2.0 ** 126):
                raise _err("error_bound", a, "a number in (0, 2**126]")
            if r is not None and not (0.0 < float(r) <= 1.0):
                raise _err("error_bound_rel", r, "a number in (0, 1]")
            if self.rounding is not None:
                raise _err("rounding", self.rounding, "None for mode='bounded' (round to the nearest bin)")
        if self.mode in ("none", "lossless") and self.rounding is not None:
            raise _err("rounding", self.rounding, f"None for mode={self.mode!r} (it is exact)")
        gs = self.group_size if self.group_size is not None else 16
        if cmode == "dynamiq" and self.supergroup_size % gs != 0:
            raise _err("supergroup_size", self.supergroup_size, f"a multiple of group_size ({gs})")
        if self.spike_reserve not in (None, True, False):
            raise _err("spike_reserve", self.spike_reserve, "None, True, False")
        if self.eps is not None:
            try:
                eps = tuple(float(e) for e in self.eps)
            except (TypeError, ValueError, OverflowError):
                eps = ()
            if len(eps) != 4 or any(not (0 <= e <= 4 or e == -1) for e in eps):
                raise _err("eps", self.eps, "four numbers in [0, 4] (for widths 1, 2, 4, 8), -1 for the default")
            object.__setattr__(self, "eps", eps)
        if not (is_int(self.block_bytes) and (self.block_bytes == 0 or 1024 <= self.block_bytes <= 1 << 30)):
            raise _err("block_bytes", self.block_bytes, "0 (per-path default) or an integer in [1024, 1073741824]")
        for name, lo, hi in (("min_compress_numel", 0, 1 << 40), ("window_bytes", 1024, 1 << 34)):
            v = getattr(self, name)
            if not (is_int(v) and lo <= v <= hi):
                raise _err(name, v, f"an integer in [{lo}, {hi}]")
        v = self.max_collective_bytes
        if not (is_int(v) and (v == 0 or (1 << 16) <= v <= (1 << 44))):
            raise _err("max_collective_bytes", v, "0 (never split) or an integer in [65536, 2**44]")
        # The rest of the rules live in the C++ codecs and allocator (group sizes a
        # codec supports, eps ranges, widths that grow on the wire): build the mode's
        # scheme once, so that a Config that passes here never fails inside a collective.
        from . import _C

        if hasattr(_C, "validate_config"):
            try:
                _C.validate_config(self._to_cpp())
            except _C.DynamiqError as e:
                raise ConfigError(f"dynamiq.Config: {e}") from None

    # -- derived --------------------------------------------------------------
    @property
    def codec_mode(self) -> str:
        """The mode whose rules `bits`, `rounding`, ... follow: `auto_lossy` for mode "auto"."""
        return self.auto_lossy if self.mode == AUTO else self.mode

    @property
    def effective_rounding(self) -> Optional[str]:
        if self.rounding is not None:
            return self.rounding
        return {"dynamiq": "correlated", "bitsplit": "stochastic"}.get(self.codec_mode)

    def resolved_local_size(self) -> int:
        """Ranks per node for topology "hierarchical": local_size, else torchrun's
        LOCAL_WORLD_SIZE, else 0 (every rank then raises at the collective)."""
        if self.local_size is not None:
            return self.local_size
        try:
            return max(0, int(os.environ.get("LOCAL_WORLD_SIZE", "0")))
        except ValueError:
            return 0

    def replace(self, **changes: Any) -> "Config":
        return dataclasses.replace(self, **changes)

    # -- serialisation ----------------------------------------------------------
    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["widths"] = list(self.widths)
        if self.eps is not None:
            d["eps"] = list(self.eps)
        d["version"] = self.VERSION
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        d = dict(d)
        version = d.pop("version", cls.VERSION)
        if version != cls.VERSION:
            raise ConfigError(f"dynamiq.Config: version {version} is not supported (this is version {cls.VERSION})")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"dynamiq.Config: unknown fields {sorted(unknown)}")
        if "widths" in d:
            d["widths"] = tuple(d["widths"])
        if d.get("eps") is not None:
            d["eps"] = tuple(d["eps"])
        return cls(**d)

    @classmethod
    def from_json(cls, s: str) -> "Config":
        return cls.from_dict(json.loads(s))

    # -- to the C++ core ------------------------------------------------------------
    def _to_cpp(self):
        from . import _C

        c = _C.CollectiveConfig()
        c.mode = _C.MODE_AUTO if self.mode == AUTO else _C.mode_id(self.mode)
        c.topology = TOPOLOGIES.index(self.topology)
        if self.topology == "hierarchical":
            c.local_size = self.resolved_local_size()
            c.intra_mode = _C.mode_id(self.intra_mode)
        if self.mode == AUTO:
            c.auto_lossy = _C.mode_id(self.auto_lossy)
            c.auto_bandwidth = 0.0 if self.auto_bandwidth is None else float(self.auto_bandwidth)
            c.auto_latency = -1.0 if self.auto_latency is None else float(self.auto_latency)
        c.seed = self.seed
        c.bits = float(self.bits)
        c.widths_mask = sum(1 << w for w in self.widths)
        c.exact_allocator = self.allocator == "exact"
        c.correlated = self.effective_rounding != "independent"
        c.stochastic = self.effective_rounding != "nearest"
        c.group_size = self.group_size or 0
        c.supergroup_size = self.supergroup_size
        c.spike_reserve = -1 if self.spike_reserve is None else int(self.spike_reserve)
        c.log_scales = self.log_scales
        if self.eps is not None:
            c.eps = list(self.eps)
        c.uniform_levels = self.uniform_levels
        c.hierarchical_scales = self.hierarchical_scales
        c.error_bound = float(self.error_bound) if self.error_bound is not None else 0.0
        c.error_bound_rel = float(self.error_bound_rel) if self.error_bound_rel is not None else 0.0
        c.block_bytes = self.block_bytes
        c.min_compress_numel = self.min_compress_numel
        c.window_bytes = self.window_bytes
        c.max_collective_bytes = self.max_collective_bytes
        return c
