"""`python -m dynamiq.bench`: refuses bad input cleanly, and a --local run reports every row it was asked for."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from dynamiq import bench


def _cli(*argv, timeout=180, cwd=None):
    return subprocess.run([sys.executable, "-m", "dynamiq.bench", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


@pytest.mark.parametrize("argv, needle", [
    (["--modes", "none,fancy"], "unknown mode 'fancy'"),
    (["--sizes", "1M,12Q"], "bad size '12Q'"),
])
def test_cli_bad_input_one_line_exit_2(argv, needle, tmp_path):
    r = _cli(*argv, "--json", str(tmp_path / "x.json"), timeout=60)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("python -m dynamiq.bench: error: ") and needle in lines[0], lines[0]
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("argv, needle", [
    (["--sizes", "6"], "not a whole number of float32 elements"),
    (["--sizes", "0"], "bad size '0'"),
    (["--sizes", "1M,,2M"], "an empty entry"),
    (["--sizes", "3", "--dtype", "bfloat16"], "not a whole number of bfloat16 elements"),
    (["--modes", "dynamiq:2"], "bits=2 is below the 2.5625 bits"),  # the budget floor, default widths
    (["--modes", "bitsplit:9"], "bits=9.0 is invalid"),
    (["--modes", "dynamiq:five"], "'five' is not a number"),
    (["--modes", "lossless:4"], "lossless takes no parameter"),
    (["--topologies", "ring,mesh"], "unknown topology 'mesh'"),  # (star is a test-only topology, registered in dev builds)
    # what the group would refuse at the first collective (issue 44: ran 43 s, failed 18 of 21 rows)
    (["--topologies", "hierarchical"], "needs the ranks per node: Config(local_size=k) or torchrun's LOCAL_WORLD_SIZE "
                                       "(got 0) (--config local_size=K); the topologies it runs on here: ring, "
                                       "butterfly, twostep"),
    (["--local", "4", "--topologies", "ring,hierarchical", "--config", "local_size=3"],
     "local_size=3 does not divide the world of 4 ranks"),
    (["--collectives", "alltoall"], "unknown collective 'alltoall'"),
    (["--config", "bogus=1"], "bad --config 'bogus=1'"),
    (["--config", "block_bytes=5"], "block_bytes=5 is invalid"),
    (["--local", "1"], "--local 1"),
    (["--iters", "0"], "--iters >= 1"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
])
def test_bad_input_refused_before_any_process_starts(argv, needle, capsys):
    assert bench.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and needle in err, err


def test_hierarchical_runs_where_the_group_can(monkeypatch):
    from dynamiq.config import Config, run_problem

    # the bench asks the config module, which asks the C++ driver: what the up-front check lets
    # through is what runs (local_size given, or torchrun's LOCAL_WORLD_SIZE)
    args = bench.parse_args(["--local", "4", "--topologies", "hierarchical", "--config", "local_size=2"])
    assert args.topology_list == ["hierarchical"]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert bench.parse_args(["--topologies", "hierarchical"]).topology_list == ["hierarchical"]
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert "needs the ranks per node" in run_problem(Config(topology="hierarchical"), 4)
    assert run_problem(Config(topology="hierarchical", local_size=2), 4) == ""
    assert "all-reduces only" in run_problem(Config(topology="hierarchical", local_size=2), 4, "reduce_scatter")
    assert "all-reduces only" in run_problem(Config(mode="auto"), 4, "all_gather")
    assert run_problem(Config(mode="auto"), 4) == "" and run_problem(Config(topology="twostep"), 3) == ""


def test_sizes_parse_like_nccl_tests():
    assert bench.parse_sizes("1M,64K,4096,1G,2MiB,2MB", "float32") == [4096, 1 << 16, 1 << 20, 2 << 20, 1 << 30]


def test_gradient_like_data_sums_exactly_in_any_order():
    # The exact rows' vNMSE 0 rests on this: any order of float32/bf16 additions over the ranks is exact.
    for dtype, world in (("float32", 4), ("bfloat16", 3), ("float16", 2)):
        xs = [bench.gradient_like(1 << 18, r, world, dtype, seed=1) for r in range(world)]
        exact = sum(x.double() for x in xs)
        fwd, bwd = xs[0].clone(), xs[-1].clone()
        for x in xs[1:]:
            fwd += x
        for x in reversed(xs[:-1]):
            bwd += x
        assert torch.equal(fwd.double(), exact) and torch.equal(bwd.double(), exact), dtype
        assert not torch.equal(xs[0], xs[1])


def test_gradient_like_data_has_layer_scales_and_heavy_tails():
    x0, x1 = (bench.gradient_like(1 << 21, r, 2, "float32", seed=0).double() for r in range(2))
    rms = x0.view(-1, 1024).square().mean(1).sqrt()
    assert rms.max() / rms.min() > 100  # layer scales over decades
    kurtosis = (x0.view(-1, 1024) / rms[:, None]).pow(4).mean()
    assert kurtosis > 4  # a normal's is 3
    assert 0.02 < torch.corrcoef(torch.stack([x0, x1]))[0, 1] < 0.5  # ranks correlated, not equal


def test_local_run_reports_every_row(tmp_path):
    out, png = tmp_path / "b.json", tmp_path / "b.png"
    modes = ["none", "dynamiq:4", "lossless", "bitsplit:4"]
    topos = ["ring", "butterfly"]
    sizes = [64 << 10, 256 << 10]
    r = _cli("--local", "2", "--sizes", "64K,256K", "--modes", ",".join(modes), "--topologies", ",".join(topos),
             "--warmup", "1", "--iters", "2", "--json", str(out), "--plot", str(png), cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(out.read_text())
    assert data["world"] == 2 and data["backend"] == "gloo" and data["iters"] == 2
    rows = data["rows"]
    got = {(x["size"], x["mode"] if x["bits"] is None else f"{x['mode']}:{x['bits']:g}", x["topology"])
           for x in rows}
    want = {(s, m, t) for s in sizes for m in modes for t in topos} | {(s, "gloo", None) for s in sizes}
    assert got == want and len(rows) == len(want)
    by = {}
    for x in rows:
        assert x["error"] is None and x["ranks_identical"] is True, x
        assert len(x["times"]) == 2 and math.isclose(x["time"], sum(x["times"]) / 2)  # the median of 2
        assert x["count"] * 4 == x["size"] and x["busbw"] > 0
        by[(x["size"], x["mode"], x["topology"])] = x
        if x["mode"] in ("gloo", "none", "lossless"):
            assert x["vnmse"] == 0, x  # exact: bit for bit the float64 sum
        else:
            assert 0 < x["vnmse"] < 0.5, x  # lossy, and not garbage
    for x in rows:
        base = by[(x["size"], "gloo", None)]
        assert math.isclose(x["speedup"], base["time"] / x["time"], rel_tol=1e-9)
        if x["mode"] in ("dynamiq", "bitsplit"):
            assert x["path"] == "compressed" and x["wire_ratio"] < 0.25, x  # 4-5 bits of 32 went on the wire
        if x["mode"] == "none":
            assert x["wire_ratio"] >= 1.0, x
    # one table line per row, printed as the rows finish (the progress), in the nccl-tests style
    table = [ln for ln in r.stdout.splitlines() if ln.strip() and not ln.startswith("#")]
    assert len(table) == len(rows)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    # the machine's load around the run (python/dynamiq/_load.py), printed and stored
    load = data["load"]
    for k in ("load1_before", "load1_after", "others_before", "others_during", "others_after", "cpus", "loaded",
              "why", "load1_max", "others_max"):
        assert k in load, k
    assert load["own_cpu_s"] > 0 and load["seconds"] > 0  # the ranks are the tool's own tree
    assert "# load: 1-min load average" in r.stdout and "# load verdict: " in r.stdout
