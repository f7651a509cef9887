"""Time to accuracy in miniature: 4 DDP workers in the emulated cluster at
1 Gbit/s, one small transformer LM, one row per gradient-communication method.

    python experiments/studies/train.py                # netbed, 4 ranks, 1 Gbit/s (root), ~40 min
    python experiments/studies/train.py --loopback --steps 50 --out experiments/out/train  # no root: unshaped

Rows: uncompressed (DDP's default all-reduce over Gloo), PyTorch's
fp16_compress_hook, PowerSGD (rank 4, one bucket), dynamiq 5 bits (ring),
lossless, bitsplit INT4 (two-step). Every row trains the same model
(dynamiq.demo.TinyGPT, d=384, 4 layers, 7.2 M parameters) from the same
initialisation on the same batches (CPython's pydoc text; no downloads).
Reported: training loss against steps and against wall-clock (PNG), held-out
loss every `--eval-every` steps, final held-out loss relative to the
uncompressed row, and the time each row needs to reach the uncompressed
row's final held-out loss within 1 % and 5 %. Evaluation time is excluded
from the wall-clock. Writes experiments/results/train/ (`--out DIR` for a scratch run elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import timedelta

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from experiments import results_io  # noqa: E402
from experiments.bench import benchlib  # noqa: E402

METHODS = ["uncompressed", "fp16", "powersgd4", "dynamiq5", "lossless", "bitsplit4"]


def rank_main(args, out_path: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import dynamiq
    from dynamiq.demo import TinyGPT, corpus, get_batch, lm_loss

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=600))
    torch.manual_seed(0)
    model = TinyGPT(d=args.dim, layers=args.layers, ctx=args.ctx)
    nbytes = sum(p.numel() for p in model.parameters()) * 4
    m = args.method
    if m == "powersgd4":
        ddp = DDP(model, bucket_cap_mb=nbytes / 2**20 + 1)  # one bucket: see FIELD-NOTES on Gloo
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
        st = ps.PowerSGDState(process_group=None, matrix_approximation_rank=4, start_powerSGD_iter=10)
        ddp.register_comm_hook(st, ps.powerSGD_hook)
    else:
        ddp = DDP(model)
        state = None
        if m == "fp16":
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
            ddp.register_comm_hook(None, fp16_compress_hook)
        elif m == "dynamiq5":
            state = dynamiq.register(ddp, dynamiq.Config(mode="dynamiq", bits=5.0, topology="ring"))
        elif m == "lossless":
            state = dynamiq.register(ddp, dynamiq.Config(mode="lossless", topology="ring"))
        elif m == "bitsplit4":
            state = dynamiq.register(ddp, dynamiq.Config(mode="bitsplit", bits=4, topology="twostep"))
        elif m != "uncompressed":
            raise ValueError(m)
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
    data = corpus()
    log = {"method": m, "params": nbytes // 4, "steps": [], "loss": [], "wall": [], "eval": []}
    wall = 0.0

    def evaluate():
        with torch.no_grad():
            v = [lm_loss(model, *get_batch(data, 0, 100_000 + k, 16, args.ctx, split="val")).item()
                 for k in range(args.eval_batches)]
        return sum(v) / len(v)

    for step in range(args.steps):
        dist.barrier()
        t0 = time.perf_counter()
        x, y = get_batch(data, rank, step, args.batch, args.ctx)
        opt.zero_grad(set_to_none=True)
        loss = lm_loss(ddp, x, y)
        loss.backward()
        opt.step()
        dt = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        wall += dt.item()
        lv = loss.detach().clone()
        dist.all_reduce(lv)
        log["steps"].append(step)
        log["loss"].append(lv.item() / world)
        log["wall"].append(wall)
        if m in ("dynamiq5", "bitsplit4") and state is not None and state.last_step_stats:
            # wire bits per coordinate this step (all buckets; the plan's size, exact for
            # these modes, only an upper bound for lossless) and exact allocator searches
            st = state.last_step_stats
            log.setdefault("bits", []).append(sum(b["bits_per_coord"] * b["numel"] for b in st)
                                              / max(1, sum(b["numel"] for b in st)))
            log.setdefault("alloc_exact", []).append(sum(b.get("alloc_exact", 0) for b in st))
            log.setdefault("alloc_fallbacks", []).append(sum(b.get("alloc_fallbacks", 0) for b in st))
        if (step + 1) % args.eval_every == 0 or step == args.steps - 1:
            ev = evaluate() if rank == 0 else 0.0
            log["eval"].append((step + 1, wall, ev))
            if rank == 0:
                print(f"[{m}] step {step + 1:4d} train {log['loss'][-1]:.4f} eval {ev:.4f} wall {wall:7.1f} s "
                      f"({dt.item() * 1e3:.0f} ms/step)", flush=True)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(log, f)
    dist.destroy_process_group()


def run_method(method: str, args) -> dict:
    tmp = tempfile.mkdtemp(prefix="dynamiq-train-")
    out = os.path.join(tmp, "log.json")
    argv = ["--worker", out, "--method", method] + [a for a in sys.argv[1:]]
    from experiments.netbed import run
    res = run(os.path.abspath(__file__), argv, world=args.world, rate=args.rate, timeout=args.timeout,
              loopback=args.loopback, stream=0)
    if not os.path.exists(out):
        return {"method": method, "error": res.summary() if hasattr(res, "summary") else "failed"}
    return json.load(open(out))


def time_to(log: dict, target: float):
    for step, wall, ev in log.get("eval", []):
        if ev <= target:
            return step, wall
    return None


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    worker_out = None
    if argv and argv[0] == "--worker":
        worker_out, argv = argv[1], argv[2:]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--method", default=None, help=argparse.SUPPRESS)
    p.add_argument("--methods", nargs="+", default=METHODS)
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--loopback", action="store_true")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--ctx", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--timeout", type=float, default=7200)
    p.add_argument("--out", default=None, help="study folder to write instead of experiments/results/train")
    args = p.parse_args(argv)
    if worker_out is not None:
        rank_main(args, worker_out)
        return
    run = results_io.Run("train", "Time to accuracy on the emulated cluster", script=__file__, argv=argv,
                         out=args.out)
    logs = {}
    for m in args.methods:
        print(f"== {m}", flush=True)
        mon = results_io.load.LoadMonitor()  # each method's own load record: a loaded row is marked
        logs[m] = run_method(m, args)
        logs[m]["load"] = mon.finish()
        print(results_io.load.format_record(logs[m]["load"]), flush=True)
    base = logs.get("uncompressed")
    base_final = base["eval"][-1][2] if base and "eval" in base else None
    headers = ["method", "final held-out loss", "vs uncompressed", "time (s)", "s/step",
               "to within 5% of uncompressed final", "to within 1%", "load"]
    table = []
    for m, log in logs.items():
        if "error" in log:
            table.append([m, "failed: " + log["error"][:120]] + [""] * 6)
            continue
        fin = log["eval"][-1][2]
        total = log["wall"][-1]
        t5 = time_to(log, base_final * 1.05) if base_final else None
        t1 = time_to(log, base_final * 1.01) if base_final else None
        table.append([m, f"{fin:.4f}", f"{100 * (fin / base_final - 1):+.2f}%" if base_final else "-",
                      f"{total:.1f}", f"{total / len(log['wall']):.3f}",
                      f"step {t5[0]}, {t5[1]:.0f} s" if t5 else "not reached",
                      f"step {t1[0]}, {t1[1]:.0f} s" if t1 else "not reached",
                      results_io.load.summary(log["load"]) if "load" in log else "?"])
    where = "loopback (unshaped)" if args.loopback else f"netbed, {args.rate} links"
    nparams = next((l["params"] for l in logs.values() if "params" in l), 0)
    wire = []
    for m, log in logs.items():
        if log.get("bits"):
            b = log["bits"]
            wire.append([m, f"{sum(b) / len(b):.3f}", f"{min(b):.3f}", f"{max(b):.3f}",
                         str(sum(1 for x in log["alloc_exact"] if x)), str(sum(1 for x in log["alloc_fallbacks"] if x))])
    wire_md = ("\n\nWire bits per coordinate per step (all buckets, from `HookState.last_step_stats`) and the "
               "steps on which the dynamiq allocator searched exactly (the first step, or a fallback when the "
               "statistics moved too far):\n\n" + benchlib.markdown_table(
                   ["method", "mean bits", "min", "max", "steps with an exact search", "of them fallbacks"], wire)
               ) if wire else ""
    md = (f"{args.world} ranks, {where}; TinyGPT d={args.dim} x {args.layers} layers "
          f"({nparams / 1e6:.1f} M parameters), batch {args.batch} x {args.ctx} tokens per rank, {args.steps} steps, "
          f"AdamW lr {args.lr}.\n\n" + benchlib.markdown_table(headers, table) + wire_md)
    print(md)
    plot = None
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axs = plt.subplots(1, 2, figsize=(11, 4))
        for m, log in logs.items():
            if "error" in log:
                continue
            k = 10  # moving average of the training loss
            sm = [sum(log["loss"][max(0, i - k + 1):i + 1]) / len(log["loss"][max(0, i - k + 1):i + 1])
                  for i in range(len(log["loss"]))]
            axs[0].plot(log["steps"], sm, label=m)
            axs[1].plot(log["wall"], sm, label=m)
        axs[0].set_xlabel("step")
        axs[1].set_xlabel("wall-clock (s, evaluation excluded)")
        for a in axs:
            a.set_ylabel("training loss (10-step mean)")
            a.legend(fontsize=7)
        fig.suptitle(f"TinyGPT, {args.world} ranks, {where}")
        fig.tight_layout()
        plot = "train.png"
        fig.savefig(run.path(plot), dpi=120)
    except ImportError:
        print("matplotlib not installed: no plot")
    print("[train]", run.write("train", md, data={"args": vars(args), "logs": logs}, plot=plot))


if __name__ == "__main__":
    main()
