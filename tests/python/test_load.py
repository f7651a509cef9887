"""The load record of every benchmark (python/dynamiq/_load.py) on fake /proc readings, and the
places that store it: results_io (every experiments/ script), its text parts (the C++ benchmarks)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from dynamiq import _load  # noqa: E402
from experiments import results_io  # noqa: E402


def fake_proc(root, load1=0.5, cpu=(0, 0, 0, 0), cpus=2, procs=()):
    """A /proc with loadavg, stat (cpu line: user, nice, system, idle, then iowait, irq, softirq,
    steal, guest as given) and <pid>/stat for (pid, ppid, utime, stime, cutime, cstime, comm)."""
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "loadavg"), "w") as f:
        f.write(f"{load1} 0.40 0.30 2/300 12345\n")
    fields = list(cpu) + [0] * (10 - len(cpu))
    with open(os.path.join(root, "stat"), "w") as f:
        f.write("cpu  " + " ".join(map(str, fields)) + "\n")
        for i in range(cpus):
            f.write(f"cpu{i} 1 2 3 4 5 6 7 8 0 0\n")
        f.write("intr 12345\nctxt 999\n")
    for pid, ppid, ut, st, cut, cst, comm in procs:
        os.makedirs(os.path.join(root, str(pid)), exist_ok=True)
        rest = ["S", ppid] + [0] * 9 + [ut, st, cut, cst] + [20, 0, 1, 0, 100]
        with open(os.path.join(root, str(pid), "stat"), "w") as f:
            f.write(f"{pid} ({comm}) " + " ".join(map(str, rest)) + "\n")
    return str(root)


TREE = [(100, 1, 10, 5, 0, 0, "python"), (101, 100, 200, 20, 0, 0, "rank (0) x"),
        (102, 101, 30, 3, 7, 1, "ip netns)"), (200, 1, 5000, 500, 0, 0, "cc1plus")]


def test_tree_ticks_sums_the_tree_only(tmp_path):
    proc = fake_proc(tmp_path, procs=TREE)
    # 100 + its child 101 + grandchild 102 (with what 102 reaped); not 200, nor names with ") "
    assert _load.tree_ticks(100, proc) == 15 + 220 + 41
    assert _load.tree_ticks(101, proc) == 220 + 41
    assert _load.tree_ticks(999, proc) == 0


def test_cpu_line_busy_excludes_idle_iowait_and_interrupts(tmp_path):
    # user nice system idle iowait irq softirq steal guest: guest is inside user already
    proc = fake_proc(tmp_path, cpu=(100, 10, 40, 800, 30, 5, 7, 8, 50), cpus=4)
    busy, total, cpus = _load.read_cpu(proc)
    assert (busy, total, cpus) == (100 + 10 + 40 + 8, 100 + 10 + 40 + 8 + 800 + 30 + 5 + 7, 4)


def test_others_share_is_busy_time_less_the_tree(tmp_path):
    a = fake_proc(tmp_path / "a", cpu=(1000, 0, 0, 1000), procs=TREE)
    # 400 ticks pass on the machine: 300 busy, of which the tree used 220 (101 grew by 200, 100 by 20)
    tree_b = [(100, 1, 30, 5, 0, 0, "python"), (101, 100, 400, 20, 0, 0, "rank (0) x")] + TREE[2:]
    b = fake_proc(tmp_path / "b", cpu=(1300, 0, 0, 1100), procs=tree_b)
    sa, sb = _load.Snapshot(100, a), _load.Snapshot(100, b)
    assert _load.others_share(sa, sb) == pytest.approx((300 - 220) / 400)
    assert _load.others_share(sa, sa) is None  # no time passed
    # a reaped child brings CPU time from before the window: never below 0
    tree_c = [(100, 1, 30, 5, 2000, 0, "python")] + TREE[1:]
    assert _load.others_share(sa, _load.Snapshot(100, fake_proc(tmp_path / "c", cpu=(1300, 0, 0, 1100),
                                                                  procs=tree_c))) == 0.0


@pytest.mark.parametrize("cpus, load1, others, loaded", [
    (2, 1.49, 0.10, False), (2, 1.51, 0.10, True),    # 1.5 on 2 CPUs
    (16, 11.9, 0.10, False), (16, 12.1, 0.10, True),  # 0.75 x CPUs: 12 on 16
    (2, 0.20, 0.24, False), (2, 0.20, 0.26, True),    # a quarter of the machine to others
    (1, 0.74, None, False), (1, 0.76, None, True),    # shares not taken: the load alone decides
])
def test_classify_thresholds_scale_with_cpus(cpus, load1, others, loaded, monkeypatch):
    monkeypatch.delenv("DYNAMIQ_LOADED_LOAD_PER_CPU", raising=False)
    monkeypatch.delenv("DYNAMIQ_LOADED_OTHERS", raising=False)
    rec = _load.classify(dict(cpus=cpus, load1_before=load1, load1_after=99.0, others_before=None,
                              others_during=others, others_after=None))
    assert rec["loaded"] is loaded and rec["load1_max"] == pytest.approx(0.75 * cpus)
    assert bool(rec["why"]) is loaded
    if others is not None and others > 0.25:
        assert "during the run" in rec["why"]
    # the load after the run counts the run itself: recorded, never the reason
    assert "99" not in rec["why"]


def test_thresholds_from_the_environment(monkeypatch):
    monkeypatch.setenv("DYNAMIQ_LOADED_LOAD_PER_CPU", "2")
    monkeypatch.setenv("DYNAMIQ_LOADED_OTHERS", "0.5")
    assert _load.thresholds(4) == (8.0, 0.5)
    assert not _load.classify(dict(cpus=4, load1_before=7.9, others_during=0.49))["loaded"]


def test_monitor_over_a_run_on_fake_proc(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "getpid", lambda: 100)
    proc = fake_proc(tmp_path, load1=0.3, cpu=(1000, 0, 0, 1000), procs=TREE)
    mon = _load.LoadMonitor(proc=proc, probe_s=0)
    # the run: 1000 ticks on 2 CPUs, 700 busy, the tree used 600 of them; the load rose to 1.9
    for gone in ("101", "102"):
        shutil.rmtree(os.path.join(proc, gone))
    fake_proc(tmp_path, load1=1.9, cpu=(1700, 0, 0, 1300),
              procs=[(100, 1, 10, 5, 861, 0, "python")] + TREE[3:])  # 101, 102 reaped: 876 - 276
    rec = mon.finish()
    assert rec["cpus"] == 2 and rec["load1_before"] == 0.3 and rec["load1_after"] == 1.9
    assert rec["others_during"] == pytest.approx(0.1) and rec["others_before"] is None
    assert rec["own_cpu_s"] == pytest.approx(600 / os.sysconf("SC_CLK_TCK"), abs=0.01)
    assert rec["loaded"] is False  # the load after is the run's own
    text = _load.format_record(rec)
    assert "0.30 before, 1.90 after" in text and "10 % during" in text and "quiet" in text


def test_wrapper_runs_the_command_and_writes_the_record(tmp_path):
    out = tmp_path / "load.json"
    r = subprocess.run([sys.executable, os.path.join(REPO, "python", "dynamiq", "_load.py"), "--json", str(out),
                        "--label", "x", "--", sys.executable, "-c", "print('hi'); raise SystemExit(3)"],
                       capture_output=True, text=True, env=dict(os.environ, DYNAMIQ_LOAD_PROBE_S="0.05"))
    assert r.returncode == 3 and r.stdout.startswith("hi\n# load: 1-min load average ")
    assert "# load verdict: " in r.stdout
    rec = json.loads(out.read_text())
    assert rec["exit_code"] == 3 and rec["label"] == "x" and rec["command"][-1].startswith("print")
    for k in ("load1_before", "load1_after", "others_before", "others_during", "others_after", "cpus",
              "loaded", "why", "load1_max", "others_max", "own_cpu_s", "seconds"):
        assert k in rec, k


def test_results_io_stores_the_record(tmp_path, monkeypatch):
    # what every experiments/ script writes through results_io.Run: run.load in the JSON, the
    # summary in the README's header and the part's command line, loaded runs marked
    monkeypatch.setenv("DYNAMIQ_LOAD_PROBE_S", "0")
    monkeypatch.setenv("DYNAMIQ_LOADED_LOAD_PER_CPU", "-1")  # every run loaded
    run = results_io.Run("s", "T", command="cmd", out=str(tmp_path))
    readme = open(run.write("p", "body", data={"rows": []})).read()
    rec = json.loads((tmp_path / "p.json").read_text())["run"]["load"]
    assert rec["loaded"] is True and "load average" in rec["why"] and rec["cpus"] >= 1
    header = readme.splitlines()[2]
    assert header.startswith("Command: `cmd`") and " · Load: load " in header and header.endswith("LOADED")
    assert "**Loaded run**" in readme


def test_results_io_text_part_takes_the_wrappers_record(tmp_path):
    # the C++ benchmarks: scripts/experiment.sh runs each under _load.py, FILE.load.json beside FILE
    txt = tmp_path / "k.txt"
    txt.write_text("op 1 2 3\n")
    rec = _load.classify(dict(cpus=2, load1_before=0.1, load1_after=1.0, others_before=0.0, others_during=0.05,
                              others_after=0.0, own_cpu_s=3.0, seconds=4.0))
    (tmp_path / "k.txt.load.json").write_text(json.dumps(rec))
    results_io.main(["kernels", "K", "--command", "c", "--part", "bench_kernels", str(txt), "--out",
                     str(tmp_path / "out")])
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "Load: load 0.10 -> 1.00 on 2 CPUs, others 0/5/0 %, quiet" in readme


# Scripts that time something without a results_io.Run of their own, and who records their load.
NOT_RUN_BY_RESULTS_IO = {
    "probes/probe_split.py": "run under the netbed launcher (python -m experiments.netbed), which records it",
    "probes/probe_messages.py": "run under the netbed launcher",
    "probes/probe_latency.py": "run under the netbed launcher",
    "probes/chaos_train.py": "the training script of probes/chaos.py, whose Run records it",
    "studies/llm_grads.py": "makes the gradient caches of vnmse_equal_bits.py; times nothing it reports",
    "netbed/probe_p2p.py": "run by netbed/measure.py, whose Run records it",
    "netbed/probe_allreduce.py": "run by netbed/measure.py",
    "netbed/probe_tcp.py": "run by netbed/measure.py",
    "netbed/launch.py": "the launcher: records the load of what it runs (printed, --load-json)",
}


def test_every_timing_script_records_the_load():
    missing = []
    for sub in ("bench", "studies", "probes", "netbed"):
        folder = os.path.join(REPO, "experiments", sub)
        for name in sorted(os.listdir(folder)):
            text = open(os.path.join(folder, name)).read() if name.endswith(".py") else ""
            times = any(t in text for t in ("perf_counter", "time.time()", "monotonic"))
            if "__main__" in text and times and "results_io.Run(" not in text:
                if f"{sub}/{name}" not in NOT_RUN_BY_RESULTS_IO:
                    missing.append(f"{sub}/{name}")
    assert not missing, f"timing scripts that record no load (use experiments/results_io.Run): {missing}"
    launch = open(os.path.join(REPO, "experiments", "netbed", "launch.py")).read()
    assert "LoadMonitor()" in launch and "--load-json" in launch
