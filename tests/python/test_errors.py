"""Bad input and failures: clear errors on every rank, within bounded time, never a hang."""

import os
import threading
import time

import pytest
import torch
import torch.distributed as dist

import dynamiq
from dist_utils import run_ranks


def _expect_error(fn, *needles):
    t0 = time.monotonic()
    try:
        fn()
    except dynamiq.DynamiqError as e:
        msg = str(e)
        for n in needles:
            assert n in msg, f"{n!r} not in {msg!r}"
        return msg, time.monotonic() - t0
    raise AssertionError("no error raised")


def _bad_inputs(rank, world):
    cfg = dynamiq.Config(mode="none")
    out = {}
    out["int64"] = _expect_error(lambda: dynamiq.all_reduce(torch.ones(8, dtype=torch.int64), cfg),
                                 "dtype torch.int64 is not supported")[0]
    out["complex"] = _expect_error(lambda: dynamiq.all_reduce(torch.ones(8, dtype=torch.complex64), cfg),
                                   "dtype torch.complex64 is not supported")[0]
    out["strided"] = _expect_error(lambda: dynamiq.all_reduce(torch.ones(8, 8).t(), cfg), "not contiguous")[0]
    out["sparse"] = _expect_error(lambda: dynamiq.all_reduce(torch.eye(8).to_sparse(), cfg),
                                  "torch.sparse_coo tensors are not supported")[0]
    out["meta"] = _expect_error(lambda: dynamiq.all_reduce(torch.ones(8, device="meta"), cfg), "device meta")[0]
    # A CUDA tensor (faked: there is no GPU here) on this Gloo group: a CUDA
    # build would stage it through host memory (tests/python/test_gpu_staging.py),
    # but torch sees no GPU (or this build has no CUDA at all).
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(allow_non_fake_inputs=True):
        fake_cuda = torch.empty(8, device="cuda")
    needle = ("torch.cuda.is_available() is False" if dynamiq._C.built_with_cuda()
              else "CUDA tensors are not supported by this build")
    out["cuda"] = _expect_error(lambda: dynamiq.all_reduce(fake_cuda, cfg), needle)[0]
    # The group still works afterwards.
    x = torch.ones(4)
    dynamiq.all_reduce(x, cfg)
    assert torch.equal(x, torch.full((4,), float(world)))
    return out


def test_bad_inputs_raise_documented_errors_on_every_rank():
    res = run_ranks(_bad_inputs, 2, timeout=120, pg_timeout=20)
    assert res[0] == res[1]


def _one_rank_bad(rank, world):
    # Only rank 1 passes a bad tensor: rank 0 must not wait for a timeout.
    t = torch.ones(8, dtype=torch.int64) if rank == 1 else torch.ones(8)
    msg, dt = _expect_error(lambda: dynamiq.all_reduce(t, dynamiq.Config(mode="none")),
                            "dtype torch.int64" if rank == 1 else "1 rank(s) reported unsupported dtype")
    return msg, dt


def test_one_rank_with_bad_input_aborts_all_ranks_quickly():
    res = run_ranks(_one_rank_bad, 3, timeout=120, pg_timeout=60)
    for msg, dt in res:
        assert dt < 10, f"took {dt:.1f} s: should not wait for the 60 s timeout"


def _mismatch(rank, world):
    cfg = dynamiq.Config(mode="none", seed=rank)  # every rank a different seed
    msg, _ = _expect_error(lambda: dynamiq.all_reduce(torch.ones(100), cfg), "ranks disagree on config fingerprint")
    topo = dynamiq.Config(mode="none", topology="ring" if rank else "butterfly")
    msg2, _ = _expect_error(lambda: dynamiq.all_reduce(torch.ones(100), topo), "ranks disagree on topology")
    size = _expect_error(lambda: dynamiq.all_reduce(torch.ones(100 + rank), dynamiq.Config(mode="none")),
                         "ranks disagree on numel")[0]
    # mode auto on some ranks only: its header carries more numbers (a header of another
    # length would hang or abort the backend's all-reduce), and its first bucket shares
    # the calibration before deciding; every rank must still raise the same error
    auto = dynamiq.Config(mode="auto" if rank != 1 else "dynamiq", auto_bandwidth=1e6, auto_latency=0.0)
    mixed = _expect_error(lambda: dynamiq.all_reduce(torch.ones(1 << 16), auto), "ranks disagree on mode")[0]
    return msg, msg2, size, mixed


def test_mismatched_config_same_error_everywhere():
    res = run_ranks(_mismatch, 3, timeout=120, pg_timeout=20)
    assert res[0] == res[1] == res[2]


