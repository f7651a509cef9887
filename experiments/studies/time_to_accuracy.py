"""Time to accuracy of a small Llama on the emulated cluster: 4 DDP ranks at
1 Gbit/s, one row per gradient-communication method, the same model, data,
initialisation and steps for every row.

    python experiments/studies/time_to_accuracy.py            # netbed (root), 4 ranks, 1 Gbit/s
    python experiments/studies/time_to_accuracy.py --loopback --steps 20 --out experiments/out/tta  # no root

Rows (`--methods`): none (dynamiq mode "none": the hook's exact ring all-reduce),
fp16 (PyTorch's fp16_compress_hook), powersgd (rank 4 from step 10, one DDP
bucket: on Gloo PowerSGD needs it), dynamiq3/4/5 (mode "dynamiq", ring),
bitsplit4 (INT4, two-step), lossless (ring); also available: gloo (DDP's
default all-reduce, no hook).

Model: llm_grads.py's Llama (transformers LlamaForCausalLM, random init,
RMSNorm, RoPE, SwiGLU, tied embedding) sized down for 2 shared CPU cores:
d 128, 4 layers, 4 heads, MLP 352, byte-level BPE vocabulary of 16,384
trained with `tokenizers` on a seeded sample of the machine's man pages (the
pre-training corpus of llm_grads.py, `--corpus-mb` MB; 5 % held out).
Each rank: `--batch` sequences of `--seq` tokens per step; AdamW, warm-up then
cosine decay, gradient clipping at 1.0. Time is the sum of the step times (max
over ranks; held-out evaluation excluded). Progress: one line per step from
rank 0. Writes experiments/results/time_to_accuracy/ (`--out DIR` elsewhere).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from datetime import timedelta

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
from experiments import results_io  # noqa: E402
from experiments.bench import benchlib  # noqa: E402

METHODS = ["none", "fp16", "powersgd", "dynamiq3", "dynamiq4", "dynamiq5", "bitsplit4", "lossless"]
STUDY = "time_to_accuracy"


# ---- data (made once in the parent, loaded by every rank) ---------------------------------
def make_data(args, path: str) -> dict:
    from experiments.studies import llm_grads

    t0 = time.time()
    text = llm_grads.man_corpus(args.corpus_mb, args.seed)
    tok = llm_grads.train_tokenizer([text], args.vocab)
    ids = llm_grads.encode(tok, text)
    cut = int(ids.numel() * 0.95)
    data = dict(train=ids[:cut].clone(), val=ids[cut:].clone(), vocab=tok.get_vocab_size(),
                digest=llm_grads.digest(text), chars=len(text), seconds=round(time.time() - t0, 1))
    torch.save(data, path)
    print(f"[data] man pages {len(text) / 1e6:.2f} MB ({data['digest']}), BPE vocabulary {data['vocab']}, "
          f"{cut} train + {ids.numel() - cut} held-out tokens, {data['seconds']} s", flush=True)
    return data


def get_batch(ids: torch.Tensor, key: int, batch: int, seq: int):
    g = torch.Generator().manual_seed(key)
    starts = torch.randint(0, ids.numel() - seq - 1, (batch,), generator=g)
    s = ids[starts[:, None] + torch.arange(seq + 1)[None, :]].long()
    return s[:, :-1], s[:, 1:]


def lr_at(args, step: int) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    frac = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


# ---- one rank -----------------------------------------------------------------------------
def rank_main(args, data_path: str, out_path: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import dynamiq
    from experiments.studies.llm_grads import llama, lm_loss

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    data = torch.load(data_path)
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=600))
    torch.manual_seed(args.seed)
    model = llama(data["vocab"], args.d, args.layers, args.heads, args.ffn, args.seq)
    params = [p for p in model.parameters() if p.requires_grad]
    nparam = sum(p.numel() for p in params)
    m = args.method
    state = None
    if m == "powersgd":
        ddp = DDP(model, bucket_cap_mb=nparam * 4 / 2**20 + 1)  # one bucket (Gloo: see FIELD-NOTES)
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
        st = ps.PowerSGDState(process_group=None, matrix_approximation_rank=args.powersgd_rank,
                              start_powerSGD_iter=10)
        ddp.register_comm_hook(st, ps.powerSGD_hook)
    else:
        ddp = DDP(model)
        if m == "fp16":
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
            ddp.register_comm_hook(None, fp16_compress_hook)
        elif m == "none":
            state = dynamiq.register(ddp, dynamiq.Config(mode="none", topology="ring"))
        elif m.startswith("dynamiq"):
            state = dynamiq.register(ddp, dynamiq.Config(mode="dynamiq", bits=float(m[7:]), topology="ring"))
        elif m.startswith("bitsplit"):
            state = dynamiq.register(ddp, dynamiq.Config(mode="bitsplit", bits=int(m[8:]), topology="twostep"))
        elif m == "lossless":
            state = dynamiq.register(ddp, dynamiq.Config(mode="lossless", topology="ring"))
        elif m != "gloo":
            raise ValueError(m)
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    log = {"method": m, "params": nparam, "steps": [], "loss": [], "wall": [], "eval": [], "saved": [],
           "bits": [], "t_codec_ms": []}
    wall = 0.0
    val_batches = [get_batch(data["val"], 10_000_000 + k, 16, args.seq) for k in range(args.eval_batches)]

    def evaluate():
        model.eval()
        with torch.no_grad():
            v = [lm_loss(model, x, y).item() for x, y in val_batches]
        model.train()
        return sum(v) / len(v)

    for step in range(args.steps):
        dist.barrier()
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(args, step)
        x, y = get_batch(data["train"], 1_000_003 * step + 7919 * rank, args.batch, args.seq)
        opt.zero_grad(set_to_none=True)
        loss = lm_loss(ddp, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        dt = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        wall += dt.item()
        lv = loss.detach().clone()
        dist.all_reduce(lv)
        log["steps"].append(step + 1)
        log["loss"].append(lv.item() / world)
        log["wall"].append(wall)
        sc = state.scalars("") if state is not None else {}
        if sc:
            log["saved"].append(sc.get("saved_fraction"))
            log["bits"].append(sc["bits_per_coord"])
            log["t_codec_ms"].append(sc["t_codec_ms"])
        ev = None
        if (step + 1) % args.eval_every == 0 or step == args.steps - 1:
            ev = evaluate() if rank == 0 else 0.0
            log["eval"].append((step + 1, wall, ev))
        if rank == 0:
            extra = f" saved {100 * sc['saved_fraction']:5.1f}%" if sc.get("saved_fraction") is not None else ""
            print(f"[{m}] step {step + 1:4d}/{args.steps} loss {log['loss'][-1]:.3f}"
                  + (f" held-out {ev:.3f}" if ev is not None else "")
                  + f" {dt.item() * 1e3:5.0f} ms wall {wall:6.1f} s{extra}", flush=True)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(log, f)
    dist.destroy_process_group()


def run_method(method: str, args, data_path: str, argv) -> dict:
    out = os.path.join(tempfile.mkdtemp(prefix="dynamiq-tta-"), "log.json")
    from experiments.netbed import run
    t0 = time.time()
    res = run(os.path.abspath(__file__), ["--worker", data_path, out, "--method", method] + list(argv),
              world=args.world, rate=args.rate, timeout=args.timeout, loopback=args.loopback, stream=0)
    if not os.path.exists(out):
        return {"method": method, "error": res.summary() if hasattr(res, "summary") else "failed"}
    log = json.load(open(out))
    log["launch_seconds"] = round(time.time() - t0, 1)
    return log


def time_to(log: dict, target: float):
    for step, wall, ev in log.get("eval", []):
        if ev <= target:
            return step, wall
    return None


def loadavg() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    worker = None
    if argv and argv[0] == "--worker":
        worker, argv = argv[1:3], argv[3:]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--method", default=None, help=argparse.SUPPRESS)
    p.add_argument("--methods", nargs="+", default=METHODS)
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--loopback", action="store_true")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--eval-every", type=int, default=15)
    p.add_argument("--eval-batches", type=int, default=4)
    p.add_argument("--corpus-mb", type=float, default=4.0)
    p.add_argument("--vocab", type=int, default=16384)
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=352)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--powersgd-rank", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--out", default=None, help=f"study folder instead of experiments/results/{STUDY}")
    args = p.parse_args(argv)
    if worker is not None:
        rank_main(args, *worker)
        return
    run = results_io.Run(STUDY, "Time to accuracy: a small Llama on the emulated cluster", script=__file__,
                         argv=argv, out=args.out)
    t_start = time.time()
    load0 = loadavg()
    # the tokenised corpus, made once per (corpus size, seed, vocabulary) and reused
    data_path = os.path.join(REPO, "experiments", "out", STUDY,
                             f"data-{args.corpus_mb:g}mb-seed{args.seed}-vocab{args.vocab}.pt")
    if os.path.exists(data_path):
        data = torch.load(data_path)
        print(f"[data] {data_path} (made in {data['seconds']} s)", flush=True)
    else:
        os.makedirs(os.path.dirname(data_path), exist_ok=True)
        data = make_data(args, data_path)
    logs = {}
    for m in args.methods:
        print(f"== {m} (load average {loadavg()}, {time.time() - t_start:.0f} s so far)", flush=True)
        mon = results_io.load.LoadMonitor()  # each method's own load record: a loaded row is marked
        logs[m] = run_method(m, args, data_path, argv)
        logs[m]["load"] = mon.finish()
        logs[m]["load_after"] = loadavg()
        print(results_io.load.format_record(logs[m]["load"]), flush=True)
    total_min = (time.time() - t_start) / 60
    load1 = loadavg()

    base_name = "none" if "none" in logs else next(iter(logs))
    base = logs[base_name]
    base_final = base["eval"][-1][2] if "eval" in base else None
    base_time = base["wall"][-1] if "wall" in base else None
    headers = ["method", "final held-out loss", f"vs {base_name}", "final train loss (10-step mean)", "time (s)",
               f"speed-up vs {base_name}", "s/step", "bytes saved vs ring", f"to within 2% of {base_name} final",
               "load (before -> after, others % before/during/after)"]
    table = []
    for m, log in logs.items():
        if "error" in log:
            table.append([m, "failed: " + log["error"][:120]] + [""] * (len(headers) - 2))
            continue
        fin = log["eval"][-1][2]
        total = log["wall"][-1]
        t2 = time_to(log, base_final * 1.02) if base_final else None
        saved = [s for s in log.get("saved", []) if s is not None]
        table.append([m, f"{fin:.4f}", f"{100 * (fin / base_final - 1):+.2f}%" if base_final else "-",
                      f"{sum(log['loss'][-10:]) / len(log['loss'][-10:]):.4f}",
                      f"{total:.1f}", f"{base_time / total:.2f}x" if base_time else "-",
                      f"{total / len(log['wall']):.3f}",
                      f"{100 * sum(saved) / len(saved):.1f}%" if saved else "-",
                      f"step {t2[0]}, {t2[1]:.0f} s" if t2 else "not reached",
                      results_io.load.summary(log["load"]) if "load" in log else log.get("load_after", "?")])
    where = "loopback (unshaped)" if args.loopback else f"netbed, {args.rate} links"
    nparams = next((l["params"] for l in logs.values() if "params" in l), 0)
    md = (f"{args.world} ranks, {where}; Llama d={args.d} x {args.layers} layers, {args.heads} heads, MLP "
          f"{args.ffn}, BPE vocabulary {data['vocab']} (tied embedding), {nparams / 1e6:.2f} M parameters; "
          f"batch {args.batch} x {args.seq} tokens per rank, {args.steps} steps, AdamW lr {args.lr} "
          f"(warm-up {args.warmup}, cosine to 10%), clip 1.0; data {data['chars'] / 1e6:.2f} MB of man pages "
          f"({data['digest']}). Whole sweep {total_min:.1f} min wall; load average {load0} at the start, "
          f"{load1} at the end (1/5/15 min).\n\n" + benchlib.markdown_table(headers, table))
    print(md)
    plot = None
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axs = plt.subplots(1, 2, figsize=(12, 4.5))
        for m, log in logs.items():
            if "error" in log:
                continue
            k = 10
            sm = [sum(log["loss"][max(0, i - k + 1):i + 1]) / len(log["loss"][max(0, i - k + 1):i + 1])
                  for i in range(len(log["loss"]))]
            ls = "--" if m in ("none", "gloo", "fp16", "powersgd") else "-"
            axs[0].plot(log["steps"], sm, ls, label=m)
            axs[1].plot(log["wall"], sm, ls, label=m)
        axs[0].set_xlabel("step")
        axs[1].set_xlabel("wall-clock (s, evaluation excluded)")
        for a in axs:
            a.set_ylabel("training loss (10-step mean)")
            a.legend(fontsize=7)
            a.set_ylim(top=min(a.get_ylim()[1], 8.0))
        fig.suptitle(f"Llama {nparams / 1e6:.1f} M, {args.world} ranks, {where}")
        fig.tight_layout()
        plot = f"{STUDY}.png"
        fig.savefig(run.path(plot), dpi=110)
    except ImportError:
        print("matplotlib not installed: no plot")
    meta = dict(args=vars(args), vocab=data["vocab"], corpus_digest=data["digest"], corpus_chars=data["chars"],
                sweep_minutes=round(total_min, 1), loadavg_start=load0, loadavg_end=load1,
                torch=torch.__version__, transformers=__import__("transformers").__version__)
    print(f"[{STUDY}]", run.write(STUDY, md, data={"meta": meta, "logs": logs}, plot=plot))


if __name__ == "__main__":
    main()
