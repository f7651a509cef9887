"""Soak, CI-sized: 200 DDP steps in every mode on 4 ranks over Gloo loopback, one mode after the
other in the same processes (tests/python/soaklib.py). Replicas end bit-identical; the host RSS
stays flat after a warm-up; no file descriptors or threads are left behind by a model, its
optimizer and its hook state once they are dropped. The 2,000-step version is
experiments/probes/soak.py (results in experiments/results/soak/)."""

import dynamiq
from dist_utils import run_ranks
from soaklib import soak_rank

STEPS = 200
WARMUP = 50
# RSS may grow by at most this much from the end of the warm-up to the end of a mode's 200 steps.
# Each step moves ~340 KB of gradients through the hook (in 2 buckets), so
# a leak of anything per step larger than RSS_TOL / (STEPS - WARMUP) = 28 KB is caught; what the
# allocator keeps for reuse is a few hundred KB (experiments/results/soak/).
RSS_TOL = 4 << 20


def test_soak_every_mode_4_ranks():
    modes = dynamiq.available_modes()
    res = run_ranks(soak_rank, 4, modes, STEPS, WARMUP, timeout=300)
    for mode in modes:
        per_rank = [r["modes"][mode] for r in res]
        assert all(m["finite"] for m in per_rank), mode
        assert all(m["hook_steps"] == STEPS for m in per_rank), (mode, [m["hook_steps"] for m in per_rank])
        # replicas bit-identical: one digest of the parameters' bytes on every rank
        assert len({m["digest"] for m in per_rank}) == 1, (mode, [m["digest"][:12] for m in per_rank])
        for rank, m in enumerate(per_rank):
            rss = m["rss"]
            growth = max(rss[WARMUP:]) - rss[WARMUP - 1]
            assert growth <= RSS_TOL, f"{mode}, rank {rank}: RSS grew by {growth / 2**20:.2f} MiB after warm-up"
            # no descriptor or thread more at the end of a mode than at the end of its warm-up
            (wf, wt), (ef, et) = m["warm_counts"], m["end_counts"]
            assert ef <= wf and et <= wt, (mode, rank, m["warm_counts"], m["end_counts"])
            # once its model, optimizer and hook state are dropped, nothing more is left than the
            # mode had running at the end of its warm-up (pools made lazily by a mode stay: not a leak)
            assert m["fds"] <= wf and m["threads"] <= wt, (mode, rank, m["warm_counts"], m["fds"], m["threads"])