def _peer_dies(rank, world):
    x = torch.randn(16 << 20)  # 64 MB: the collective takes a while
    # A first call makes dynamiq's own process group on both ranks, so that rank 1
    # dies inside a collective and not (on a slow machine) while the group is
    # still being connected, which Gloo bounds by its own connect timeouts.
    dynamiq.all_reduce(torch.ones(4), dynamiq.Config(mode="none"))
    if rank == 1:
        threading.Timer(0.05, lambda: os._exit(3)).start()
        dynamiq.all_reduce(x, dynamiq.Config(mode="none"))
        time.sleep(60)
    t0 = time.monotonic()
    try:
        for _ in range(20):
            dynamiq.all_reduce(x, dynamiq.Config(mode="none"))
    except dynamiq.DynamiqError as e:
        return "raised", str(e)[:300], time.monotonic() - t0
    return "no error", "", time.monotonic() - t0


def test_peer_dying_mid_collective_raises_not_hangs():
    res = run_ranks(_peer_dies, 2, timeout=120, pg_timeout=15, allow_failure=True)
    status, msg, dt = res[0]
    assert status == "raised", res[0]
    assert dt < 60
    print("rank 0 saw:", msg, f"after {dt:.1f} s")


def _peer_hangs(rank, world, when, done_file):
    # Rank 1 is alive but never joins (stuck in its own code) before the first dynamiq
    # call on the group, which makes dynamiq's own process group, or before a later
    # one: rank 0 must raise a TransportError once the group's timeout (pg_timeout
    # below) has passed. dynamiq's group must inherit that timeout: with torch's
    # default (30 min for Gloo) rank 0 would sit until the harness kills it.
    x = torch.ones(1 << 16)
    if when == "later":
        dynamiq.all_reduce(x, dynamiq.Config(mode="none"))
    if rank == 1:  # stuck until rank 0 is done (at most 20 s), so that the test lasts no longer
        deadline = time.monotonic() + 20
        while not os.path.exists(done_file) and time.monotonic() < deadline:
            time.sleep(0.05)
        return "slept", "", 0.0
    t0 = time.monotonic()
    try:
        dynamiq.all_reduce(x, dynamiq.Config(mode="none"))
    except dynamiq.TransportError as e:
        return "raised", str(e)[:300], time.monotonic() - t0
    finally:
        open(done_file, "w").close()
    return "no error", "", time.monotonic() - t0


@pytest.mark.parametrize("when", ["first", "later"])
def test_hung_peer_raises_after_the_group_timeout(when, tmp_path):
    res = run_ranks(_peer_hangs, 2, when, str(tmp_path / "rank0-done"), timeout=120, pg_timeout=6,
                    allow_failure=True)
    assert res[0][0] == "raised", res[0]
    status, msg, dt = res[0]
    assert 5 < dt < 18, f"raised after {dt:.1f} s, the group's timeout is 6 s: {msg}"
    print("rank 0 saw:", msg, f"after {dt:.1f} s")


def test_config_validation_names_field():
    with pytest.raises(dynamiq.ConfigError, match="topology='tree'"):
        dynamiq.Config(topology="tree")
    with pytest.raises(dynamiq.ConfigError, match="bits=9"):
        dynamiq.Config(mode="bitsplit", bits=9)
    with pytest.raises(dynamiq.ConfigError, match="widths"):
        dynamiq.Config(widths=(3,))
    with pytest.raises(dynamiq.ConfigError, match="rounding"):
        dynamiq.Config(mode="lossless", rounding="nearest")
    for bad in (1023, -1, True, 1.5, (1 << 30) + 1):  # 0 = per-path default; else [1 KiB, 1 GiB]
        with pytest.raises(dynamiq.ConfigError, match="block_bytes"):
            dynamiq.Config(block_bytes=bad)
    assert dynamiq.Config().block_bytes == 0 and dynamiq.Config(block_bytes=1024).block_bytes == 1024
    with pytest.raises(dynamiq.ConfigError, match="window_bytes"):
        dynamiq.Config(window_bytes=True)
    for bad in (True, -1, 1000, 1.5, 1 << 45):  # 0 = never split; else [64 KiB, 2**44]
        with pytest.raises(dynamiq.ConfigError, match="max_collective_bytes"):
            dynamiq.Config(max_collective_bytes=bad)
    assert dynamiq.Config().max_collective_bytes == 256 << 20 and dynamiq.Config(max_collective_bytes=0)
    c = dynamiq.Config(mode="none", seed=7, topology="butterfly")
    assert dynamiq.Config.from_json(c.to_json()) == c
    # values of the wrong kind raise ConfigError naming the field, in every mode
    # (not OverflowError/TypeError, and not accepted: NaN would not survive to_json)
    for mode in ("none", "dynamiq", "lossless", "bitsplit"):
        for bad in (float("nan"), float("inf"), 10**400, "5", True):
            with pytest.raises(dynamiq.ConfigError, match="bits="):
                dynamiq.Config(mode=mode, bits=bad)
    for kw in (dict(widths=(2.0, 4.0, 8.0)), dict(widths=(True, 4)), dict(group_size=True),
               dict(group_size=16.0), dict(supergroup_size=256.0), dict(eps=("a", 1, 1, 1)),
               dict(eps=(float("inf"), -1, -1, -1)), dict(eps=None or (1, 2))):
        field = next(iter(kw))
        with pytest.raises(dynamiq.ConfigError, match=field):
            dynamiq.Config(**kw)


