"""Was the machine quiet? The load record every benchmark takes before and after its run.

A timing taken while other jobs share the CPUs understates whatever needs CPU (dynamiq's codec
more than the backend's copy), so every benchmark records, and prints, and stores in its output:

    load1_before, load1_after    the 1-minute load average (/proc/loadavg) just before the run and
                                 just after it (the "after" figure counts the run's own processes)
    others_before, others_after  the share of the machine's CPU time (all CPUs) that processes
                                 outside the benchmark's own process tree used in a short window
                                 (DYNAMIQ_LOAD_PROBE_S, default 1 s) before and after the run
    others_during                the same over the whole run
    own_cpu_s, seconds           the CPU time (user + system) of the benchmark's process tree, and
                                 the run's wall time

"Other processes' CPU time" = the busy time of /proc/stat's "cpu" line (user, nice, system, steal;
not irq/softirq, which the run's own network traffic causes) minus the CPU time of the process
tree rooted at the benchmark (utime + stime + cutime + cstime of every live process of the tree,
from /proc/<pid>/stat: children it has reaped are in their parent's cutime/cstime).

A run is "loaded" when load1_before > 0.75 x CPUs (1.5 on 2 CPUs, 12 on 16:
DYNAMIQ_LOADED_LOAD_PER_CPU), or when any of the three "others" shares is > 0.25 (other
processes used a quarter of the machine, half a core on 2 CPUs: DYNAMIQ_LOADED_OTHERS). The
threshold scales with the CPUs because the load average counts runnable tasks over all of them;
the share is already a fraction of all of them. load1_after is recorded, not classified: the
run's own ranks raise it (two busy ranks add about 2 on a run of a minute or more). A loaded run
is never quoted against a target (experiments/README.md).

Pure standard library, so that shell scripts without dynamiq installed run it as a file:

    python3 python/dynamiq/_load.py [--json PATH] [--label TEXT] -- COMMAND ARGS...

runs COMMAND, prints the record (two lines starting "# load") after its output, writes it as JSON
and exits with COMMAND's exit code. In Python:

    mon = LoadMonitor()            # takes the "before" readings (about DYNAMIQ_LOAD_PROBE_S)
    ...                            # the run
    rec = mon.finish()             # a dict: the fields above, "cpus", the thresholds, "loaded", "why"
    print(format_record(rec))
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Dict, List, Optional, Tuple

LOAD_PER_CPU = 0.75  # load1 above this x CPUs: loaded (1.5 on the 2-core guest)
OTHERS_MAX = 0.25  # other processes' share of all CPUs above this: loaded
PROBE_S = 1.0  # the window of the before/after "others" readings


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


# ---- /proc readings (proc: the directory, so that tests can hand in fake files) ----------------
def read_load1(proc: str = "/proc") -> float:
    """The 1-minute load average."""
    with open(os.path.join(proc, "loadavg")) as f:
        return float(f.read().split()[0])


def read_cpu(proc: str = "/proc") -> Tuple[int, int, int]:
    """(busy ticks, all ticks, CPUs) from /proc/stat: busy = user + nice + system + steal; all adds
    idle, iowait, irq and softirq (guest time is inside user already)."""
    busy = total = cpus = 0
    with open(os.path.join(proc, "stat")) as f:
        for line in f:
            if line.startswith("cpu "):
                v = [int(x) for x in line.split()[1:]] + [0] * 8
                user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
                busy = user + nice + system + steal
                total = busy + idle + iowait + irq + softirq
            elif line.startswith("cpu") and line[3:4].isdigit():
                cpus += 1
    return busy, total, max(cpus, 1)


def _stat_fields(proc: str, pid: str) -> Optional[List[str]]:
    """/proc/<pid>/stat's fields after the command name: [state, ppid, ..., utime (11), stime,
    cutime, cstime (14), ...]; None for a process that is gone."""
    try:
        with open(os.path.join(proc, pid, "stat")) as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def tree_ticks(root: int, proc: str = "/proc") -> int:
    """CPU ticks of the process tree rooted at `root`: utime + stime + cutime + cstime of every live
    process in it (a child it reaped is in its parent's cutime/cstime)."""
    fields: Dict[int, List[str]] = {}
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return 0
    for p in pids:
        f = _stat_fields(proc, p)
        if f is not None and len(f) >= 15:
            fields[int(p)] = f
    children: Dict[int, List[int]] = {}
    for pid, f in fields.items():
        children.setdefault(int(f[1]), []).append(pid)
    total, todo, seen = 0, [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in fields:
            continue
        seen.add(pid)
        f = fields[pid]
        total += int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])
        todo += children.get(pid, [])
    return total


class Snapshot:
    """The readings at one instant: wall clock, /proc/stat's busy and all ticks, the tree's ticks."""

    def __init__(self, root: int, proc: str = "/proc"):
        self.t = time.monotonic()
        self.busy, self.total, self.cpus = read_cpu(proc)
        self.tree = tree_ticks(root, proc)


def others_share(a: Snapshot, b: Snapshot) -> Optional[float]:
    """Share of all CPUs' time between a and b that processes outside the tree used (None: no ticks
    elapsed). Clamped at 0: a child reaped in the window brings CPU time it used before it."""
    total = b.total - a.total
    if total <= 0:
        return None
    return max(0.0, (b.busy - a.busy) - (b.tree - a.tree)) / total


# ---- classification --------------------------------------------------------------------------
def thresholds(cpus: int) -> Tuple[float, float]:
    """(load1 above which a run is loaded, others' share above which it is loaded) on `cpus` CPUs."""
    return (_env_float("DYNAMIQ_LOADED_LOAD_PER_CPU", LOAD_PER_CPU) * cpus,
            _env_float("DYNAMIQ_LOADED_OTHERS", OTHERS_MAX))


