"""Where a study's result goes: experiments/results/<study>/README.md, its raw JSON and its plot.

A study folder holds the latest run only (git history keeps the older ones):

    README.md     # title, ONE header line (command, machine, date, commit), notes, one section per part
    <part>.json   # raw data of each part, with the same header fields under "run"
    <part>.png    # the part's plot, if it has one (written by the script into the folder)

Most studies have one part, named after the study (results/train/train.json). A study run as several
commands (`bash scripts/experiment.sh netbed` runs bench_allreduce.py five times) writes one part per
command; each part's section starts with its own command, date and commit, so a part re-run alone
says so. The header line names the command of the whole run: `scripts/experiment.sh` exports it as
DYNAMIQ_EXPERIMENT; otherwise it is the script's own command.

Text between the header line and the first part is hand-written notes (what the numbers mean): a new
run keeps it. Notes begin with `<!-- notes-for: <date> <commit> -->`; when a later run has another
commit or date, the helper adds a line saying the notes were written for the earlier run.

Used by the scripts in bench/ and studies/:

    from experiments import results_io
    run = results_io.Run("vnmse", "vNMSE on real gradients", argv=sys.argv[1:], script=__file__, out=args.out)
    ...                                   # measure (run.path("vnmse.png") is where a plot goes)
    run.write("vnmse", markdown, data=payload, plot="vnmse.png")

and from the shell for programs that print text (the C++ benchmarks):

    python experiments/results_io.py kernels "CPU kernels against memcpy" --command "..." \\
        --part bench_kernels experiments/out/kernels.txt "build/bench/bench_kernels" [--part ...]

Pass `--out experiments/out/<name>` to a script for a scratch run that leaves results/ alone.

Every run records the machine's load (python/dynamiq/_load.py): `Run()` takes the "before" readings,
each `write()` the rest; the record goes into <part>.json under run.load, its summary into the README's
header line and the part's command line, and a run over the thresholds is marked LOADED there. The text
parts of the C++ benchmarks take theirs from FILE.load.json, written by the wrapper that ran them
(`python3 python/dynamiq/_load.py --json FILE.load.json -- build/bench/...`; scripts/experiment.sh).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from typing import List, Optional

EXPERIMENTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(EXPERIMENTS)
RESULTS = os.path.join(EXPERIMENTS, "results")

_PART = re.compile(r"<!-- part (\S+) -->\n.*?<!-- /part \1 -->\n", re.S)
_NOTES_FOR = re.compile(r"<!-- notes-for: (.*?) -->")
_STALE = "_These notes were written for the run of "


def _import_load():
    """python/dynamiq/_load.py by its path: standard library only, while importing the dynamiq
    package would load torch and the extension."""
    spec = importlib.util.spec_from_file_location("dynamiq_load", os.path.join(REPO, "python", "dynamiq", "_load.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


load = _import_load()


def machine() -> str:
    """'AMD EPYC (family 25 model 17, AVX-512), 2 CPUs, 24 GiB, no GPU' from /proc/cpuinfo and friends."""
    info = {}
    try:
        for line in open("/proc/cpuinfo"):
            k, _, v = line.partition(":")
            k = k.strip()
            if k in ("model name", "cpu family", "model", "flags", "Features") and k not in info:
                info[k] = v.strip()
    except OSError:
        pass
    name = info.get("model name") or platform.processor() or platform.machine()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    if "avx512f" in flags:
        isa = "AVX-512"
    elif "avx2" in flags:
        isa = "AVX2, no AVX-512"
    elif "sve" in flags:
        isa = "SVE"
    elif "asimd" in flags:
        isa = "NEON"
    else:
        isa = platform.machine()
    family = (f"family {info['cpu family']} model {info['model']}, "
              if "cpu family" in info and "model" in info else "")
    mem = ""
    try:
        kb = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal:"))
        mem = f", {kb / 2 ** 20:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    gpu = "no GPU"
    if shutil.which("nvidia-smi"):
        try:
            names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                   capture_output=True, text=True, timeout=20).stdout.split("\n")
            names = [n.strip() for n in names if n.strip()]
            if names:
                gpu = f"{len(names)} x {names[0]}"
        except (OSError, subprocess.SubprocessError):
            pass
    return f"{name} ({family}{isa}), {os.cpu_count()} CPUs{mem}, {gpu}"


def commit() -> str:
    """`git rev-parse --short HEAD`, marked when code (not results or Markdown) has uncommitted changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=REPO).stdout.strip() or "?"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":!experiments/results", ":!*.md"], capture_output=True, text=True,
                               cwd=REPO).stdout.strip()
    except OSError:
        return "?"
    return head + (" + uncommitted changes" if dirty else "")


