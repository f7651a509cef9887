"""The posting NCCL needs, through the real c10d transport, on Gloo.

NCCL matches point-to-point operations in posting order (no tags), so for it
the executor posts receives in program order and each step's send and receive
as one group (experiments/results/nccl_order/README.md). A CUDA bucket always takes
that path; DYNAMIQ_ORDERED_POSTING=1 forces it on CPU buckets over Gloo, which
is how its path through C10dTransport runs here (no GPU). Every mode and
topology must give bit-identical results and byte counts to the default
posting, on 3 and 5 ranks (a ring of 3+, a butterfly with extra ranks whose
steps post several chunks as one group, two-step with every peer in one group,
DynamiQ's statistics as a butterfly from 4 ranks on) with blocks
small enough that the default posting receives ahead. The default posting
also sends lossless's two-part messages as one (Gloo completes a receive with
a shorter message), the ordered one as two: the comparison covers both.
"""

import pytest
import torch

import dynamiq
from dynamiq.api import resolve_group, run_collective
from dist_utils import run_ranks

MODES = tuple(dynamiq.available_modes())
TOPOLOGIES = tuple(dynamiq.available_topologies(compositions=False))  # the registry's schedules


def _all(rank, world):
    _, name = resolve_group(None)
    out = {}
    seq = 0
    for mode in MODES:
        for topo in TOPOLOGIES:
            g = torch.Generator().manual_seed(rank + 1)
            x = torch.randn(30_011, generator=g) * 1e-3
            kw = {"error_bound": 1e-5} if mode == "bounded" else {}  # (each mode's default bits)
            cfg = dynamiq.Config(mode=mode, topology=topo, block_bytes=4096, **kw)
            stats = run_collective(x, name, cfg, "sum", seq)
            seq += 1
            out[(mode, topo)] = (x.view(torch.int32).tolist(), stats["bytes_sent"], stats["path"],
                                 stats["ordered_posting"], stats["one_part_messages"])
    return out


@pytest.mark.parametrize("world", [3, 5])
def test_ordered_posting_equals_default_posting_over_gloo(world):
    default = run_ranks(_all, world, timeout=300)
    ordered = run_ranks(_all, world, timeout=300, env={"DYNAMIQ_ORDERED_POSTING": "1"})
    for rank in range(world):
        for key in default[rank]:
            bits_d, sent_d, path_d, ord_d, one_d = default[rank][key]
            bits_o, sent_o, path_o, ord_o, one_o = ordered[rank][key]
            assert (ord_d, ord_o) == (False, True), key
            assert (one_d, one_o) == (True, False), key
            assert path_d == path_o == ("exact" if key[0] == "none" else "compressed"), key
            assert sent_d == sent_o, (key, rank, sent_d, sent_o)
            assert bits_d == bits_o, (key, rank)
    for key in default[0]:  # and every rank holds the same result
        assert all(default[r][key][0] == default[0][key][0] for r in range(world)), key
