"""`dynamiq.Config`: what to compress and how, validated on construction.

The codec parameters (bits, rounding, error_bound, ...) are not written here: each codec declares
its own in its folder (csrc/kernels/<codec>/<codec>_scheme.cc; kernels/params.h), the registry
lists them with the mode, and `_C.mode_info()` hands them over. `Config` has one field per
parameter name; which fields a mode takes, their defaults, checks, error messages and docstring
lines all come from those declarations. This file owns the driver's fields (topology, seed,
block sizes, ...) and the Python-side conveniences.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Optional

from . import _C

AUTO = "auto"

# ---- what the C++ registry knows ------------------------------------------------------------------
_MODE_INFO = list(_C.mode_info())  # by id: {name, id, exact, params: [{name, type, default, doc, allowed, ...}]}
_BY_MODE = {m["name"]: m for m in _MODE_INFO}
# parameter name -> {mode: declaration}, in registry order (bits first)
_PARAMS: dict = {}
for _m in _MODE_INFO:
    for _d in _m["params"]:
        _PARAMS.setdefault(_d["name"], {})[_m["name"]] = _d


def _modes() -> list:
    """The modes of this build, by id: the C++ codec registry's list (csrc/kernels/registry.h)."""
    return [m["name"] for m in _MODE_INFO]


def mode_params(mode: str) -> dict:
    """A registered mode's parameters, {name: declaration}, as its codec declares them
    (csrc/kernels/params.h): type, default (None: unset), allowed values in words, doc."""
    if mode not in _BY_MODE:
        raise ValueError(f"unknown mode {mode!r} (registered: {', '.join(_modes())})")
    return {d["name"]: d for d in _BY_MODE[mode]["params"]}


def param_default(mode: str, name: str) -> Any:
    """The default of a mode's parameter (`param_default("bitsplit", "bits")` = 4), None when unset."""
    params = mode_params(mode)
    if name not in params:
        raise ValueError(f"{name} is not a parameter of mode {mode!r} (its parameters: "
                         f"{', '.join(params) or 'none'})")
    return params[name]["default"]


def is_exact(mode: str) -> bool:
    """True for a mode whose result is bit-identical to the uncompressed sum (the registry's
    Scheme::exact: none, lossless)."""
    if mode not in _BY_MODE:
        raise ValueError(f"unknown mode {mode!r} (registered: {', '.join(_modes())})")
    return bool(_BY_MODE[mode]["exact"])


def builtin_modes() -> tuple:
    """The modes of csrc/kernels/registry.cc's own list, by id: every registered mode but the
    test-only codecs a development build adds (tests/cpp/*_codec, CMake DYNAMIQ_TEST_CODECS)."""
    return tuple(m["name"] for m in _MODE_INFO if m["builtin"])


def exact_modes() -> tuple:
    """The exact modes of this build, by id (those an all-gather and hierarchical's intra-node
    phases run in)."""
    return tuple(m["name"] for m in _MODE_INFO if m["exact"])


def auto_candidates() -> tuple:
    """The lossy modes mode "auto" can pick: those with a `bits` budget to trade against time
    (bounded's error bound is no such budget)."""
    return tuple(m["name"] for m in _MODE_INFO if not m["exact"] and "bits" in mode_params(m["name"]))


def topologies(collective: Optional[str] = None, compositions: bool = True) -> list:
    """The topologies of this build, by id: the C++ topology registry's list
    (csrc/hook/collective/topology.h). `collective` ("all_reduce", "reduce_scatter",
    "all_gather"): only those that run it; `compositions=False`: the schedules alone
    (not "hierarchical", which composes collectives over sub-groups)."""
    return [t["name"] for t in _C.available_topologies()
            if (collective is None or collective.replace("_", "-") in t["collectives"])
            and (compositions or not t["composition"])]


def topology_supports(topology: str, collective: str) -> bool:
    """Whether a topology runs a collective ("all_reduce", "reduce_scatter", "all_gather"),
    as the topology registry says (hierarchical: all-reduces only)."""
    return topology in topologies(collective)