def when(started: Optional[float] = None, ended: Optional[float] = None) -> str:
    """'2026-11-24 15:46-15:52 UTC' (start-end of the run) or '2026-11-24 15:46 UTC'."""
    end = _dt.datetime.fromtimestamp(ended if ended is not None else time.time(), _dt.timezone.utc)
    if started is None:
        return end.strftime("%Y-%m-%d %H:%M UTC")
    start = _dt.datetime.fromtimestamp(started, _dt.timezone.utc)
    if start.strftime("%H:%M") == end.strftime("%H:%M"):
        return end.strftime("%Y-%m-%d %H:%M UTC")
    fmt = "%H:%M" if start.date() == end.date() else "%Y-%m-%d %H:%M"
    return start.strftime("%Y-%m-%d %H:%M") + "-" + end.strftime(fmt) + " UTC"


def header_line(command: str, machine_: str, date: str, commit_: str, load_: Optional[dict] = None) -> str:
    """The one header line every results README starts with (also used for results converted by hand)."""
    return (f"Command: `{command}` · Machine: {machine_} · Date: {date} · Commit: {commit_}"
            + (f" · Load: {load.summary(load_)}" if load_ else ""))


def script_command(script: str, argv: List[str]) -> str:
    """'python experiments/studies/train.py --steps 50' for this script and its arguments."""
    rel = os.path.relpath(os.path.abspath(script), REPO)
    return " ".join(["python", rel] + list(argv))


class Run:
    """One run of a study: where its files go and how its README is written."""

    def __init__(self, study: str, title: str, *, command: Optional[str] = None, script: Optional[str] = None,
                 argv: Optional[List[str]] = None, out: Optional[str] = None, measure_load: bool = True):
        self.study = study
        self.title = title
        self.command = command or script_command(script, sys.argv[1:] if argv is None else argv)
        self.dir = os.path.abspath(out) if out else os.path.join(RESULTS, study)
        self.started = time.time()
        self.machine = machine()
        self.commit = commit()
        os.makedirs(self.dir, exist_ok=True)
        # the load before the run (its process tree: this process and the ranks it starts)
        self.monitor = load.LoadMonitor() if measure_load else None
        if self.monitor is not None:
            print(f"[results] load before the run: 1-min average {self.monitor.rec['load1_before']:.2f}, other "
                  f"processes {load._pct(self.monitor.rec.get('others_before'))} of the CPUs", flush=True)

    def path(self, name: str) -> str:
        """A file inside the study folder (e.g. the PNG a script saves before calling write)."""
        return os.path.join(self.dir, name)

    def header(self, load_: Optional[dict] = None) -> dict:
        h = {"command": self.command, "experiment": os.environ.get("DYNAMIQ_EXPERIMENT") or self.command,
             "machine": self.machine, "date": when(self.started), "commit": self.commit}
        if load_ is not None:
            h["load"] = load_
        return h

    def write(self, part: str, markdown: str, data: Optional[dict] = None, plot: Optional[str] = None,
              raw: Optional[str] = None, load_: Optional[dict] = None) -> str:
        """Writes <part>.json (data plus the header fields under "run"; or copies `raw`, a text file,
        as <part>.txt) and this part's README section; returns the README's path. The load record:
        `load_` if given (a program run by the wrapper), else this run's from its start until now."""
        if load_ is None and self.monitor is not None:
            load_ = self.monitor.finish()
        if load_ is not None:
            print(load.format_record(load_, prefix="[results] "), flush=True)
        h = self.header(load_)
        links = []
        if data is not None:
            with open(self.path(part + ".json"), "w") as f:
                json.dump(dict(run=h, **data), f, indent=1)
                f.write("\n")
            links.append(f"[{part}.json]({part}.json)")
        if raw is not None:
            if os.path.abspath(raw) != self.path(part + ".txt"):
                shutil.copyfile(raw, self.path(part + ".txt"))
            links.append(f"[{part}.txt]({part}.txt)")
        body = []
        if part != self.study or h["experiment"] != self.command:
            body += [f"## {part}", "", f"Command: `{self.command}` ({h['date']}, {h['commit']}"
                     + (f"; {load.summary(load_)}" if load_ else "") + ")", ""]
        if load_ is not None and load_["loaded"]:
            body += [f"**Loaded run** ({load_['why']}): not to be quoted against a target.", ""]
        if plot:
            body += [f"![{part}]({os.path.basename(plot)})", ""]
        body += [markdown.strip(), ""]
        if links:
            body += ["Raw: " + ", ".join(links), ""]
        section = f"<!-- part {part} -->\n" + "\n".join(body) + f"<!-- /part {part} -->\n"
        return update_readme(os.path.join(self.dir, "README.md"), self.title,
                             header_line(h["experiment"], h["machine"], h["date"], h["commit"], load_),
                             part, section, f"{h['date']} {h['commit']}")


