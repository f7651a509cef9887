"""scripts/ab.sh and scripts/ab.py: the rows of each bench's JSON, the ratios B/A per round with their
spread, the alternation of the order, the load verdicts and the exit codes (no build: --dry-run)."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import ab  # noqa: E402

# A bench that writes a row with time t and one with 2t, t counting its calls (1, 2, 3, ...), and
# with FAKE_FAIL a row that fails; {out} must have been replaced by the run's directory.
FAKE = r"""
import json, os, sys
counter, out = sys.argv[1], sys.argv[2]
n = int(open(counter).read()) + 1 if os.path.exists(counter) else 1
open(counter, "w").write(str(n))
rows = [dict(method="m1", world=2, bytes=64, dtype="float32", median=float(n)),
        dict(method="m2", world=2, bytes=64, dtype="float32", median=2.0 * n)]
if os.environ.get("FAKE_FAIL"):
    rows.append(dict(method="m3", world=2, bytes=64, dtype="float32", median=float("nan"), error="boom"))
json.dump(dict(run={}, rows=rows), open(os.path.join(out, "p.json"), "w"))
"""


def quiet_env(**kw):
    env = dict(os.environ, DYNAMIQ_LOAD_PROBE_S="0", DYNAMIQ_LOADED_LOAD_PER_CPU="1e9", DYNAMIQ_LOADED_OTHERS="2")
    env.update(kw)
    return env


def run_ab(tmp_path, *opts, env=None):
    fake = tmp_path / "fake.py"
    fake.write_text(FAKE)
    runs = tmp_path / "runs"
    r = subprocess.run(["bash", os.path.join(REPO, "scripts", "ab.sh"), "--dry-run", *opts, "HEAD", "--",
                        "python3", str(fake), str(tmp_path / "counter"), "{out}"],
                       capture_output=True, text=True, timeout=300,
                       env=dict(env or quiet_env(), AB_RUNS=str(runs), AB_DIR=str(tmp_path / "ab")))
    return r, runs


def test_rounds_alternate_and_ratios_are_per_round(tmp_path):
    r, runs = run_ab(tmp_path, "--rounds", "3", env=quiet_env(FAKE_FAIL="1"))
    # calls: r1 A=1, r1 B=2, r2 B=3, r2 A=4, r3 A=5, r3 B=6: ratios 2, 0.75, 1.2
    assert (runs / "ORDER").read_text().split() == ["r1_A", "r1_B", "r2_B", "r2_A", "r3_A", "r3_B"]
    lines = {ln.split()[0]: ln.split() for ln in r.stdout.splitlines() if ln.startswith("m")}
    assert lines["m1"][-4:] == ["4.000000", "3.000000", "1.200", "0.750..2.000"], r.stdout
    assert lines["m2"][-4:] == ["8.000000", "6.000000", "1.200", "0.750..2.000"], r.stdout
    assert "failed or missing in every round" in " ".join(lines["m3"])
    assert r.returncode == 1, r.stdout + r.stderr  # the failed row
    assert r.stdout.count("quiet") >= 6 and "LOADED" not in r.stdout
    for d in ("r1_A", "r2_B", "r3_B"):
        rec = json.loads((runs / d / "load.json").read_text())
        assert rec["exit_code"] == 0 and rec["label"] == f"round {d[1]} {d[3]}"


def test_loaded_runs_fail_unless_allowed(tmp_path):
    always = quiet_env(DYNAMIQ_LOADED_LOAD_PER_CPU="-1")
    for allow, want in (((), 3), (("--allow-loaded",), 0)):
        (tmp_path / str(want)).mkdir()
        r, runs = run_ab(tmp_path / str(want), "--rounds", "1", *allow, env=always)
        assert r.returncode == want, r.stdout + r.stderr
        assert "2 of 2 runs LOADED" in r.stdout and "load average" in r.stdout  # the reason, per run
        assert "1.000  1.000..1.000" not in r.stdout and " 2.000  2.000..2.000" in r.stdout  # r1: B=2, A=1


def test_bad_usage_exits_2(tmp_path):
    for argv in (["HEAD"], ["HEAD", "--"], ["--rounds", "0", "HEAD", "--", "x", "{out}"],
                 ["no-such-commit-xyz", "--", "x", "{out}"], ["HEAD", "--", "python3", "bench_without_out.py"]):
        r = subprocess.run(["bash", os.path.join(REPO, "scripts", "ab.sh"), "--dry-run", *argv],
                           capture_output=True, text=True, timeout=60, env=quiet_env(AB_DIR=str(tmp_path)))
        assert r.returncode == 2, (argv, r.stderr)


def test_row_keys_of_each_bench():
    # dynamiq.bench rows (mode, its parameter, topology, size) and experiments/bench rows (method, world, bytes)
    assert ab.row_key(dict(collective="allreduce", mode="dynamiq", bits=5.0, topology="ring", world=2, size=1024,
                           dtype="float32", time=1.0)) == "allreduce dynamiq 5 ring w2 1024 float32"
    assert ab.row_key(dict(collective="allreduce", mode="bounded", error_bound=1e-5, topology="ring", world=2,
                           size=8, dtype="float32")) == "allreduce bounded 1e-05 ring w2 8 float32"
    assert ab.row_key(dict(method="dynamiq:ring:5", world=4, bytes=64, dtype="float32", median=2.0)) == \
        "dynamiq:ring:5 w4 64 float32"


def test_rows_of_a_dynamiq_bench_json(tmp_path):
    (tmp_path / "bench.json").write_text(json.dumps({"tool": "x", "load": {"loaded": False}, "rows": [
        dict(collective="allreduce", mode="gloo", bits=None, topology=None, world=2, size=64, dtype="float32",
             time=0.5, error=None),
        dict(collective="allreduce", mode="none", bits=None, topology="ring", world=2, size=64, dtype="float32",
             time=None, error="DynamiqError: x")]}))
    (tmp_path / "load.json").write_text(json.dumps({"rows": [dict(method="not a row", median=1.0)]}))
    assert ab.run_rows(str(tmp_path)) == {"allreduce gloo w2 64 float32": 0.5,
                                          "allreduce none ring w2 64 float32": None}


@pytest.mark.parametrize("a, b, ratio", [([1.0, 2.0], [1.0, 1.0], "0.750"), ([2.0, 2.0], [3.0, 1.0], "1.000")])
def test_report_median_and_spread(tmp_path, a, b, ratio):
    for i, (ta, tb) in enumerate(zip(a, b), 1):
        for side, t in (("A", ta), ("B", tb)):
            d = tmp_path / f"r{i}_{side}"
            d.mkdir()
            (d / "x.json").write_text(json.dumps({"rows": [dict(method="m", world=2, bytes=8, median=t)]}))
            (d / "load.json").write_text(json.dumps(dict(load1_before=0.1, load1_after=0.2, loaded=False,
                                                         exit_code=0, seconds=1.0)))
    out = []

    class W:
        def write(self, s):
            out.append(s)

    assert ab.report(str(tmp_path), out=W()) == 0
    row = next(ln for ln in "".join(out).splitlines() if ln.startswith("m "))
    ratios = [y / x for x, y in zip(a, b)]
    assert row.split()[-2:] == [ratio, f"{min(ratios):.3f}..{max(ratios):.3f}"]
