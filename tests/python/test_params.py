"""Codec parameters come from the codecs' declarations (csrc/kernels/<codec>/<codec>_scheme.cc,
kernels/params.h), through `_C.mode_info()`: Config's fields, defaults, checks, messages and
docstring, docs/api.md's table and the bench's "mode:VALUE" syntax. Nothing in Python lists them.
"""
import dataclasses
import json
import os
import pathlib
import re

import pytest

import dynamiq
from dynamiq import _C
from dynamiq import bench, config

API_MD = pathlib.Path(__file__).resolve().parents[2] / "docs" / "api.md"
BEGIN = "<!-- params:begin (generated: DYNAMIQ_UPDATE_DOCS=1 pytest tests/python/test_params.py) -->"
END = "<!-- params:end -->"


def test_docs_table_is_the_declarations():
    text = API_MD.read_text()
    i, j = text.index(BEGIN) + len(BEGIN), text.index(END)
    want = "\n" + config.params_markdown() + "\n"
    if os.environ.get("DYNAMIQ_UPDATE_DOCS") == "1":
        API_MD.write_text(text[:i] + want + text[j:])
        text = API_MD.read_text()
        i, j = text.index(BEGIN) + len(BEGIN), text.index(END)
    assert text[i:j] == want, "docs/api.md's parameter table differs from the declarations: " \
                              "DYNAMIQ_UPDATE_DOCS=1 pytest tests/python/test_params.py"


def test_every_declared_parameter_is_a_config_field_with_its_default():
    fields = {f.name: f for f in dataclasses.fields(dynamiq.Config)}
    info = _C.mode_info()
    assert [m["name"] for m in info] == dynamiq.available_modes()
    for m in info:
        kw = {"error_bound": 1e-3} if m["name"] == "bounded" else {}
        cfg = dynamiq.Config(mode=m["name"], **kw)
        for d in m["params"]:
            assert d["name"] in fields and fields[d["name"]].default is None
            if d["name"] not in kw:
                assert getattr(cfg, d["name"]) == d["default"], (m["name"], d["name"])
            assert d["doc"] in dynamiq.Config.__doc__.replace("\n", " ").replace("  ", " ") or \
                d["doc"].split()[0] in dynamiq.Config.__doc__
        assert cfg.params() == {d["name"]: getattr(cfg, d["name"]) for d in m["params"]}
    # no field other than the driver's and the declared ones
    declared = {d["name"] for m in info for d in m["params"]}
    driver = {"mode", "topology", "seed", "block_bytes", "min_compress_numel", "window_bytes",
              "max_collective_bytes", "host_staging", "local_size", "intra_mode", "auto_lossy",
              "auto_bandwidth", "auto_latency"}
    assert {n for n, f in fields.items() if f.init} == declared | driver


def test_mode_defaults_come_from_the_codecs():
    assert config.param_default("dynamiq", "bits") == 5.0
    assert config.param_default("bitsplit", "bits") == 4
    assert dynamiq.Config(mode="bitsplit").bits == 4
    assert dynamiq.Config(mode="dynamiq").rounding == "correlated"
    assert dynamiq.Config(mode="bitsplit").rounding == "stochastic"
    assert dynamiq.Config(mode="none").bits is None
    assert config.mode_params("bitsplit")["rounding"]["choices"] == ["stochastic", "nearest"]
    assert tuple(m for m in config.exact_modes() if m in config.builtin_modes()) == ("none", "lossless")
    assert config.auto_candidates() == ("dynamiq", "bitsplit")
    with pytest.raises(ValueError, match="not a parameter of mode 'none'"):
        config.param_default("none", "bits")


@pytest.mark.parametrize("mode,kw", [
    ("dynamiq", {"error_bound": 1e-3}),
    ("dynamiq", {"spike_reserve": True}),
    ("none", {"bits": 5.0}),
    ("lossless", {"rounding": "nearest"}),
    ("bounded", {"error_bound": 1e-3, "bits": 4}),
    ("bitsplit", {"widths": (2, 4)}),
])
def test_a_misplaced_field_names_the_modes_parameters(mode, kw):
    own = ", ".join(config.mode_params(mode)) or "none"
    bad = next(k for k in kw if k not in config.mode_params(mode))
    with pytest.raises(dynamiq.ConfigError, match=re.escape(f"{bad}={kw[bad]!r} is not a parameter of mode "
                                                           f"{mode!r} (its parameters: {own})")):
        dynamiq.Config(mode=mode, **kw)