def update_readme(path: str, title: str, header: str, part: str, section: str, run_tag: str) -> str:
    """Rewrites the title and header line, keeps the notes, replaces (or appends) one part's section."""
    notes, parts = "", []
    if os.path.exists(path):
        text = open(path).read()
        first = _PART.search(text)
        head = text[:first.start()] if first else text
        lines = head.split("\n")
        # drop the title and the header line; the rest before the first part is notes
        if lines and lines[0].startswith("# "):
            lines = lines[1:]
        while lines and not lines[0].strip():
            lines = lines[1:]
        if lines and lines[0].startswith("Command: `") and " · Machine: " in lines[0]:
            lines = lines[1:]
        notes = "\n".join(l for l in lines if not l.startswith(_STALE)).strip()
        parts = [(m.group(1), m.group(0)) for m in _PART.finditer(text)]
    m = _NOTES_FOR.search(notes)
    if m and m.group(1).strip() != run_tag:
        notes = notes.replace(m.group(0), m.group(0) + "\n" + _STALE + m.group(1).strip()
                              + "; the tables below are from the run in the header._", 1)
    if any(name == part for name, _ in parts):
        parts = [(name, section if name == part else s) for name, s in parts]
    else:
        parts.append((part, section))
    out = [f"# {title}", "", header, ""]
    if notes:
        out += [notes, ""]
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n" + "\n".join(s for _, s in parts))
    return path


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Record a program's text output as experiments/results/<study>/.")
    p.add_argument("study")
    p.add_argument("title")
    p.add_argument("--command", required=True, help="the command that produced the output")
    p.add_argument("--part", nargs="+", action="append", metavar="NAME FILE [COMMAND]", required=True,
                   help="a part's name, the text file holding its output and, optionally, the command that "
                        "printed it (default --command); repeatable")
    p.add_argument("--out", default=None, help="study folder (default experiments/results/<study>)")
    args = p.parse_args(argv)
    if any(len(part) not in (2, 3) for part in args.part):
        p.error("--part takes NAME FILE [COMMAND]")
    os.environ.setdefault("DYNAMIQ_EXPERIMENT", args.command)
    for name, file, *cmd in args.part:
        run = Run(args.study, args.title, command=cmd[0] if cmd else args.command, out=args.out, measure_load=False)
        text = open(file).read()
        rec = json.load(open(file + ".load.json")) if os.path.exists(file + ".load.json") else None
        path = run.write(name, "```\n" + text.rstrip() + "\n```", raw=file, load_=rec)
    print(f"[results] {path}")


if __name__ == "__main__":
    main()
