"""Mode "bounded" (ZCCL's error-bounded mode): bytes per value, error against
the bound and ZCCL's theorem 1, and all-reduce time against Gloo.

    python experiments/studies/bounded.py                      # ~10 min on 2 loaded cores
    python experiments/studies/bounded.py --parts accuracy --out experiments/out/bounded   # quick

Writes experiments/results/bounded/ (`--out DIR` for a scratch run elsewhere).

Data:
  smooth    a scientific-style field per rank: a sum of 5 sines of random
            frequency and phase over the bucket (a 1-D stand-in for a
            simulation field) plus 1e-3 noise; each rank's field differs.
  gradient  TinyGPT gradients (dynamiq.demo, 0.87 M parameters, d=128, 4
            layers) of 4 simulated workers after 20 AdamW steps on pydoc text
            (experiments/studies/vnmse.py's capture_gradients), concatenated.

Part "accuracy" (dynamiq.simulate, the real codec and schedules in one
process, n = 4): per data kind, topology and bound, the wire bits per value
(bytes all ranks send / (2 (n - 1) numel) x 8: one copy of the bucket, against
32 for float32), the largest error of the sum in units of e (the guarantee:
<= n = 4), ZCCL theorem 1: the share of coordinates whose error is within
2 sqrt(n) sigma, sigma = e / sqrt(3) (errors uniform on [-e, e]; the theorem
says 95.44% for normal errors), and the measured std of the sum's error over
sqrt(n) sigma (1 if the n errors are independent and uniform), and the vNMSE.
Smooth data uses bounds relative to the value range (error_bound_rel, as
ZCCL's REL bounds); gradients use absolute bounds at fractions of their rms
(a range-relative bound on gradients is set by their outliers).

Part "speed" (Gloo over loopback, one process per rank): median time of
`--repeats` all-reduces (sum) of a float32 bucket of `--numel` values, the
slowest rank, for Gloo's all_reduce, mode none and mode bounded (ring) at the
same bounds, with the bytes each rank sent.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)
from experiments import results_io  # noqa: E402
from experiments.bench import benchlib  # noqa: E402

import dynamiq  # noqa: E402

SMOOTH_REL = (1e-2, 1e-3, 1e-4)
GRAD_RMS = (0.5, 0.1, 0.01)


def smooth_field(rank: int, numel: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)
    t = torch.arange(numel, dtype=torch.float64) / numel
    x = torch.zeros(numel, dtype=torch.float64)
    for _ in range(5):
        f = float(torch.rand(1, generator=g)) * 40 + 1
        ph = float(torch.rand(1, generator=g)) * 6.28
        a = float(torch.rand(1, generator=g)) + 0.2
        x += a * torch.sin(2 * math.pi * f * t + ph)
    x += torch.randn(numel, generator=g, dtype=torch.float64) * 1e-3
    return x.float()


def gradient_data(workers: int):
    from vnmse import capture_gradients
    g = capture_gradients(20, [20], workers)[20]
    return [t.float().contiguous() for t in g]


def accuracy(n: int, numel: int, log) -> tuple:
    rows, data = [], []
    kinds = {"smooth": [smooth_field(r, numel) for r in range(n)]}
    log("[accuracy] capturing TinyGPT gradients (20 steps, 4 workers)")
    kinds["gradient"] = gradient_data(n)
    for kind, xs in kinds.items():
        ref = torch.stack([x.double() for x in xs]).sum(0)
        rms = float(torch.stack(xs).double().pow(2).mean().sqrt())
        rng = sum(float(x.max()) - float(x.min()) for x in xs) / n
        bounds = ([("rel", r, r * rng) for r in SMOOTH_REL] if kind == "smooth"
                  else [("abs", c, c * rms) for c in GRAD_RMS])
        for topo in dynamiq.available_topologies(compositions=False):  # every schedule
            for how, b, e_req in bounds:
                kw = {"error_bound_rel": b} if how == "rel" else {"error_bound": e_req}
                cfg = dynamiq.Config(mode="bounded", topology=topo, **kw)
                t0 = time.time()
                out, st = dynamiq.simulate(xs, cfg, return_stats=True)
                assert all(torch.equal(o, out[0]) for o in out), "ranks differ"
                err = out[0].double() - ref
                e = e_req  # the plan's e is e_req rounded down to float32 (relative: the same mean range)
                sent = sum(s["bytes_sent"] for s in st)
                bits = 8 * sent / (2 * (n - 1) * xs[0].numel())
                sigma = e / math.sqrt(3)
                within = float((err.abs() <= 2 * math.sqrt(n) * sigma).double().mean())
                std_ratio = float(err.std()) / (math.sqrt(n) * sigma)
                vn = float(err.pow(2).sum() / ref.pow(2).sum())
                worst = float(err.abs().max()) / e
                assert worst <= n * (1 + 1e-5) + 1e-6 * float(ref.abs().max()) / e, (kind, topo, b, worst)
                label = f"rel {b:g}" if how == "rel" else f"{b:g} x rms"
                rows.append([kind, topo, label, f"{e:.3g}", f"{bits:.2f}", f"{32 / bits:.1f}x",
                             f"{worst:.2f}", f"{100 * within:.2f}%", f"{std_ratio:.3f}", f"{vn:.2e}"])
                data.append(dict(kind=kind, topology=topo, bound=label, e=e, bits_per_value=bits, max_err_over_e=worst,
                                 within_2sqrtn_sigma=within, std_over_sqrtn_sigma=std_ratio, vnmse=vn, n=n,
                                 numel=xs[0].numel(), seconds=time.time() - t0))
                log(f"[accuracy] {kind:8s} {topo:9s} {label:12s} bits {bits:6.2f} max|err|/e {worst:.2f} "
                    f"within 2sqrt(n)sigma {100 * within:.2f}%")
    md = benchlib.markdown_table(
        ["data", "topology", "bound", "e", "bits/value", "vs fp32", "max err / e", "within 2 sqrt(n) sigma",
         "std / (sqrt(n) sigma)", "vNMSE"], rows)
    return md, data


# ---- speed: one process per rank over Gloo --------------------------------------------------
def _speed_rank(rank, world, store, numel, repeats, q):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=600))
    from dynamiq.api import run_collective
    name = dist.group.WORLD.group_name
    seq = [0]
    res = []
    g = torch.Generator().manual_seed(rank)
    grad = torch.randn(numel, generator=g) * torch.exp(torch.randn((numel + 255) // 256, generator=g)
                                                        ).repeat_interleave(256)[:numel] * 1e-3
    for kind, x0 in (("smooth", smooth_field(rank, numel)), ("gradient", grad)):
        rms = float(x0.pow(2).mean().sqrt())
        rms_t = torch.tensor([rms * rms], dtype=torch.float64)
        dist.all_reduce(rms_t)
        rms = math.sqrt(rms_t.item() / world)
        methods = [("gloo", None), ("none:ring", dynamiq.Config(mode="none"))]
        if kind == "smooth":
            methods += [(f"bounded rel {r:g}", dynamiq.Config(mode="bounded", error_bound_rel=r)) for r in SMOOTH_REL]
        else:
            methods += [(f"bounded {c:g} x rms", dynamiq.Config(mode="bounded", error_bound=c * rms)) for c in GRAD_RMS]
        x = x0.clone()
        for label, cfg in methods:
            if cfg is None:
                def fn():
                    dist.all_reduce(x)
                    return 2 * (world - 1) * numel * 4 / world
            else:
                def fn(cfg=cfg):
                    seq[0] += 1
                    st = run_collective(x, name, cfg, "sum", seq[0])
                    return st["bytes_sent"] + st["meta_bytes_sent"]
            times, sent = benchlib.time_collective(fn, repeats, warmup=1, prepare=lambda: x.copy_(x0))
            res.append(dict(kind=kind, method=label, world=world, numel=numel, times=times,
                            median_s=statistics.median(times), bytes_sent=sent))
    if rank == 0:
        q.put(res)
    dist.barrier()
    dist.destroy_process_group()


def speed(worlds, numel, repeats, log) -> tuple:
    rows, data = [], []
    ctx = mp.get_context("spawn")
    for world in worlds:
        log(f"[speed] world {world}, {numel} float32 values, {repeats} repeats")
        q = ctx.Queue()
        with tempfile.TemporaryDirectory() as d:
            procs = [ctx.Process(target=_speed_rank, args=(r, world, os.path.join(d, "store"), numel, repeats, q))
                     for r in range(world)]
            for p in procs:
                p.start()
            res = q.get(timeout=3600)
            for p in procs:
                p.join()
        base = {r["kind"]: r["median_s"] for r in res if r["method"] == "gloo"}
        for r in res:
            rows.append([r["kind"], str(world), r["method"], f"{1e3 * r['median_s']:.1f}",
                         f"{1e3 * min(r['times']):.1f}-{1e3 * max(r['times']):.1f}",
                         benchlib.fmt_bytes(r["bytes_sent"]), f"{8 * r['bytes_sent'] / (2 * (world - 1) * numel / world):.2f}",
                         f"{base[r['kind']] / r['median_s']:.2f}x"])
            data.append(r)
            log(f"[speed] n={world} {r['kind']:8s} {r['method']:22s} {1e3 * r['median_s']:8.1f} ms")
    md = benchlib.markdown_table(["data", "n", "method", "median ms", "range ms", "sent per rank",
                                  "bits/value", "speed-up vs Gloo"], rows)
    return md, data


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", nargs="+", default=["accuracy", "speed"], choices=["accuracy", "speed"])
    p.add_argument("--n", type=int, default=4, help="ranks of the accuracy part")
    p.add_argument("--numel", type=int, default=1 << 20, help="values per rank (smooth data, speed part)")
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    run = results_io.Run("bounded", "Mode bounded: bytes, error bound, theorem 1, speed against Gloo",
                         argv=sys.argv[1:] if argv is None else argv, script=__file__, out=args.out)
    log = lambda s: print(s, flush=True)  # noqa: E731
    if "accuracy" in args.parts:
        md, data = accuracy(args.n, args.numel, log)
        run.write("accuracy", md, data={"rows": data})
    if "speed" in args.parts:
        md, data = speed(args.worlds, args.numel, args.repeats, log)
        run.write("speed", md, data={"rows": data})


if __name__ == "__main__":
    main()
