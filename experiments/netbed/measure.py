"""Measure what a netbed delivers on this machine: iperf3 throughput and Gloo's own all-reduce.

    python -m experiments.netbed.measure [--out DIR] [--quick]

Needs root, iperf3 and (for the all-reduce rows) torch in the interpreter that runs this. Writes the
part "measure" of experiments/results/netbed/ (README.md section and measure.json; `--out DIR` for a
scratch run elsewhere). About 5 minutes (--quick: 1).

iperf3 rows: every flow runs 5 s; the figure is the receiver's goodput. Patterns: "1 flow" (rank 0 -> 1),
"ring" (every rank k -> k+1 at once; with 2 ranks that is both directions). The goodput bound is
rate x 1448/1514 (TCP payload per frame that tbf counts at MTU 1500).
All-reduce rows: probe_allreduce.py (barrier, then dist.all_reduce, slowest rank's time); ring bound
2(n-1)/n x bytes x 8 / rate, goodput bound = ring bound / (1448/1514).
P2P rows: probe_p2p.py (ring exchange with isend/irecv in both posting orders, 32 MiB, 1 Gbit/s, 12 iterations).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from experiments import results_io  # noqa: E402
from experiments.netbed.launch import GOODPUT_MTU1500, Netbed, format_rate, parse_rate  # noqa: E402

HERE = Path(__file__).resolve().parent
RATES = ["100mbit", "1gbit", "10gbit", "none"]


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def iperf_row(world: int, rate: str, pattern: str, seconds: float) -> dict:
    row = {"kind": "iperf3", "world": world, "rate": rate, "pattern": pattern, "load_before": loadavg()}
    with Netbed(world, rate) as nb:
        flows = [(0, 1)] if pattern == "1 flow" else [(k, (k + 1) % world) for k in range(world)]
        servers = [nb.spawn(dst, ["iperf3", "-s", "-1", "-B", nb.ranks[dst].addr], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL) for _, dst in flows]
        time.sleep(0.5)
        clients = [nb.spawn(src, ["iperf3", "-c", nb.ranks[dst].addr, "-B", nb.ranks[src].addr, "-t", f"{seconds:g}",
                                  "-J"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=seconds + 30)
                   for src, dst in flows]
        mbit, retrans = [], []
        for c in clients:
            out, err = c.communicate()
            if c.returncode != 0:
                row.update(status="failed", error=(err or out)[-500:].decode("utf-8", "replace"))
                return row
            js = json.loads(out)
            mbit.append(js["end"]["sum_received"]["bits_per_second"] / 1e6)
            retrans.append(js["end"]["sum_sent"].get("retransmits", 0))
        for s in servers:
            s.wait(timeout=10)
    bps = parse_rate(rate)
    row.update(status="ok", flows=len(flows), mbit_per_flow=mbit, mean_mbit=statistics.mean(mbit), min_mbit=min(mbit),
               retransmits=sum(retrans), load_after=loadavg())
    if bps:
        row.update(of_rate=row["mean_mbit"] * 1e6 / bps, of_goodput=row["mean_mbit"] * 1e6 / (bps * GOODPUT_MTU1500))
    return row


def allreduce_row(world: int, rate: str, dtype: str, nbytes: int, iters: int, python: str) -> dict:
    row = {"kind": "allreduce", "world": world, "rate": rate, "dtype": dtype, "bytes": nbytes, "iters": iters,
           "load_before": loadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "res.json"
        with Netbed(world, rate) as nb:
            res = nb.launch([python, str(HERE / "probe_allreduce.py"), "--bytes", str(nbytes), "--dtype", dtype,
                             "--iters", str(iters), "--warmup", "1", "--out", str(out)], timeout=600,
                            logdir=Path(tmp) / "logs", grace=20)
        row["load_after"] = loadavg()
        if not res.ok or not out.exists():
            bad = res.ranks[res.first_failure] if res.first_failure is not None else res.ranks[0]
            lines = [s for s in bad.log.read_text(errors="replace").splitlines() if s.strip()]
            err = next((s for s in reversed(lines) if "Error" in s or "error" in s), lines[-1] if lines else "")
            row.update(status="failed", error=f"rank {bad.rank}: {bad.detail}: {err.strip()[:300]}")
            return row
        r = json.loads(out.read_text())
    bps = parse_rate(rate)
    row.update(status="ok", times=r["times"], median_s=r["median_s"], min_s=min(r["times"]), max_s=max(r["times"]),
               torch=r["torch"], algbw_gbit=nbytes * 8 / r["median_s"] / 1e9)
    if bps:
        bound = 2 * (world - 1) / world * nbytes * 8 / bps
        row.update(ring_bound_s=bound, goodput_bound_s=bound / GOODPUT_MTU1500, of_bound=r["median_s"] / bound,
                   of_goodput_bound=r["median_s"] / (bound / GOODPUT_MTU1500))
    return row


def p2p_row(world: int, rate: str, nbytes: int, iters: int, python: str) -> dict:
    row = {"kind": "p2p", "world": world, "rate": rate, "bytes": nbytes, "load_before": loadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "res.json"
        with Netbed(world, rate) as nb:
            res = nb.launch([python, str(HERE / "probe_p2p.py"), "--bytes", str(nbytes), "--iters", str(iters),
                             "--out", str(out)],
                            timeout=600, logdir=Path(tmp) / "logs", grace=20)
        row["load_after"] = loadavg()
        if not res.ok or not out.exists():
            row.update(status="failed", error=res.summary(tail=3).replace("\n", " "))
            return row
        r = json.loads(out.read_text())
    row.update(status="ok", bound_s=r["bound_s"], orders={k: r[k]["median_s"] for k in r if isinstance(r[k], dict)},
               times={k: r[k]["times"] for k in r if isinstance(r[k], dict)})
    return row


def markdown(rows: list[dict]) -> str:
    out = ["### iperf3 (receiver goodput per flow, 5 s per flow)", "",
           "| ranks | pattern | rate | flows | mean Mbit/s | min Mbit/s | of rate | of goodput bound | retransmits "
           "| load |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["kind"] != "iperf3":
            continue
        rate = format_rate(parse_rate(r["rate"]))
        if r["status"] != "ok":
            out.append(f"| {r['world']} | {r['pattern']} | {rate} | failed: {r['error']} |||||||")
            continue
        of = f"{r['of_rate']:.1%} | {r['of_goodput']:.1%}" if "of_rate" in r else "- | -"
        out.append(f"| {r['world']} | {r['pattern']} | {rate} | {r['flows']} | {r['mean_mbit']:.0f} "
                   f"| {r['min_mbit']:.0f} | {of} | {r['retransmits']} | {r['load_before']:.1f} |")
    out += ["", "### Gloo all-reduce (median of iterations, slowest rank; ring bound 2(n-1)/n x bytes x 8 / rate)", "",
            "| ranks | dtype | MiB | rate | median s | min-max s | ring bound s | median / bound "
            "| median / goodput bound | algbw Gbit/s | load |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["kind"] != "allreduce":
            continue
        rate = format_rate(parse_rate(r["rate"]))
        mib = r["bytes"] / 2**20
        if r["status"] != "ok":
            out.append(f"| {r['world']} | {r['dtype']} | {mib:g} | {rate} | failed: {r['error']} |||||||")
            continue
        b = (f"{r['ring_bound_s']:.3f} | {r['of_bound']:.3f}x | {r['of_goodput_bound']:.3f}x" if "ring_bound_s" in r
             else "- | - | -")
        out.append(f"| {r['world']} | {r['dtype']} | {mib:g} | {rate} | {r['median_s']:.3f} "
                   f"| {r['min_s']:.3f}-{r['max_s']:.3f} | {b} | {r['algbw_gbit']:.2f} | {r['load_before']:.1f} |")
    p2p = [r for r in rows if r["kind"] == "p2p"]
    if p2p:
        orders = ["send_first", "recv_first", "batch_send_first", "batch_recv_first"]
        out += ["", "### Gloo isend/irecv exchange on a ring, by posting order", "",
                "median s (median / bound), and how many iterations took over 1.5x the bound "
                "(bound = bytes x 8 / rate: each direction of each link carries the bytes once)", "",
                "| ranks | MiB | rate | bound s | " + " | ".join(orders) + " | load |",
                "|---|---|---|---|" + "---|" * len(orders) + "---|"]
        for r in p2p:
            rate = format_rate(parse_rate(r["rate"]))
            if r["status"] != "ok":
                out.append(f"| {r['world']} | {r['bytes'] / 2**20:g} | {rate} | failed: {r['error']} |")
                continue
            def cell(o):
                slow = sum(t > 1.5 * r["bound_s"] for t in r["times"][o])
                return f"{r['orders'][o]:.3f} ({r['orders'][o] / r['bound_s']:.2f}x), slow {slow}/{len(r['times'][o])}"
            cells = " | ".join(cell(o) for o in orders)
            out.append(f"| {r['world']} | {r['bytes'] / 2**20:g} | {rate} | {r['bound_s']:.3f} | {cells} "
                       f"| {r['load_before']:.1f} |")
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="study folder to write instead of experiments/results/netbed")
    ap.add_argument("--quick", action="store_true", help="fewer rows and iterations (a smoke run)")
    ap.add_argument("--only", choices=["iperf", "allreduce", "p2p"], help="one section only")
    ap.add_argument("--python", default=sys.executable, help="interpreter with torch for the all-reduce ranks")
    a = ap.parse_args()
    run = results_io.Run("netbed", "netbed: what the emulated cluster delivers on this machine",
                         command=" ".join(["python -m experiments.netbed.measure"] + sys.argv[1:]), out=a.out)
    rows: list[dict] = []
    secs = 2 if a.quick else 5
    rates = ["1gbit", "none"] if a.quick else RATES

    def note(row):
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("times", "mbit_per_flow")}), flush=True)

    if a.only in (None, "iperf"):
        for rate in rates:
            for world, pattern in ((2, "1 flow"), (2, "ring"), (4, "ring")):
                note(iperf_row(world, rate, pattern, secs))
    if a.only in (None, "allreduce"):
        mib64 = 64 * 2**20
        plan = [(w, r, "float32", 2 if r == "100mbit" else 5) for r in rates for w in (2, 4)]
        if not a.quick:
            plan += [(w, r, dt, 3) for dt in ("float16", "bfloat16") for r in ("1gbit", "10gbit") for w in (2, 4)]
        for world, rate, dtype, iters in plan:
            note(allreduce_row(world, rate, dtype, mib64, 2 if a.quick else iters, a.python))
    if a.only in (None, "p2p"):
        for world in (2, 4):
            note(p2p_row(world, "1gbit", 32 * 2**20, 3 if a.quick else 12, a.python))
    meta = {"host": os.uname().nodename, "kernel": os.uname().release}
    print(markdown(rows))
    print("[netbed]", run.write("measure", markdown(rows), data={"meta": meta, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