def test_eps_range_is_the_codecs():
    # [0, 4] per width, -1 for the default: the defaults themselves, written out,
    # and 0 (evenly spaced levels) are accepted and give the same bytes as the
    # equivalent settings; above 4 is refused naming the field.
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(8192, generator=g) for _ in range(2)]
    base = dict(mode="dynamiq", min_compress_numel=0)
    ref = dynamiq.simulate(xs, dynamiq.Config(**base))[0]
    assert torch.equal(dynamiq.simulate(xs, dynamiq.Config(**base, eps=(0, 0, 0.3, 0.06)))[0], ref)
    uni = dynamiq.simulate(xs, dynamiq.Config(**base, uniform_levels=True))[0]
    assert not torch.equal(uni, ref)
    assert torch.equal(dynamiq.simulate(xs, dynamiq.Config(**base, eps=(0, 0, 0, 0)))[0], uni)
    for bad in ((5, 5, 5, 5), (-0.5, -1, -1, -1), (-1, -1, 4.5, -1)):
        with pytest.raises(dynamiq.ConfigError, match="eps"):
            dynamiq.Config(**base, eps=bad)


def test_not_initialized():
    with pytest.raises(dynamiq.DynamiqError, match="not initialized"):
        dynamiq.all_reduce(torch.ones(3), dynamiq.Config(mode="none"))


def test_config_validation_catches_what_the_codecs_reject():
    # Rules that live in the C++ codecs and allocator: a Config that passes
    # construction must never fail inside a collective (on one rank only, when
    # ranks disagree, it would also have left its peers waiting in the header).
    cases = [
        dict(mode="bitsplit", bits=4, group_size=16),          # bitsplit groups: multiples of 32
        dict(mode="dynamiq", group_size=5, supergroup_size=25),  # S a multiple of 8
        dict(mode="dynamiq", eps=(-1, -1, -1, 5.0)),            # eps outside the codec's range
        dict(mode="dynamiq", widths=(8, 16), group_size=1),     # a width-16 super-group not larger on the wire
    ]
    for kw in cases:
        with pytest.raises(dynamiq.ConfigError):
            dynamiq.Config(**kw)
    for mode, name, bad in (("bitsplit", "log_scales", "yes"), ("dynamiq", "hierarchical_scales", 0),
                            ("dynamiq", "uniform_levels", 1)):
        with pytest.raises(dynamiq.ConfigError, match=f"{name}={bad!r} is invalid; allowed: True, False"):
            dynamiq.Config(mode=mode, **{name: bad})
    assert dynamiq.Config(hierarchical_scales=None).hierarchical_scales is True  # None: the mode's default
    for mode in ("none", "dynamiq", "lossless", "bitsplit"):  # the defaults stay valid
        dynamiq.Config(mode=mode)
    dynamiq.Config(mode="bitsplit", bits=4, group_size=64)


def test_config_argument_type_checked():
    with pytest.raises(TypeError, match="dynamiq.Config"):
        dynamiq.all_reduce(torch.ones(3), {"mode": "none"})


def _wait_done(fut, seconds):
    deadline = time.monotonic() + seconds
    while not fut.done() and time.monotonic() < deadline:
        time.sleep(0.01)
    return fut.done()


def test_worker_survives_a_base_exception():
    # A collective's Python code interrupted by a non-Exception (SystemExit,
    # KeyboardInterrupt) must fail its Future and leave the group's worker alive:
    # torch's Future takes only Exceptions, and a dead worker would leave every
    # later collective on the group waiting forever.
    from dynamiq._worker import GroupWorker

    w = GroupWorker("test-worker-survives")

    def interrupted():
        raise SystemExit(3)

    f1 = w.submit(interrupted)
    f2 = w.submit(lambda: 42)
    assert _wait_done(f1, 10) and _wait_done(f2, 10), "the worker died"
    with pytest.raises(RuntimeError, match="SystemExit"):
        f1.wait()
    assert f2.wait() == 42


