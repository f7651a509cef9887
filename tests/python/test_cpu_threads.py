"""Codec calls may split over CPU threads (dynamiq.set_cpu_threads); results must not change.

The in-process simulation runs every rank on its own thread with the real schedule and codec, so
with 2 threads some calls split their super-groups over the helpers and others (finding them
busy) run alone: every rank's result must equal the single-threaded one bit for bit.
"""
import pytest
import torch

import dynamiq


@pytest.fixture
def restore_threads():
    before = dynamiq.cpu_threads()
    yield
    dynamiq.set_cpu_threads(before)


def test_setting_is_validated(restore_threads):
    start = dynamiq.cpu_threads()
    assert start >= 1
    for bad in (0, -1, 257, 2.0, "2", True):
        with pytest.raises(ValueError):
            dynamiq.set_cpu_threads(bad)
    assert dynamiq.cpu_threads() == start
    assert dynamiq.set_cpu_threads(3) == start
    assert dynamiq.cpu_threads() == 3


def _bits(t):
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


@pytest.mark.parametrize("world,dtype,rounding,topology", [
    (2, torch.float32, "correlated", "ring"),
    (3, torch.bfloat16, "independent", "butterfly"),
])
def test_threads_do_not_change_results(restore_threads, world, dtype, rounding, topology):
    g = torch.Generator().manual_seed(3)
    # 1 MiB blocks of 1024 super-groups: large enough to split (256 per thread at least)
    xs = [(torch.randn(2_000_003, generator=g) * (1 + r)).to(dtype) for r in range(world)]
    cfg = dynamiq.Config(mode="dynamiq", bits=5.0, topology=topology, rounding=rounding)
    dynamiq.set_cpu_threads(1)
    ref = dynamiq.simulate(xs, cfg)
    dynamiq.set_cpu_threads(2)
    got = dynamiq.simulate(xs, cfg)
    for rank, (a, b) in enumerate(zip(ref, got)):
        assert torch.equal(_bits(a), _bits(b)), f"rank {rank}: 2 threads changed the result"