def run_problem(config: "Config", world: int, collective: str = "all_reduce") -> str:
    """"" or why every rank of a group of `world` ranks would refuse `config` at its first
    `collective` (what a tool can check before it starts any): a topology that does not run the
    collective (topology_supports), mode "auto" outside an all-reduce, and what the C++ driver
    refuses for the group (`_C.config_problem`: hierarchical without ranks per node, a local_size
    that does not divide the world)."""
    if not topology_supports(config.topology, collective):
        return f"topology {config.topology!r} runs all-reduces only"
    if config.mode == AUTO and collective != "all_reduce":
        return "mode 'auto' runs all-reduces only"
    return _C.config_problem(config._to_cpp(), int(world))


class ConfigError(ValueError):
    """A `Config` field has a value outside its allowed range."""


def _err(field_name: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"dynamiq.Config: {field_name}={value!r} is invalid; allowed: {allowed}")


_DRIVER_DOC = """Configuration of dynamiq's collectives (all-reduce, reduce-scatter, all-gather).

    Every rank must use an equal Config; ranks that disagree are detected at
    the next collective and all raise the same `DynamiqError`. A codec
    parameter belongs to its mode: one the mode does not take (error_bound with
    mode "dynamiq", bits with mode "none") is refused, naming the mode's
    parameters; one left None takes the mode's default.

    Fields:
      mode: {modes}, or "auto": per bucket one of `auto_lossy`, "lossless"
        and "none", whichever a cost model (measured link bandwidth and
        latency, this machine's codec speed, the bucket's size) predicts
        fastest, the same on every rank (docs/modes.md "auto"; stats
        "auto_choice"). The codec parameters of mode "auto" are auto_lossy's.
      topology: one of `dynamiq.available_topologies()` (the C++ topology
        registry): "ring", "butterfly" (any world size; on one that is not a
        power of two the extra ranks send to and receive from the chunk
        owners, slower than ring there: docs/modes.md "Choosing a topology"), or
        "twostep", or "hierarchical": ranks grouped by node (`local_size`
        consecutive ranks per node), a reduce-scatter inside each node in
        `intra_mode`, an all-reduce in `mode` between nodes over each local
        rank's shard (a ring per local rank), an all-gather inside each
        node; all-reduce only (not reduce-scatter / all-gather).
{codec}
      seed: seeds all randomness (stochastic and correlated rounding). Same
        seed and same collective sequence give the same bytes on the wire.
      local_size: ranks per node for topology "hierarchical"; None takes
        torchrun's LOCAL_WORLD_SIZE at each call. Must be equal on every rank
        and divide the world size (else every rank raises DynamiqError).
      intra_mode: mode of the intra-node phases of "hierarchical", an exact
        mode: "none" (default) or "lossless".
      auto_lossy: the lossy candidate of mode "auto" ({auto}), at its `bits`.
      auto_bandwidth: mode "auto": link bandwidth in bytes/s per rank to
        assume instead of measuring it (None: measured from the group's
        collectives); auto_latency likewise, in seconds per message round.
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


def _wrap(text: str, indent: str, width: int = 92) -> str:
    lines, line = [], ""
    for word in text.split():
        if line and len(indent) + len(line) + 1 + len(word) > width:
            lines.append(indent + line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    if line:
        lines.append(indent + line)
    return "\n".join(lines)


def _codec_doc() -> str:
    """The codec parameters' lines of the docstring, from the declarations."""
    out = []
    for name, by_mode in _PARAMS.items():
        parts = []
        for mode, d in by_mode.items():
            default = "None" if d["default"] is None else repr(d["default"])
            parts.append(f"{mode}: {d['doc']} (default {default}; allowed: {d['allowed']})")
        out.append(_wrap(f"{name}: " + "; ".join(parts), "      "))
    return "\n".join(out)


def _normalize(decl: dict, v: Any) -> Any:
    # lists become tuples (Config is frozen and hashable); anything else is checked by _C as given
    if decl["type"] in ("numbers", "integers") and isinstance(v, list):
        return tuple(v)
    return v


