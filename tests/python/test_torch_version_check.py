"""dynamiq refuses to load its extension under another torch than the one it was built against,
with a message naming both versions (not an undefined-symbol error from the loader)."""

import os
import subprocess
import sys

import pytest
import torch

import dynamiq
from dynamiq import _torch_check


def test_build_recorded_the_torch_it_was_built_against():
    # CMake wrote the record at configure time from the same interpreter's torch
    assert _torch_check.built_torch_version() == torch.__version__


def test_mismatch_names_both_versions():
    with pytest.raises(ImportError) as e:
        _torch_check.check_torch_version(built="2.14.1+cu130", running="2.11.0+cu128")
    msg = str(e.value)
    assert "built against torch 2.14.1+cu130" in msg and "imported torch 2.11.0+cu128" in msg
    assert isinstance(e.value, dynamiq.TorchVersionMismatch)
    _torch_check.check_torch_version(built="2.14.1", running="2.14.1")  # equal: no error


def _import_with_torch_version(fake, env_extra=None):
    code = f"import torch; torch.__version__ = {fake!r}; import dynamiq; print('imported', dynamiq.available_modes())"
    env = {k: v for k, v in os.environ.items() if k != "DYNAMIQ_SKIP_TORCH_CHECK"}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def test_import_under_another_torch_fails_with_both_versions():
    # torch.__version__ patched before `import dynamiq`: the recorded build version no longer matches
    r = _import_with_torch_version("2.11.0")
    assert r.returncode != 0 and "imported" not in r.stdout
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("dynamiq._torch_check.TorchVersionMismatch: ")
    assert f"built against torch {torch.__version__}" in last and "imported torch 2.11.0" in last
    assert "undefined symbol" not in r.stderr


def test_skip_variable_lets_the_loader_decide():
    r = _import_with_torch_version("2.11.0", {"DYNAMIQ_SKIP_TORCH_CHECK": "1"})
    assert r.returncode == 0 and "imported" in r.stdout, r.stderr