def classify(rec: dict) -> dict:
    """Adds "load1_max", "others_max", "loaded" and "why" (the readings over their threshold, in
    words) to a record with "cpus", "load1_before" and the "others_*" shares (None: not taken)."""
    load_max, others_max = thresholds(rec["cpus"])
    why = []
    if rec.get("load1_before") is not None and rec["load1_before"] > load_max:
        why.append(f"load average {rec['load1_before']:.2f} before the run > {load_max:g} "
                   f"({rec['cpus']} CPUs)")
    for when in ("before", "during", "after"):
        v = rec.get("others_" + when)
        if v is not None and v > others_max:
            why.append(f"other processes used {100 * v:.0f} % of the CPUs {when} the run "
                       f"> {100 * others_max:g} %")
    rec.update(load1_max=load_max, others_max=others_max, loaded=bool(why), why="; ".join(why))
    return rec


def _pct(v: Optional[float]) -> str:
    return "?" if v is None else f"{100 * v:.0f} %"


def format_record(rec: dict, prefix: str = "# ") -> str:
    """Two lines: the readings, then the verdict ("quiet" or "LOADED: why")."""
    la = rec.get("load1_after")
    line1 = (f"{prefix}load: 1-min load average {rec['load1_before']:.2f} before, "
             + ("?" if la is None else f"{la:.2f}") + f" after (the run's own processes included) on "
             f"{rec['cpus']} CPUs; other processes {_pct(rec.get('others_before'))} of the CPUs before, "
             f"{_pct(rec.get('others_during'))} during, {_pct(rec.get('others_after'))} after; "
             f"this run {rec.get('own_cpu_s', 0):.1f} s CPU in {rec.get('seconds', 0):.1f} s")
    verdict = ("LOADED: " + rec["why"]) if rec["loaded"] else (
        f"quiet (loaded above load {rec['load1_max']:g} or others {100 * rec['others_max']:g} %)")
    return line1 + "\n" + f"{prefix}load verdict: {verdict}"


def summary(rec: dict) -> str:
    """One short phrase for a table or a README header: 'load 0.42 -> 1.95, others 3/5/1 %, quiet'."""
    o = "/".join("?" if rec.get("others_" + w) is None else f"{100 * rec['others_' + w]:.0f}"
                 for w in ("before", "during", "after"))
    la = rec.get("load1_after")
    return (f"load {rec['load1_before']:.2f} -> {'?' if la is None else format(la, '.2f')} on {rec['cpus']} CPUs, "
            f"others {o} %, " + ("LOADED" if rec["loaded"] else "quiet"))


class LoadMonitor:
    """The readings around one run. root: the process tree that is the run (default this process;
    under torchrun, the agent: os.getppid()). probe_s: the before/after windows (0: none)."""

    def __init__(self, root: Optional[int] = None, proc: str = "/proc", probe_s: Optional[float] = None):
        self.root = os.getpid() if root is None else root
        self.proc = proc
        self.probe_s = _env_float("DYNAMIQ_LOAD_PROBE_S", PROBE_S) if probe_s is None else probe_s
        self.rec: dict = {}
        try:
            self.rec["load1_before"] = read_load1(proc)
            self.rec["others_before"] = self._probe()
            self.start = Snapshot(self.root, proc)
        except (OSError, ValueError, IndexError):  # no /proc (not Linux): record what there is
            self.start = None
            self.rec.setdefault("load1_before", os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0)

    def _probe(self) -> Optional[float]:
        if self.probe_s <= 0:
            return None
        a = Snapshot(self.root, self.proc)
        time.sleep(self.probe_s)
        return others_share(a, Snapshot(self.root, self.proc))

    def finish(self) -> dict:
        """The record (classified); callable once."""
        rec = dict(self.rec, cpus=os.cpu_count() or 1, others_during=None, others_after=None,
                   own_cpu_s=0.0, seconds=0.0, load1_after=None)
        if self.start is not None:
            try:
                end = Snapshot(self.root, self.proc)
                rec.update(cpus=end.cpus, others_during=others_share(self.start, end),
                           own_cpu_s=(end.tree - self.start.tree) / os.sysconf("SC_CLK_TCK"),
                           seconds=end.t - self.start.t, load1_after=read_load1(self.proc),
                           others_after=self._probe())
            except (OSError, ValueError, IndexError):
                pass
        for k in ("load1_before", "load1_after", "others_before", "others_during", "others_after"):
            if rec.get(k) is not None:
                rec[k] = round(rec[k], 4)
        rec["own_cpu_s"], rec["seconds"] = round(rec["own_cpu_s"], 2), round(rec["seconds"], 2)
        return classify(rec)


def torchrun_root() -> Optional[int]:
    """Under torchrun the agent (this process's parent) is the root of every local rank's tree."""
    return os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else None


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: python3 python/dynamiq/_load.py [--json PATH] [--label TEXT] -- COMMAND ARGS..."
    out = label = None
    while argv and argv[0] != "--":
        opt = argv.pop(0)
        if opt in ("--json", "--label") and argv:
            val = argv.pop(0)
            out, label = (val, label) if opt == "--json" else (out, val)
        else:
            print(usage, file=sys.stderr)
            return 2
    if len(argv) < 2:
        print(usage, file=sys.stderr)
        return 2
    mon = LoadMonitor()
    sys.stdout.flush()
    rc = subprocess.call(argv[1:])
    rec = mon.finish()
    rec.update(command=argv[1:], exit_code=rc, **({"label": label} if label else {}))
    print(format_record(rec), flush=True)
    if out:
        with open(out, "w") as f:
            json.dump(rec, f, indent=1)
            f.write("\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
