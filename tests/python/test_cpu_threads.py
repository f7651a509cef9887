"""Codec calls may split over CPU threads (dynamiq.set_cpu_threads); results must not change.

The in-process simulation runs every rank on its own thread with the real schedule and codec, so
with 2 threads some calls split their units (DynamiQ super-groups, bitsplit groups of groups,
lossless exponent segments) over the helpers and others (finding them busy) run alone: every rank's
result must equal the single-threaded one bit for bit.
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


@pytest.mark.parametrize("world,dtype,mode,rounding,topology", [
    (2, torch.float32, "dynamiq", "correlated", "ring"),
    (3, torch.bfloat16, "dynamiq", "independent", "butterfly"),
    (2, torch.float32, "bitsplit", "stochastic", "twostep"),
    (3, torch.bfloat16, "bitsplit", "nearest", "ring"),
    (2, torch.float32, "lossless", None, "ring"),
    (3, torch.bfloat16, "lossless", None, "butterfly"),
    (2, torch.float16, "lossless", None, "twostep"),
])
def test_threads_do_not_change_results(restore_threads, world, dtype, mode, rounding, topology):
    g = torch.Generator().manual_seed(3)
    # blocks large enough to split (at least 256 super-groups / 64 bitsplit units / 64 lossless
    # segments per thread)
    xs = [(torch.randn(2_000_003, generator=g) * (1 + r)).to(dtype) for r in range(world)]
    cfg = dynamiq.Config(mode=mode, topology=topology, rounding=rounding)  # each mode's default bits
    dynamiq.set_cpu_threads(1)
    ref = dynamiq.simulate(xs, cfg)
    dynamiq.set_cpu_threads(2)
    got = dynamiq.simulate(xs, cfg)
    for rank, (a, b) in enumerate(zip(ref, got)):
        assert torch.equal(_bits(a), _bits(b)), f"rank {rank}: 2 threads changed the result"
