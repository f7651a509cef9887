"""DynamiQ in real DDP training (4 ranks on CPU): the loss tracks the
uncompressed run; config switches; non-finite gradients reach GradScaler-style
checks and the next clean step compresses again; disagreeing ranks and dying
peers raise instead of hanging."""

import os
import threading
import time

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import dynamiq
from dist_utils import run_ranks
from dynamiq.demo import TinyGPT, corpus, get_batch, lm_loss

STEPS = 200


def _train(rank, world, mode, bits, steps):
    torch.manual_seed(0)
    model = DDP(TinyGPT(d=64, layers=2, ctx=32))
    kw = {} if bits is None else {"bits": bits}
    state = dynamiq.register(model, dynamiq.Config(mode=mode, seed=1, **kw))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = corpus()
    for step in range(steps):
        x, y = get_batch(data, rank, step, 16, 32)
        opt.zero_grad()
        lm_loss(model, x, y).backward()
        opt.step()
    # deterministic held-out loss, identical batches on every rank
    with torch.no_grad():
        ev = [lm_loss(model.module, *get_batch(data, 0, 10_000 + k, 32, 32, split="val")).item() for k in range(8)]
    paths = state.totals["paths"]
    bits_used = sum(s["bits_per_coord"] * s["numel"] for s in state.last_step_stats) / \
        sum(s["numel"] for s in state.last_step_stats)
    return sum(ev) / len(ev), paths, bits_used


def test_dynamiq_5_bits_trains_like_uncompressed():
    base = run_ranks(_train, 4, "none", None, STEPS, timeout=900)
    dq5 = run_ranks(_train, 4, "dynamiq", 5.0, STEPS, timeout=900)
    b, d5 = base[0][0], dq5[0][0]
    print(f"held-out loss after {STEPS} steps, 4 ranks: none {b:.4f}  dynamiq 5 bits {d5:.4f} "
          f"({100 * (d5 / b - 1):+.2f}%, {dq5[0][2]:.2f} bits/coord)  paths {dq5[0][1]}")
    assert all(r[0] == base[0][0] for r in base)  # replicas agree
    assert abs(d5 / b - 1) < 0.01
    assert "compressed" in dq5[0][1]


def _switch_and_nonfinite(rank, world):
    torch.manual_seed(0)
    model = DDP(TinyGPT(d=32, layers=1, ctx=16))
    state = dynamiq.register(model, dynamiq.Config(mode="dynamiq", bits=5.0, min_compress_numel=256))
    data = corpus()
    log = []

    def step(k, poison=False):
        x, y = get_batch(data, rank, k, 8, 16)
        model.zero_grad()
        loss = lm_loss(model, x, y)
        if poison and rank == 1:
            loss = loss * float("inf")  # like an AMP overflow on one rank
        loss.backward()
        finite = all(torch.isfinite(p.grad).all() for p in model.parameters())
        log.append((state.config.mode, sorted({s["path"] for s in state.last_step_stats}), bool(finite)))

    step(0)
    state.config = state.config.replace(mode="none")
    step(1)
    state.config = state.config.replace(mode="dynamiq", topology="butterfly")
    step(2)
    step(3, poison=True)
    step(4)
    return log


def test_config_switch_and_nonfinite_fallback():
    res = run_ranks(_switch_and_nonfinite, 3, timeout=300)
    for log in res:
        assert log[0] == ("dynamiq", ["compressed"], True)
        assert log[1] == ("none", ["exact"], True)
        assert log[2] == ("dynamiq", ["compressed"], True)
        mode, paths, finite = log[3]
        assert not finite and "exact-nonfinite" in paths  # every rank sees the inf/nan
        assert log[4] == ("dynamiq", ["compressed"], True)  # and the next clean step compresses again


def _disagree(rank, world, field):
    kw = {"mode": "dynamiq", "bits": 5.0, "topology": "ring"}
    if rank == 1:
        kw.update({"mode": {"mode": "bitsplit", "bits": 4}, "bits": {"bits": 4.0},
                   "topology": {"topology": "butterfly"}}[field])
    try:
        dynamiq.all_reduce(torch.randn(50_000), dynamiq.Config(**kw))
    except dynamiq.DynamiqError as e:
        return str(e)
    return "no error"


@pytest.mark.parametrize("field,needle", [("mode", "mode"), ("bits", "config fingerprint"),
                                          ("topology", "topology")])
def test_disagreeing_ranks_raise_same_error(field, needle):
    res = run_ranks(_disagree, 3, field, timeout=120, pg_timeout=20)
    assert res[0] == res[1] == res[2]
    assert f"ranks disagree on {needle}" in res[0]


def _dies(rank, world):
    x = torch.randn(8 << 20)
    cfg = dynamiq.Config(mode="dynamiq", bits=5.0)
    if rank == 1:
        threading.Timer(0.3, lambda: os._exit(3)).start()
        for _ in range(100):
            dynamiq.all_reduce(x.clone(), cfg)
    t0 = time.monotonic()
    try:
        for _ in range(100):
            dynamiq.all_reduce(x.clone(), cfg)
    except dynamiq.DynamiqError as e:
        return "raised", str(e)[:200], time.monotonic() - t0
    return "no error", "", time.monotonic() - t0


def test_rank_exit_mid_collective_raises():
    res = run_ranks(_dies, 2, timeout=120, pg_timeout=10, allow_failure=True)
    assert res[0][0] == "raised", res[0]
    assert res[0][2] < 60
