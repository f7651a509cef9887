"""The mode list, the mode ids and the dynamiq super-group size come from the C++ core (`_C`).

The codec registry (csrc/kernels/registry.h) is the one place a mode is listed; Python keeps no
copy. The ids are part of the wire fingerprint (tests/golden/wire.txt was recorded with them), so
they are pinned here; that `Config` reads the list from `_C` is shown by changing `_C`'s answer.
"""
import pytest

import dynamiq
from dynamiq import _C


def test_modes_and_their_wire_ids():
    assert dynamiq.available_modes() == ["none", "dynamiq", "lossless", "bitsplit", "bounded"]
    for i, mode in enumerate(dynamiq.available_modes()):
        assert _C.mode_id(mode) == i
        assert _C.mode_name(i) == mode
        kw = {"error_bound": 1e-3} if mode == "bounded" else {}
        assert dynamiq.Config(mode=mode, **kw)._to_cpp().mode == i
    assert _C.mode_name(250) == "?"
    with pytest.raises(dynamiq.DynamiqError, match="unknown mode 'nope'"):
        _C.mode_id("nope")


def test_config_takes_the_mode_list_from_C(monkeypatch):
    monkeypatch.setattr(_C, "available_modes", lambda: ["none", "dynamiq", "lossless"])
    assert dynamiq.available_modes() == ["none", "dynamiq", "lossless"]
    with pytest.raises(dynamiq.ConfigError, match="mode='bitsplit' is invalid; allowed: none, dynamiq, lossless, auto$"):
        dynamiq.Config(mode="bitsplit")
    dynamiq.Config(mode="lossless")


def test_supergroup_wire_size_comes_from_C():
    # The format (dynamiq_format.h): codes S*w/8 bytes, plus a bf16 super-group scale and one
    # uint8 scale per group (hierarchical) or a bf16 scale per group (flat); width 16 is raw bf16.
    assert _C.dynamiq_sg_bytes(2, 256, 16, True) == 2 + 16 + 64
    assert _C.dynamiq_sg_bytes(2, 256, 16, False) == 2 * 16 + 64
    assert _C.dynamiq_sg_bytes(1, 256, 16, True) == 2 + 16 + 32
    assert _C.dynamiq_sg_bytes(16, 256, 16, True) == 512
    with pytest.raises(dynamiq.DynamiqError):
        _C.dynamiq_sg_bytes(3, 256, 16, True)
    # Config's floor on bits is that size: 82 bytes per 256 coordinates at the narrowest default width
    with pytest.raises(dynamiq.ConfigError, match=r">= 2\.5625 for widths \(2, 4, 8\)"):
        dynamiq.Config(mode="dynamiq", bits=2.5)
    dynamiq.Config(mode="dynamiq", bits=2.5625)
