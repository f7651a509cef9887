"""The examples as users launch them: Lightning's DDPStrategy, `accelerate launch`, torchrun.

Each runs 2 CPU processes on Gloo for a few steps of a tiny model and writes one JSON per
rank; the tests check that dynamiq's hook ran on every step (its totals), that the
replicas ended bit for bit equal, and that the hook's state went through each
framework's checkpoints (Lightning: restored on resume; Accelerate: a reloaded second
half repeats the first bit for bit). Versions: docs/integrations.md.
"""

import importlib.util
import json
import os
import signal
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _launch(cmd, timeout=240):
    """Runs `cmd` in the repository in a session of its own; kills the session (every
    rank it started) on a timeout. Returns its output; fails the test on a non-zero exit."""
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    p = subprocess.Popen([str(c) for c in cmd], cwd=REPO, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        pytest.fail(f"{cmd[:3]} did not finish within {timeout} s:\n{out[-4000:]}")
    assert p.returncode == 0, f"exit {p.returncode}:\n{out[-6000:]}"
    return out


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ranks(folder, world=2):
    return [json.loads((Path(folder) / f"rank{r}.json").read_text()) for r in range(world)]


def test_lightning_ddp_strategy_with_hook_state_and_comm_hook(tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    out = _launch([sys.executable, "examples/lightning_ddp.py", "--steps", "3", "--print-every", "1",
                   "--save", ckpt, "--out", tmp_path / "a"])
    a = _ranks(tmp_path / "a")
    for r in a:
        # the hook ran on every step's bucket (Lightning registers comm hooks on CUDA only:
        # without DynamiqCallback, DDP would all-reduce on its own and these would be 0)
        assert r["global_step"] == 3 and r["state"]["step"] == 3 and r["world_size"] == 2, r
        assert r["totals"]["paths"] == {"compressed": 3}, r["totals"]
        assert "dynamiq/saved_fraction" in r["logged"], r["logged"]  # DynamiqCallback's log_dict
    assert a[0]["weights_sha256"] == a[1]["weights_sha256"], "replicas diverged"
    assert "dynamiq step 3: 1 bucket on 2 ranks" in out, out[-3000:]
    # resume with another --bits: the checkpoint's hook state (config, step, sequence number,
    # allocator state) replaces the fresh one, and the sequence continues where it stopped
    _launch([sys.executable, "examples/lightning_ddp.py", "--steps", "5", "--bits", "3", "--print-every", "0",
             "--resume", ckpt, "--out", tmp_path / "b"])
    b = _ranks(tmp_path / "b")
    for ra, rb in zip(a, b):
        assert rb["global_step"] == 5 and rb["totals"]["paths"] == {"compressed": 2}, rb
        assert rb["state"]["config"] == ra["state"]["config"] and rb["state"]["config"]["bits"] == 5.0
        assert rb["state"]["step"] == 5 and rb["state"]["seq"] == ra["state"]["seq"] + 2, (ra["state"], rb["state"])
    assert b[0]["weights_sha256"] == b[1]["weights_sha256"], "replicas diverged after resuming"


def test_accelerate_launch_with_prepared_model(tmp_path):
    out = _launch([BIN / "accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                   "--mixed_precision", "no", "--dynamo_backend", "no",
                   "--main_process_port", _free_port(),  # (its default, 29500, may be taken on a shared host)
                   "examples/accelerate_ddp.py", "--cpu",
                   "--steps", "4", "--print-every", "1", "--check-resume", "--out", tmp_path])
    res = _ranks(tmp_path)
    for r in res:
        # 4 steps, then steps 3-4 again after load_state: 6 buckets through the hook
        assert r["world"] == 2 and r["world_size"] == 2 and r["totals"]["paths"] == {"compressed": 6}, r
        assert r["reloaded_step"] == 2 and r["state"]["step"] == 4, r
        # the second pass after load_state repeats the first bit for bit: the hook's random
        # stream and allocator state were restored (not restored: other rounding, other weights)
        assert r["sha256"] == r["first_pass"]["sha256"] and r["state"] == r["first_pass"]["state"], r
    assert res[0]["sha256"] == res[1]["sha256"], "replicas diverged"
    assert "bit for bit the same weights" in out and "dynamiq step 4: " in out, out[-3000:]


def test_torchrun_example_with_tensorboard_scalars(tmp_path):
    tb = tmp_path / "tb"
    out = _launch([BIN / "torchrun", "--standalone", "--nproc_per_node", "2", "examples/torchrun_ddp.py",
                   "--steps", "3", "--print-every", "1", "--tensorboard", tb, "--out", tmp_path / "out"])
    res = _ranks(tmp_path / "out")
    for r in res:
        assert r["state"]["step"] == 3 and r["totals"]["paths"] == {"compressed": 3} and r["world_size"] == 2, r
    assert res[0]["sha256"] == res[1]["sha256"], "replicas diverged"
    assert "dynamiq step 3: " in out, out[-3000:]
    if importlib.util.find_spec("tensorboard") is None:  # the example trains on without it
        assert not res[0]["tensorboard"] and "tensorboard is not installed" in out
        return
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(tb))
    ea.Reload()
    sent = ea.Scalars("dynamiq/bytes_sent")
    assert [e.step for e in sent] == [1, 2, 3], sent
    # every step's bytes reached TensorBoard: they add up to rank 0's running total
    assert sum(e.value for e in sent) == res[0]["totals"]["bytes_sent"]
    assert {"dynamiq/saved_fraction", "dynamiq/t_wire_ms", "dynamiq/paths/compressed"} <= set(ea.Tags()["scalars"])


def test_fsdp2_example_lossless_equals_none_on_every_rank():
    """examples/fsdp2_train.py under torchrun: FSDP2 with dynamiq's reduce-scatter and lossless
    all-gather. Every rank ends with the same full parameters, and mode lossless ends bit for
    bit where mode none does (a hook never set, or one that altered a gradient, breaks one)."""
    digests = {}
    for mode in ("none", "lossless"):
        out = _launch([BIN / "torchrun", "--standalone", "--nproc_per_node", "2", "examples/fsdp2_train.py",
                       "--mode", mode, "--steps", "4", "--print-every", "4"])
        found = re.findall(r"rank (\d): parameters sha256 ([0-9a-f]{16})", out)
        assert sorted(r for r, _ in found) == ["0", "1"], out[-3000:]
        assert len({d for _, d in found}) == 1, f"replicas diverged in mode {mode}: {found}"
        assert re.search(r"reduce_scatter [1-9]\d* calls", out), out[-3000:]  # dynamiq's collectives ran
        digests[mode] = found[0][1]
    assert digests["lossless"] == digests["none"], digests