def test_auto_takes_its_candidates_parameters():
    cfg = dynamiq.Config(mode="auto", auto_lossy="bitsplit", rounding="nearest")
    assert cfg.bits == 4 and cfg.rounding == "nearest"
    with pytest.raises(dynamiq.ConfigError, match="is not a parameter of mode 'bitsplit'"):
        dynamiq.Config(mode="auto", auto_lossy="bitsplit", widths=(2, 4))


@pytest.mark.parametrize("mode,kw,allowed", [
    ("dynamiq", {"bits": 0.0}, "a number in (0, 16]"),
    ("dynamiq", {"bits": 16.5}, "a number in (0, 16]"),
    ("bitsplit", {"bits": 4.5}, "a whole number in [2, 8]"),
    ("dynamiq", {"rounding": "nearest"}, "'correlated', 'independent'"),
    ("dynamiq", {"widths": (3,)}, "a non-empty subset of {1, 2, 4, 8, 16} without repeats"),
    ("dynamiq", {"eps": (5, 5, 5, 5)}, "4 numbers, each in [0, 4] or -1"),
    ("dynamiq", {"uniform_levels": 1}, "True, False"),
    ("bounded", {"error_bound_rel": 2.0}, "a number in (0, 1]"),
])
def test_a_bad_value_names_what_is_allowed(mode, kw, allowed):
    (name, value), = kw.items()
    with pytest.raises(dynamiq.ConfigError, match=re.escape(f"{name}={value!r} is invalid; allowed: ")
                       + ".*" + re.escape(allowed)):
        dynamiq.Config(mode=mode, **kw)


def test_replace_and_json_follow_the_mode():
    cfg = dynamiq.Config(mode="dynamiq", bits=4.0, rounding="independent")
    none = cfg.replace(mode="none")  # the documented way to switch a hook's mode
    assert none.mode == "none" and none.bits is None and none.rounding is None
    back = none.replace(mode="dynamiq")
    assert back.bits == 5.0  # given parameters of another mode are not kept across a switch
    assert cfg.replace(seed=3).bits == 4.0 and cfg.replace(seed=3).rounding == "independent"
    assert dynamiq.Config.from_json(cfg.to_json()) == cfg
    assert dynamiq.Config(mode="dynamiq") == dynamiq.Config(mode="dynamiq", bits=5.0)
    # a version-1 dict (every field, every mode) still loads: the other modes' fields had no effect
    v1 = {f: None for f in ("error_bound", "error_bound_rel", "eps", "group_size", "spike_reserve", "rounding")}
    v1.update(mode="lossless", topology="ring", bits=5.0, seed=0, widths=[2, 4, 8], allocator="fast",
              supergroup_size=256, log_scales=False, uniform_levels=False, hierarchical_scales=True, block_bytes=0,
              min_compress_numel=4096, window_bytes=1 << 24, max_collective_bytes=1 << 28, host_staging=False,
              local_size=None, intra_mode="none", auto_lossy="dynamiq", auto_bandwidth=None, auto_latency=None,
              version=1)
    old = dynamiq.Config.from_dict(json.loads(json.dumps(v1)))
    assert old == dynamiq.Config(mode="lossless")
    assert old._to_cpp().fingerprint() == dynamiq.Config(mode="lossless")._to_cpp().fingerprint()


def test_bench_mode_syntax_sets_the_first_declared_parameter():
    specs = bench.parse_modes("dynamiq:3,bitsplit,bounded:0.001,bounded,lossless")
    assert [s.label for s in specs] == ["dynamiq:3", "bitsplit:4", "bounded:0.001", "bounded:1e-05", "lossless"]
    assert [bench.primary_param(s.mode) for s in specs] == ["bits", "bits", "error_bound", "error_bound", None]
    with pytest.raises(bench.UsageError, match="lossless takes no parameter"):
        bench.parse_modes("lossless:4")