def _reentrant(rank, world):
    x = torch.ones(8)
    fut = dynamiq.all_reduce(x, dynamiq.Config(mode="none"), async_op=True)
    # a synchronous all_reduce inside a callback (which runs on dynamiq's worker)
    chained = fut.then(lambda f: dynamiq.all_reduce(torch.ones(4), dynamiq.Config(mode="none")))
    assert _wait_done(chained, 20), "the callback's all_reduce waits for its own worker"
    try:
        chained.wait()
        err = ""
    except Exception as e:  # noqa: BLE001
        err = str(e)
    # async_op=True from a callback is fine, and the group keeps working
    inner = []
    chained2 = fut.then(lambda f: inner.append(dynamiq.all_reduce(torch.ones(4), dynamiq.Config(mode="none"),
                                                                  async_op=True)))
    assert _wait_done(chained2, 20)
    assert _wait_done(inner[0], 20) and torch.equal(inner[0].wait(), torch.full((4,), float(world)))
    y = torch.ones(4)
    dynamiq.all_reduce(y, dynamiq.Config(mode="none"))
    return err, y


def test_synchronous_all_reduce_from_a_callback_raises_instead_of_hanging():
    res = run_ranks(_reentrant, 2, timeout=120, pg_timeout=30)
    for err, y in res:
        assert "from a callback" in err, err
        assert torch.equal(y, torch.full((4,), 2.0))


def _non_member(rank, world):
    g = dist.new_group([0, 1])
    x = torch.full((100,), float(10 ** rank))
    out = dynamiq.all_reduce(x, dynamiq.Config(mode="none"), group=g)
    return out, x


def test_all_reduce_on_a_rank_outside_the_group_returns_like_torch():
    res = run_ranks(_non_member, 3, timeout=120, pg_timeout=30)
    for out, _ in res:
        assert out is None
    assert torch.equal(res[0][1], torch.full((100,), 11.0)) and torch.equal(res[1][1], torch.full((100,), 11.0))
    assert torch.equal(res[2][1], torch.full((100,), 100.0))  # rank 2 untouched


def test_demo_bits_default_depends_on_mode_and_explicit_bits_are_kept():
    from dynamiq.demo import parse_args

    # no --bits: the mode's own default (the codec declares it), as the demo's Config takes it
    assert parse_args([]).bits is None and parse_args(["--mode", "bitsplit"]).bits is None
    assert dynamiq.Config(mode="dynamiq").bits == 5.0 and dynamiq.Config(mode="bitsplit").bits == 4
    assert parse_args(["--mode", "bitsplit", "--bits", "5"]).bits == 5  # was silently 4
    assert parse_args(["--bits", "3.5"]).bits == 3.5
    with pytest.raises(SystemExit):  # mode lossless has no bits
        parse_args(["--mode", "lossless", "--bits", "4"])


_EXIT_SCRIPT = r"""
import sys, time
import torch, torch.distributed as dist
import dynamiq
rank = int(sys.argv[1])
dist.init_process_group("gloo", store=dist.FileStore(sys.argv[2], 2), rank=rank, world_size=2)
cfg = dynamiq.Config(mode="none")
dynamiq.all_reduce(torch.ones(8), cfg)  # dynamiq's group and worker exist on both ranks
x = torch.full((1 << 20,), float(rank + 1))
if rank == 1:
    time.sleep(2.0)  # rank 0 reaches the end of its script meanwhile
    dynamiq.all_reduce(x, cfg)
    print(f"rank 1 result {float(x[0])}", flush=True)
else:
    fut = dynamiq.all_reduce(x, cfg, async_op=True)
    fut.then(lambda f: print(f"rank 0 callback {float(f.value()[0])}", flush=True))
    print("rank 0 leaves its script", flush=True)
"""


def test_exit_with_a_collective_in_flight_completes_it(tmp_path):
    """A script that ends while an async_op=True collective is in flight: dynamiq's exit
    handler lets the worker finish it (its Future's callback runs) before the interpreter
    finalizes. Without it the daemon worker is cut off at finalization: the callback never
    runs, and rank 1's collective fails with rank 0 gone (or rank 0 aborts)."""
    import subprocess
    import sys

    script = tmp_path / "exit_in_flight.py"
    script.write_text(_EXIT_SCRIPT)
    store = tmp_path / "store"
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(store)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=120)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {r} exit {p.returncode}:\n{out[-3000:]}"
    assert "rank 0 leaves its script" in outs[0]
    assert "rank 0 callback 3.0" in outs[0], outs[0][-3000:]
    assert "rank 1 result 3.0" in outs[1], outs[1][-3000:]
