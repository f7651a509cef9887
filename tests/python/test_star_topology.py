"""The test-only topology "star" (tests/cpp/star_topology/), registered from its own folder, used
from Python like a built-in one: `Config(topology="star")` through `dynamiq.all_reduce` (issue 40:
a topology is one folder and one registration line). Nothing in python/ names it: the topology
list, its collectives and its config fields come from `_C.available_topologies()`.

Star sends every rank's bucket to rank 0, which sums them and compresses the sum once, then sends
those final bytes to every rank. The extension holds it when built with DYNAMIQ_TEST_CODECS=ON
(scripts/setup.sh), as the test-only codecs.
"""
import pytest
import torch
import torch.distributed as dist

import dynamiq
from dist_utils import run_ranks
from test_modes_multiprocess import dynamiq_vnmse_bound

pytestmark = pytest.mark.skipif(
    "star" not in dynamiq.available_topologies(),
    reason="the extension lacks the test-only topologies: build it with DYNAMIQ_TEST_CODECS=ON (scripts/setup.sh)")


def test_star_is_an_all_reduce_schedule():
    assert "star" in dynamiq.available_topologies(collective="all_reduce", compositions=False)
    assert "star" not in dynamiq.available_topologies(collective="reduce_scatter")
    # a topology of its own in the config fingerprint
    assert (dynamiq.Config(topology="star")._to_cpp().fingerprint()
            != dynamiq.Config(topology="ring")._to_cpp().fingerprint())


def _star(rank, world):
    g = torch.Generator().manual_seed(100 + rank)
    out = {}
    for mode in ("none", "lossless"):
        cfg = dynamiq.Config(mode=mode, topology="star", min_compress_numel=0)
        ints = torch.randint(-1000, 1000, (20_011,), generator=g).float()
        y = ints.clone()
        dynamiq.all_reduce(y, cfg)
        ref = ints.clone()
        dist.all_reduce(ref)
        assert torch.equal(y, ref), f"{mode}: not the exact sum"
    # dynamiq: the error of the sum bounded, the replicas bit-identical
    x = torch.randn(1 << 16, generator=g)
    y = x.clone()
    dynamiq.all_reduce(y, dynamiq.Config(mode="dynamiq", bits=5, topology="star", min_compress_numel=0))
    ref = x.double()
    dist.all_reduce(ref)
    out["vnmse"] = float(((y.double() - ref) ** 2).sum() / (ref ** 2).sum())
    replicas = [torch.empty_like(y) for _ in range(world)]
    dist.all_gather(replicas, y)
    out["identical"] = all(torch.equal(r.view(torch.int32), y.view(torch.int32)) for r in replicas)
    return out


@pytest.mark.parametrize("world", [2, 3, 4])
def test_star_all_reduce_on_gloo(world):
    results = run_ranks(_star, world)
    for r in results:
        assert r["identical"], "ranks hold different bits"
        # the leaves quantise their buckets once each and the hub the sum once: (2n - 1) ||x||^2
        # of error over n ||x||^2, within the ring's bound q((n + 1) / 2 + 1) for every n >= 2
        assert 0 < r["vnmse"] <= dynamiq_vnmse_bound(world, 5), r["vnmse"]
