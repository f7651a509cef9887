"""The CPU kernels pick AVX-512 or AVX2 at run time; the choice must never change a result.

Runs the same DynamiQ all-reduce (simulated ranks, the real C++ schedule and codec) in three
fresh interpreters, by CPU, forced to AVX2 (DYNAMIQ_CPU_ISA=avx2) and asking for AVX-512
(DYNAMIQ_CPU_ISA=avx512), and compares every rank's result bit for bit. The build has no
AVX-512 kernels at present (DynamiQ's were withdrawn until an AVX-512 machine runs them), so
every run uses AVX2, on AVX-512 CPUs too, and the test checks determinism across processes.
"""
import os
import subprocess
import sys

import pytest
import torch

import dynamiq

SCRIPT = r"""
import sys, torch, dynamiq
g = torch.Generator().manual_seed(7)
out = {"isa": dynamiq.cpu_isa()}
for mode, rounding, world, dtype in [("dynamiq", "correlated", 4, torch.float32),
                                     ("dynamiq", "correlated", 17, torch.float32),
                                     ("dynamiq", "independent", 3, torch.bfloat16)]:
    xs = [(torch.randn(300_001, generator=g) * (1 + r)).to(dtype) for r in range(world)]
    cfg = dynamiq.Config(mode=mode, bits=5.0, topology="ring", rounding=rounding)
    out[(mode, rounding, world, str(dtype))] = dynamiq.simulate(xs, cfg)
torch.save(out, sys.argv[1])
"""


def _run(tmp_path, name, env_isa):
    env = dict(os.environ)
    env.pop("DYNAMIQ_CPU_ISA", None)
    if env_isa:
        env["DYNAMIQ_CPU_ISA"] = env_isa
    path = tmp_path / f"{name}.pt"
    subprocess.run([sys.executable, "-c", SCRIPT, str(path)], check=True, env=env, timeout=600)
    return torch.load(path)


def test_cpu_isa_is_reported():
    # x86 builds compile the AVX2 kernels (x86-64-v3, checked at import); other
    # hosts get the portable ones
    import platform
    x86 = platform.machine() in ("x86_64", "AMD64")
    assert dynamiq.cpu_isa() in (("avx2", "avx512") if x86 else ("generic",))


def test_avx512_and_avx2_kernels_give_identical_all_reduce_results(tmp_path):
    import platform
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("not x86: the portable kernels only")
    auto = _run(tmp_path, "auto", None)
    avx2 = _run(tmp_path, "avx2", "avx2")
    asked512 = _run(tmp_path, "avx512", "avx512")
    assert avx2.pop("isa") == "avx2"
    isa = auto.pop("isa")
    isa512 = asked512.pop("isa")
    assert isa512 == isa  # DYNAMIQ_CPU_ISA=avx512 picks what the CPU and the build have
    for other, name in ((auto, isa), (asked512, "DYNAMIQ_CPU_ISA=avx512")):
        assert other.keys() == avx2.keys()
        for key in other:
            for rank, (a, b) in enumerate(zip(other[key], avx2[key])):
                assert a.dtype == b.dtype
                assert torch.equal(a.view(torch.int16 if a.dtype == torch.bfloat16 else torch.int32),
                                   b.view(torch.int16 if b.dtype == torch.bfloat16 else torch.int32)), \
                    f"{key} rank {rank}: {name} and avx2 kernels differ"
    if isa == "avx2":
        pytest.skip("AVX2 kernels in every run (no AVX-512 kernels in this build, or no AVX-512 on "
                    "this CPU): only cross-process determinism was checked")


@pytest.mark.parametrize("var,value,ok", [
    ("DYNAMIQ_CPU_THREADS", "abc", False), ("DYNAMIQ_CPU_THREADS", "1000", False),
    ("DYNAMIQ_CPU_THREADS", "0", False), ("DYNAMIQ_CPU_THREADS", "2", True),
    ("DYNAMIQ_CPU_ISA", "foo", False), ("DYNAMIQ_CPU_ISA", "avx2", True), ("DYNAMIQ_CPU_ISA", "auto", True),
])
def test_bad_environment_settings_are_ignored_with_a_warning(var, value, ok):
    env = {k: v for k, v in os.environ.items() if k not in ("DYNAMIQ_CPU_THREADS", "DYNAMIQ_CPU_ISA")}
    env[var] = value
    code = "import dynamiq; print(dynamiq.cpu_threads(), dynamiq.cpu_isa())"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    threads, isa = r.stdout.split()
    warned = f"ignoring {var}={value}" in r.stderr
    assert warned == (not ok), r.stderr
    if var == "DYNAMIQ_CPU_THREADS":
        assert int(threads) == (int(value) if ok else 1)
    elif value == "avx2" and isa != "generic":  # (a build without x86 kernels has nothing to force)
        assert isa == "avx2"
