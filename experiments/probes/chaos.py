"""Chaos on the emulated cluster (experiments/netbed, root): a real DDP job (chaos_train.py) under
torchrun's elastic restart, one torchrun agent per rank namespace (4 "nodes" of one worker, c10d
rendezvous at rank 0's address, --max-restarts 2), while one of three faults hits it:

  kill      worker 2 SIGKILLs itself in the backward pass of step 26 (its peers are inside the
            collective of a bucket with it); torchrun restarts the worker group, which resumes
            from the last checkpoint (step 20) of model, optimizer and hook state;
  linkdown  worker 1's link goes down for one second (`ip link set dqnb1 down`, then up) in the
            middle of step 16;
  slow      worker 1's egress is shaped to a tenth of the link rate (tc tbf) from step 11 to step
            30.

Each faulted job's final parameters are compared with an undisturbed job's from the same
checkpoint: the kill run's with a job started from its resumed checkpoint (ckpt-20); the link-down
and slow runs' with an undisturbed job from step 0 (they resume nothing). Every mode here restores
its random stream and allocator state with the hook state, so the comparison is bit for bit in
every mode, lossy ones included.

    nice -n 10 .venv/bin/python experiments/probes/chaos.py            # results/chaos/
    .venv/bin/python experiments/probes/chaos.py --modes dynamiq --faults kill --out experiments/out/chaos
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)

from experiments import results_io  # noqa: E402
from experiments.netbed import Netbed, parse_rate  # noqa: E402

JOB = os.path.join(HERE, "chaos_train.py")


def progress(d: str, rank: int) -> int:
    try:
        with open(os.path.join(d, f"progress-{rank}")) as f:
            lines = f.read().split("\n")
        return max([int(x.split()[1]) for x in lines if x.startswith("step ")] or [0])
    except FileNotFoundError:
        return 0


def step_times(d: str, rank: int) -> list:
    out = []
    with open(os.path.join(d, f"progress-{rank}")) as f:
        for line in f:
            if line.startswith("step "):
                _, s, t = line.split()
                out.append((int(s), float(t)))
    return out


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


class Job:
    def __init__(self, nb: Netbed, args, mode: str, name: str, root: str):
        self.nb, self.a, self.mode, self.name = nb, args, mode, name
        self.dir = os.path.join(root, f"{mode}-{name}")
        os.makedirs(self.dir, exist_ok=True)
        self.events: list = []

    def note(self, what: str) -> None:
        self.events.append((round(time.time() - self.t0, 2), progress(self.dir, 0), what))
        print(f"[chaos] {self.mode}/{self.name} t={self.events[-1][0]:.1f}s step {self.events[-1][1]}: {what}",
              flush=True)

    def run(self, extra=(), restarts: int = 2, injector=None) -> dict:
        a, nb = self.a, self.nb
        port = 29400
        # rank 0's agent hosts the rendezvous store (torchrun does not recognise the namespace's
        # address as its own: is_host says so); --local-addr: the address each agent advertises
        # (else "localhost", which the workers of other namespaces cannot reach)
        argv = [[sys.executable, "-m", "torch.distributed.run", "--nnodes=4", "--nproc-per-node=1",
                 "--rdzv-backend=c10d", f"--rdzv-endpoint={nb.ranks[0].addr}:{port}", f"--rdzv-id=chaos-{self.name}",
                 f"--rdzv-conf=is_host={int(k == 0)}", f"--local-addr={nb.ranks[k].addr}", f"--max-restarts={restarts}", "--monitor-interval=0.5",
                 JOB, "--dir", self.dir, "--mode", self.mode, "--steps", str(a.steps), "--ckpt-every",
                 str(a.ckpt_every), "--width", str(a.width), *map(str, extra)] for k in range(4)]
        self.t0 = time.time()
        stop = threading.Event()
        th = None
        if injector is not None:
            th = threading.Thread(target=injector, args=(self, stop), daemon=True)
            th.start()
        res = nb.launch(argv, timeout=a.timeout, logdir=os.path.join(self.dir, "logs"),
                        extra_env={"OMP_NUM_THREADS": "1"})
        stop.set()
        if th is not None:
            th.join()
        wall = time.time() - self.t0
        finals = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(self.dir, "final-*.json")))]
        ok = all(r.status == "ok" for r in res.ranks) and len(finals) == 4
        out = {"ok": ok, "wall_s": wall, "statuses": [r.status for r in res.ranks], "finals": finals,
               "events": self.events, "digests": sorted({f["digest"] for f in finals})}
        if not ok:
            print(f"[chaos] {self.mode}/{self.name} FAILED: {out['statuses']}; logs in {self.dir}/logs", flush=True)
        return out


def wait_step(job: Job, rank: int, step: int, stop: threading.Event) -> bool:
    while not stop.is_set():
        if progress(job.dir, rank) >= step:
            return True
        time.sleep(0.02)
    return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="lossless,dynamiq")
    ap.add_argument("--faults", default="kill,linkdown,slow")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument("--width", type=int, default=1024, help="hidden width (1024: 1.2M parameters, 4.8 MB of float32)")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    modes = [m for m in a.modes.split(",") if m]
    faults = [f for f in a.faults.split(",") if f]
    run = results_io.Run("chaos", "Chaos: kill -9, a link down, a slow link, under torchrun's elastic restart",
                         argv=sys.argv[1:], script=__file__, out=a.out)
    root = tempfile.mkdtemp(prefix="dynamiq-chaos-")
    rate_bps = parse_rate(a.rate)
    results: dict = {}
    t_all = time.time()
    with Netbed(world=4, rate=a.rate) as nb:
        def link_down(job: Job, stop: threading.Event) -> None:
            spec = nb.ranks[1]
            if wait_step(job, 0, 15, stop):
                time.sleep(0.2)  # inside step 16
                sh("ip", "-n", spec.netns, "link", "set", spec.ifname, "down")
                job.note(f"{spec.ifname} (rank 1) down")
                time.sleep(1.0)
                sh("ip", "-n", spec.netns, "link", "set", spec.ifname, "up")
                job.note(f"{spec.ifname} (rank 1) up")

        def slow(job: Job, stop: threading.Event) -> None:
            spec = nb.ranks[1]
            burst = max(131072, rate_bps // 8 // 1000)
            tbf = ["tbf", "burst", str(burst), "latency", "20ms"]
            if wait_step(job, 0, 10, stop):
                sh("tc", "-n", spec.netns, "qdisc", "change", "dev", spec.ifname, "root", "handle", "1:", *tbf[:1],
                   "rate", f"{rate_bps // 10}bit", *tbf[1:])
                job.note(f"{spec.ifname} (rank 1) egress at {rate_bps // 10 / 1e6:g} Mbit/s")
                if wait_step(job, 0, 30, stop):
                    sh("tc", "-n", spec.netns, "qdisc", "change", "dev", spec.ifname, "root", "handle", "1:",
                       *tbf[:1], "rate", f"{rate_bps}bit", *tbf[1:])
                    job.note(f"{spec.ifname} (rank 1) egress back at {rate_bps / 1e6:g} Mbit/s")

        for mode in modes:
            r = results[mode] = {}
            if "linkdown" in faults or "slow" in faults:
                r["undisturbed"] = Job(nb, a, mode, "undisturbed", root).run()
            if "kill" in faults:
                hit = Job(nb, a, mode, "kill", root)
                r["kill"] = hit.run(["--kill-rank", 2, "--kill-step", 25])
                starts = {f["start_step"] for f in r["kill"]["finals"]}
                ref = Job(nb, a, mode, "kill-reference", root)
                for s in starts:
                    if s:
                        shutil.copy(os.path.join(hit.dir, f"ckpt-{s}.pt"), ref.dir)
                r["kill-reference"] = ref.run(restarts=0)
            if "linkdown" in faults:
                r["linkdown"] = Job(nb, a, mode, "linkdown", root).run(injector=link_down)
            if "slow" in faults:
                job = Job(nb, a, mode, "slow", root)
                r["slow"] = job.run(injector=slow)
                st = step_times(job.dir, 0)
                t = dict(st)
                r["slow"]["step_s_normal"] = (t[10] - t[1]) / 9 if 10 in t and 1 in t else None
                r["slow"]["step_s_slow"] = (t[30] - t[11]) / 19 if 30 in t and 11 in t else None

    rows = []
    ok_all = True
    for mode, r in results.items():
        for fault, ref_name in (("kill", "kill-reference"), ("linkdown", "undisturbed"), ("slow", "undisturbed")):
            if fault not in r:
                continue
            x, ref = r[fault], r[ref_name]
            fin = x["finals"]
            restarts = max((f["attempt"] for f in fin), default=-1)
            start = sorted({f["start_step"] for f in fin})
            same = x["ok"] and ref["ok"] and len(x["digests"]) == 1 and x["digests"] == ref["digests"]
            ok_all &= same
            extra = ""
            if fault == "slow" and x.get("step_s_slow"):
                extra = f"step {x['step_s_normal']:.2f} s -> {x['step_s_slow']:.2f} s while slow"
            if fault == "linkdown":
                extra = "; ".join(f"t={e[0]:.1f}s: {e[2]}" for e in x["events"])
            rows.append(f"| {mode} | {fault} | {'completed' if x['ok'] else '**failed**: ' + ','.join(x['statuses'])} | "
                        f"{restarts} | {','.join(map(str, start))} | {'yes' if len(x['digests']) == 1 else '**no**'} | "
                        f"{ref_name} | {'**bit-identical**' if same else '**differs**'} | {x['wall_s']:.0f} | {extra} |")
    md = [f"4 ranks on the netbed ({a.rate} links, one namespace and one torchrun agent per rank), {a.steps} steps of "
          f"an MLP of hidden width {a.width} (SGD with momentum, batches drawn from (rank, step)), checkpoints every "
          f"{a.ckpt_every} steps. Each faulted job is compared with an undisturbed job from the checkpoint it "
          f"resumed from. Total wall time {(time.time() - t_all) / 60:.1f} min on a machine shared with other jobs.", "",
          "| mode | fault | job | restarts | resumed from step | replicas agree | compared with | final parameters | "
          "wall s | notes |", "|---|---|---|---|---|---|---|---|---|---|", *rows]
    data = {"args": vars(a), "results": {m: {k: {kk: vv for kk, vv in v.items()} for k, v in r.items()}
                                         for m, r in results.items()}}
    print(run.write("chaos", "\n".join(md), data=data))
    print("chaos:", "PASS" if ok_all else "FAIL", flush=True)
    if ok_all:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"chaos: the jobs' folders and logs are kept in {root}")
    sys.exit(0 if ok_all else 1)


if __name__ == "__main__":
    main()
