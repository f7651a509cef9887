"""The examples as users launch them: Lightning's DDPStrategy, `accelerate launch`, torchrun.

Each runs 2 CPU processes on Gloo for a few steps of a tiny model and writes one JSON per
rank; the tests check that dynamiq's hook ran on every step (its totals), that the
replicas ended bit for bit equal, and that the hook's state went through each
framework's checkpoints (Lightning: restored on resume; Accelerate: a reloaded second
half repeats the first bit for bit). Versions: docs/integrations.md.
"""

import json
import os
import signal
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