class _ConfigBase:
    VERSION = 2

    def __post_init__(self) -> None:
        modes = _modes()
        if self.mode not in modes + [AUTO]:
            raise _err("mode", self.mode, ", ".join(modes + [AUTO]))
        known = topologies()
        if self.topology not in known:
            raise _err("topology", self.topology, ", ".join(known))
        if self.local_size is not None and (not isinstance(self.local_size, int) or isinstance(self.local_size, bool)
                                            or not 1 <= self.local_size <= 1 << 16):
            raise _err("local_size", self.local_size, "None (torchrun's LOCAL_WORLD_SIZE) or an integer in [1, 65536]")
        exact = exact_modes()
        if self.intra_mode not in exact:
            raise _err("intra_mode", self.intra_mode,
                       ", ".join(repr(m) for m in exact) + " (the intra-node phases are exact)")
        candidates = auto_candidates()
        if self.auto_lossy not in candidates:
            raise _err("auto_lossy", self.auto_lossy, ", ".join(candidates))
        for name in ("auto_bandwidth", "auto_latency"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0
                                  or math.isnan(float(v))):
                raise _err(name, v, "None (measured) or a number >= 0 (inf allowed)")
        if not isinstance(self.host_staging, bool):
            raise _err("host_staging", self.host_staging, "True, False")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed < 2**64:
            raise _err("seed", self.seed, "an integer in [0, 2**64)")

        def is_int(v):
            return isinstance(v, int) and not isinstance(v, bool)

        if not (is_int(self.block_bytes) and (self.block_bytes == 0 or 1024 <= self.block_bytes <= 1 << 30)):
            raise _err("block_bytes", self.block_bytes, "0 (per-path default) or an integer in [1024, 1073741824]")
        for name, lo, hi in (("min_compress_numel", 0, 1 << 40), ("window_bytes", 1024, 1 << 34)):
            v = getattr(self, name)
            if not (is_int(v) and lo <= v <= hi):
                raise _err(name, v, f"an integer in [{lo}, {hi}]")
        v = self.max_collective_bytes
        if not (is_int(v) and (v == 0 or (1 << 16) <= v <= (1 << 44))):
            raise _err("max_collective_bytes", v, "0 (never split) or an integer in [65536, 2**44]")

        # The codec's parameters: those given must be the codec mode's; the rest take its defaults.
        own = mode_params(self.codec_mode)
        given = []
        for name in _PARAMS:
            v = getattr(self, name)
            if v is None:
                continue
            if name not in own:
                raise ConfigError(f"dynamiq.Config: {name}={v!r} is not a parameter of mode {self.codec_mode!r} "
                                  f"(its parameters: {', '.join(own) or 'none'})")
            object.__setattr__(self, name, _normalize(own[name], v))
            given.append(name)
        object.__setattr__(self, "_given", frozenset(given))
        for name, d in own.items():
            if getattr(self, name) is None and d["default"] is not None:
                object.__setattr__(self, name, d["default"])
        # Each value against its declaration (C++: the message names the values allowed), then the
        # rules between parameters (group sizes a codec supports, eps ranges, widths that grow on
        # the wire, the budget floor): build the mode's scheme once, so that a Config that passes
        # here never fails inside a collective.
        try:
            _C.validate_config(self._to_cpp())
        except _C.DynamiqError as e:
            raise ConfigError(f"dynamiq.Config: {e}") from None

    # -- derived --------------------------------------------------------------
    @property
    def codec_mode(self) -> str:
        """The mode whose parameters `bits`, `rounding`, ... are: `auto_lossy` for mode "auto"."""
        return self.auto_lossy if self.mode == AUTO else self.mode

    @property
    def effective_rounding(self) -> Optional[str]:
        """The rounding the codec runs with (its default when not given); None for a mode without one."""
        return self.rounding

    def params(self) -> dict:
        """The codec mode's parameters with their values (defaults filled in; unset ones None)."""
        return {name: getattr(self, name) for name in mode_params(self.codec_mode)}

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
        """A copy with `changes`. Codec parameters that were given and that the new codec mode
        does not take are dropped (`cfg.replace(mode="none")` works for any cfg); defaults are
        taken anew from the new mode."""
        new_mode = changes.get("mode", self.mode)
        new_codec = changes.get("auto_lossy", self.auto_lossy) if new_mode == AUTO else new_mode
        keep = set(mode_params(new_codec)) if new_codec in _BY_MODE else set()
        kw = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
              if f.init and (f.name not in _PARAMS or (f.name in self._given and f.name in keep))}
        kw.update(changes)
        return Config(**kw)

    # -- serialisation ----------------------------------------------------------
    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        d["version"] = self.VERSION
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        d = dict(d)
        version = d.pop("version", cls.VERSION)
        if version not in (1, cls.VERSION):
            raise ConfigError(f"dynamiq.Config: version {version} is not supported (this is version {cls.VERSION})")
        known = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"dynamiq.Config: unknown fields {sorted(unknown)}")
        mode = d.get("mode", "dynamiq")
        codec = d.get("auto_lossy", "dynamiq") if mode == AUTO else mode
        own = mode_params(codec) if codec in _BY_MODE else {}
        for name in _PARAMS:
            if name not in d:
                continue
            if version == 1 and name not in own:
                # version 1 carried every field for every mode; those of other modes had no effect
                d.pop(name)
            elif isinstance(d[name], list):
                d[name] = tuple(d[name])
        return cls(**d)

    @classmethod
    def from_json(cls, s: str) -> "Config":
        return cls.from_dict(json.loads(s))

    # -- to the C++ core ------------------------------------------------------------
    def _to_cpp(self):
        c = _C.CollectiveConfig()
        c.mode = _C.MODE_AUTO if self.mode == AUTO else _C.mode_id(self.mode)
        c.topology = self.topology  # (the binding looks the name up in the topology registry)
        if self.topology == "hierarchical":
            c.local_size = self.resolved_local_size()
            c.intra_mode = _C.mode_id(self.intra_mode)
        if self.mode == AUTO:
            c.auto_lossy = _C.mode_id(self.auto_lossy)
            c.auto_bandwidth = 0.0 if self.auto_bandwidth is None else float(self.auto_bandwidth)
            c.auto_latency = -1.0 if self.auto_latency is None else float(self.auto_latency)
        c.seed = self.seed
        for name in mode_params(self.codec_mode):
            v = getattr(self, name)
            if v is not None:
                c.set_param(name, v)
        c.block_bytes = self.block_bytes
        c.min_compress_numel = self.min_compress_numel
        c.window_bytes = self.window_bytes
        c.max_collective_bytes = self.max_collective_bytes
        return c


