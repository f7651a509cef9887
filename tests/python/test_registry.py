"""The mode list, the mode ids and the dynamiq super-group size come from the C++ core (`_C`).

The codec registry (csrc/kernels/registry.h) is the one place a mode is listed; Python keeps no
copy. The ids are part of the wire fingerprint (tests/golden/wire.txt was recorded with them), so
they are pinned here; that `Config` reads the list from `_C` is shown by changing `_C`'s answer.
"""
import pytest

import dynamiq
from dynamiq import _C


def test_modes_and_their_wire_ids():
    assert dynamiq.config.builtin_modes() == ("none", "dynamiq", "lossless", "bitsplit", "bounded")
    # (a development build adds the test-only codecs after them: tests/cpp/*_codec)
    assert dynamiq.available_modes()[:5] == list(dynamiq.config.builtin_modes())
    for i, mode in enumerate(dynamiq.config.builtin_modes()):
        assert _C.mode_id(mode) == i
        assert _C.mode_name(i) == mode
        kw = {"error_bound": 1e-3} if mode == "bounded" else {}
        assert dynamiq.Config(mode=mode, **kw)._to_cpp().mode == i
    assert _C.mode_name(250) == "?"
    with pytest.raises(dynamiq.DynamiqError, match="unknown mode 'nope'"):
        _C.mode_id("nope")


def test_python_keeps_no_list_of_modes():
    # Config, the bench, the demo, FSDP and the API learn the modes, which are exact and their
    # parameters from _C (config.mode_params, exact_modes, ...): no tuple, list or set literal in
    # the package names two modes (docstrings and messages may name them).
    import ast
    import pathlib

    pkg = pathlib.Path(dynamiq.__file__).parent
    modes = set(dynamiq.available_modes()) | {"auto"}
    found = []
    for path in sorted(pkg.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                names = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in modes]
                if len(names) >= 2:
                    found.append(f"{path.name}:{node.lineno} {names}")
    assert not found, found


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
    with pytest.raises(dynamiq.ConfigError, match=r"bits=2\.5 is below the 2\.5625 bits per coordinate"):
        dynamiq.Config(mode="dynamiq", bits=2.5)
    dynamiq.Config(mode="dynamiq", bits=2.5625)
