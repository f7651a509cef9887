"""The test-only codec "negate" (tests/cpp/negate_codec/), registered from its own folder, used
from Python like a built-in mode: `Config(mode="negate", mask=...)` through `dynamiq.all_reduce`,
`reduce_scatter`, `all_gather` and the DDP hook (issue 40: a codec is one folder and one
registration line, parameters included). Nothing in python/ names it: its field, default and
checks come from the declaration in its folder through `_C.mode_info()`.

Negate sends every value with its top byte XORed with `mask` and undoes it on receipt, over the
identity codec's sums: results equal mode none's bit for bit while every byte on the wire
differs. The extension holds it when built with DYNAMIQ_TEST_CODECS=ON (scripts/setup.sh).
"""
import copy

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import dynamiq
from dist_utils import run_ranks


def test_negate_is_a_mode_with_its_declared_parameter():
    assert "negate" in dynamiq.available_modes(), (
        "the extension lacks the test-only codecs: build it with DYNAMIQ_TEST_CODECS=ON (scripts/setup.sh)")
    assert dynamiq.Config(mode="negate").mask == 128  # the declared default
    assert dynamiq.Config(mode="negate", mask=3).mask == 3
    assert dynamiq.config.is_exact("negate")
    with pytest.raises(dynamiq.ConfigError, match="mask"):
        dynamiq.Config(mode="negate", bits=5)  # a field of other modes: the error names negate's
    with pytest.raises(dynamiq.ConfigError):
        dynamiq.Config(mode="negate", mask=256)  # out of the declared range
    with pytest.raises((dynamiq.ConfigError, dynamiq.DynamiqError), match="nonzero mask"):
        dynamiq.Config(mode="negate", mask=0)  # refused by the codec's own factory
    # the parameter enters the fingerprint: ranks that disagree on it are stopped
    a = dynamiq.Config(mode="negate", mask=1)._to_cpp().fingerprint()
    b = dynamiq.Config(mode="negate", mask=2)._to_cpp().fingerprint()
    assert a != b


def _bits(t):
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def _collectives(rank, world, mask):
    cfg = dynamiq.Config(mode="negate", mask=mask, min_compress_numel=0)
    none = dynamiq.Config(mode="none")
    g = torch.Generator().manual_seed(rank)
    for dtype in (torch.float32, torch.bfloat16):
        x = (torch.randn(10_007, generator=g) * 3).to(dtype)
        x[7] = float("nan")
        y, z = x.clone(), x.clone()
        dynamiq.all_reduce(y, cfg)
        dynamiq.all_reduce(z, none)
        assert torch.equal(_bits(y), _bits(z)), f"all_reduce {dtype}: negate differs from none"
        # integers: the exact sum on every rank
        ints = torch.randint(-1000, 1000, (4096,), generator=g).float()
        s = ints.clone()
        dynamiq.all_reduce(s, cfg)
        ref = ints.clone()
        dist.all_reduce(ref)
        assert torch.equal(s, ref)
        # reduce-scatter and all-gather against torch's own
        inp = (torch.randn(world * 1024, generator=g)).to(dtype)
        rs, rs_ref = torch.empty(1024, dtype=dtype), torch.empty(1024, dtype=dtype)
        dynamiq.reduce_scatter(rs, inp, cfg)
        dynamiq.reduce_scatter(rs_ref, inp, none)
        assert torch.equal(_bits(rs), _bits(rs_ref)), f"reduce_scatter {dtype}"
        shard = torch.randn(1024, generator=g).to(dtype)
        ag = torch.empty(world * 1024, dtype=dtype)
        dynamiq.all_gather(ag, shard, cfg)
        parts = [torch.empty_like(shard) for _ in range(world)]
        dist.all_gather(parts, shard)
        assert torch.equal(_bits(ag), _bits(torch.cat(parts))), f"all_gather {dtype}"


@pytest.mark.parametrize("world,mask", [(2, 128), (3, 1)])
def test_negate_collectives_equal_mode_none(world, mask):
    run_ranks(_collectives, world, mask)


def _ddp(rank, world):
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    ref = DDP(copy.deepcopy(base), bucket_cap_mb=0.01)
    ours = DDP(copy.deepcopy(base), bucket_cap_mb=0.01)
    state = dynamiq.register(ours, dynamiq.Config(mode="negate", mask=0x81, min_compress_numel=0))
    for model in (ref, ours):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            g = torch.Generator().manual_seed(1000 * step + rank)
            x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    for p, q in zip(ref.parameters(), ours.parameters()):
        assert torch.equal(p, q), "DDP with the negate hook differs from plain DDP"
    return [(b["path"], b["bytes_sent"]) for b in state.last_step_stats]


def test_negate_ddp_hook_trains_bit_for_bit_as_plain_ddp():
    for buckets in run_ranks(_ddp, 2):
        assert buckets and all(path == "compressed" and sent > 0 for path, sent in buckets), buckets
