"""The per-operation timeline (stats["timeline"]) and sends posted ahead, through the real c10d
transport over Gloo: the timeline's watcher threads wait on Gloo's own Work objects there.

- With the timeline on and off, and with sends posted ahead (the default) and not
  (DYNAMIQ_SEND_AHEAD=0), every mode and topology gives bit-identical results and byte counts.
- The timeline is well formed: post <= start <= end for every event; the data sends' count and
  bytes are the call's messages_sent and bytes_sent, the statistics' sends its meta_bytes_sent;
  every receive has its send on the peer (same tag, slice and part) and arrived after that send
  was posted (one steady clock for the processes of a machine).
- simulate(..., timeline=True) gives the same keys; the hook's `state.timeline` adds it per bucket.
"""

import pytest
import torch

import dynamiq
from dynamiq.api import resolve_group, run_collective
from dist_utils import run_ranks

MODES = tuple(dynamiq.available_modes())
TOPOLOGIES = tuple(dynamiq.available_topologies(compositions=False))  # the registry's schedules


def _all(rank, world, timeline):
    _, name = resolve_group(None)
    out = {}
    seq = 0
    for mode in MODES:
        for topo in TOPOLOGIES:
            g = torch.Generator().manual_seed(rank + 1)
            x = torch.randn(60_013, generator=g) * 1e-3
            extra = {"error_bound_rel": 1e-3} if mode == "bounded" else {}  # bounded needs a bound
            cfg = dynamiq.Config(mode=mode, topology=topo, block_bytes=4096, **extra)  # each mode's default bits
            stats = run_collective(x, name, cfg, "sum", seq, timeline=timeline)
            seq += 1
            out[(mode, topo)] = (x.view(torch.int32).tolist(), stats)
    return out


def _check_well_formed(per_rank, key):
    world = len(per_rank)
    sends = {}
    for r in range(world):
        tl = per_rank[r][key][1]["timeline"]
        assert tl["rank"] == r and tl["world"] == world and tl["clock"] == "steady"
        for e in tl["events"]:
            if e["kind"] == "send":
                sends[(r, e["peer"], e["tag"], e["slice"], e["part"])] = e["t_post"]
    for r in range(world):
        st = per_rank[r][key][1]
        msgs = data_bytes = meta_bytes = 0
        for e in st["timeline"]["events"]:
            assert 0 < e["t_post"] <= e["t_start"] <= e["t_end"], (key, r, e)
            if e["kind"] == "send":
                if e["part"] == "data":
                    data_bytes += e["bytes"]
                    msgs += 1
                else:
                    meta_bytes += e["bytes"]
            elif e["kind"] == "recv":
                assert e["t_need"] >= e["t_post"], (key, r, e)
                posted = sends.get((e["peer"], r, e["tag"], e["slice"], e["part"]))
                assert posted is not None, (key, r, e)
                assert posted <= e["t_end"], (key, r, e)
        # over Gloo every message is one send (lossless's two parts travel as one)
        assert msgs == st["messages_sent"], (key, r)
        assert data_bytes == st["bytes_sent"], (key, r)
        assert meta_bytes == st["meta_bytes_sent"], (key, r)
        names = {e["name"] for e in st["timeline"]["events"] if e["kind"] == "phase"}
        assert {"local", "header"} <= names, (key, names)
        assert ("execute" in names) == (st["path"] == "compressed"), (key, names)


@pytest.mark.parametrize("world", [2, 3])
def test_timeline_and_send_ahead_change_nothing_and_the_timeline_is_well_formed(world):
    base = run_ranks(_all, world, False, timeout=300, env={"DYNAMIQ_SEND_AHEAD": "0"})
    variants = {
        "timeline, no send-ahead": run_ranks(_all, world, True, timeout=300, env={"DYNAMIQ_SEND_AHEAD": "0"}),
        "send-ahead": run_ranks(_all, world, False, timeout=300),
        "timeline, send-ahead": run_ranks(_all, world, True, timeout=300),
    }
    for what, v in variants.items():
        for r in range(world):
            for key in base[r]:
                bits_b, st_b = base[r][key]
                bits_v, st_v = v[r][key]
                assert bits_b == bits_v, (what, key, r)
                for k in ("bytes_sent", "bytes_received", "messages_sent", "meta_bytes_sent", "path"):
                    assert st_b[k] == st_v[k], (what, key, r, k)
                assert ("timeline" in st_v) == what.startswith("timeline"), (what, key)
        if what.startswith("timeline"):
            for key in v[0]:
                _check_well_formed(v, key)


def test_simulate_timeline():
    xs = [torch.randn(40_000, generator=torch.Generator().manual_seed(r)) for r in range(3)]
    cfg = dynamiq.Config(mode="dynamiq", block_bytes=4096)
    plain, st0 = dynamiq.simulate(xs, cfg, return_stats=True)
    res, st = dynamiq.simulate(xs, cfg, return_stats=True, timeline=True)
    assert all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(plain, res))
    assert all("timeline" not in s for s in st0)
    for r, s in enumerate(st):
        ev = s["timeline"]["events"]
        assert s["timeline"]["rank"] == r
        kinds = {e["kind"] for e in ev}
        assert kinds == {"phase", "kernel", "send", "recv"}
        kernel = sum(e["t_end"] - e["t_start"] for e in ev if e["kind"] == "kernel" and e["part"] == "data")
        assert kernel == pytest.approx(s["t_kernel"], rel=1e-9, abs=1e-9)
    with pytest.raises(ValueError, match="all_reduce"):
        dynamiq.simulate(xs, cfg, collective="all_gather", timeline=True)


def _ddp_steps(rank, world, stats_ahead, mode):
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10))
    ddp = DDP(model, bucket_cap_mb=0.02)  # several buckets: bucket k+1's pass runs beside bucket k
    state = dynamiq.register(ddp, dynamiq.Config(mode=mode, min_compress_numel=0))  # each mode's default bits
    state.stats_ahead = stats_ahead
    state.timeline = True
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(4):
        x, y = torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    stats = state.last_step_stats
    assert len(stats) >= 2, len(stats)
    # the statistics pass is recorded either way (run ahead, it is the copy the call used: short)
    for s in stats:
        assert any(e["kind"] == "phase" and e["name"] == "local" for e in s["timeline"]["events"])
    return (torch.cat([p.detach().view(-1) for p in ddp.parameters()]).view(torch.int32).tolist(),
            [(s["bytes_sent"], s["path"]) for s in stats])


@pytest.mark.parametrize("mode", ["dynamiq", "bitsplit"])
def test_hook_statistics_ahead_change_nothing(mode):
    on = run_ranks(_ddp_steps, 2, True, mode, timeout=300)
    off = run_ranks(_ddp_steps, 2, False, mode, timeout=300)
    for r in range(2):
        assert on[r][0] == off[r][0], r
        assert on[r][1] == off[r][1], r
    assert on[0][0] == on[1][0]