def params_markdown() -> str:
    """docs/api.md's table of the codec parameters, made from the codecs' declarations
    (tests/python/test_params.py checks the page against it; DYNAMIQ_UPDATE_DOCS=1 rewrites it)."""
    rows = ["| field | mode | default | allowed | meaning |", "|---|---|---|---|---|"]
    for name, by_mode in _PARAMS.items():
        for mode, d in by_mode.items():
            if not _BY_MODE[mode]["builtin"]:
                continue  # a test-only codec (tests/cpp/*_codec, in development builds only)
            default = "`None`" if d["default"] is None else f"`{d['default']!r}`"
            fp = "" if d["fingerprint"] else " Rank-local (not in the fingerprint)."
            rows.append(f"| `{name}` | {mode} | {default} | {d['allowed']} | {d['doc']}.{fp} |")
    return "\n".join(rows)


def _make_config_class():
    F = dataclasses.field
    fields = [("mode", str, F(default="dynamiq")), ("topology", str, F(default="ring"))]
    fields += [(name, Any, F(default=None)) for name in _PARAMS]
    fields += [
        ("seed", int, F(default=0)),
        ("block_bytes", int, F(default=0)),
        ("min_compress_numel", int, F(default=4096)),
        ("window_bytes", int, F(default=16 * 1024 * 1024)),
        ("max_collective_bytes", int, F(default=256 * 1024 * 1024)),
        ("host_staging", bool, F(default=False)),
        ("local_size", Optional[int], F(default=None)),
        ("intra_mode", str, F(default="none")),
        ("auto_lossy", str, F(default="dynamiq")),
        ("auto_bandwidth", Optional[float], F(default=None)),
        ("auto_latency", Optional[float], F(default=None)),
        # the codec parameters given (not defaulted): what replace() keeps
        ("_given", frozenset, F(default=frozenset(), init=False, repr=False, compare=False)),
    ]
    cls = dataclasses.make_dataclass("Config", fields, bases=(_ConfigBase,), frozen=True)
    cls.__module__ = __name__
    cls.__qualname__ = "Config"
    cls.__doc__ = _DRIVER_DOC.format(modes=", ".join(f'"{m}"' for m in _modes()), codec=_codec_doc(),
                                     auto=", ".join(f'"{m}"' for m in auto_candidates()))
    return cls


Config = _make_config_class()
