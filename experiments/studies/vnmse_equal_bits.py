"""vNMSE at equal wire bits: DynamiQ, MXFP, bitsplit and fp16/bf16 casts on
the gradients of two models, early and late in training, with a per-tensor
breakdown.

    python experiments/studies/vnmse_equal_bits.py            # gradients cached: ~20 min on 2 loaded cores
    python experiments/studies/vnmse_equal_bits.py --models tinygpt --captures step0 step600 --out experiments/out/eqb

Writes experiments/results/vnmse_equal_bits/ (`--out DIR` for a scratch run elsewhere).

Gradients: experiments/studies/llm_grads.py's caches (experiments/out/llm_grads/<model>.pt,
made first if missing: `llama` 72 min and `tinygpt` 40 min on the loaded 2-core machine): 8 workers' gradients per
capture point, per named parameter. Each capture point is laid out as DDP does
(parameters in reverse order, buckets closed at `--first-bucket-mb` 1 MB then
`--bucket-mb` 25 MB of float32) and every bucket is all-reduced on its own
(dynamiq's bit budget is per bucket). n = 4 uses the first 4 workers.

Rows, by wire bits per coordinate (metadata included):
  4.25 / 6.25 / 8.25: dynamiq `bits=b` (budget b exactly, checked), MXFP4 / MXFP6 /
      MXFP8 (OCP MX: block 32, E8M0 scale, round to nearest, torchao's rule, at every hop
      of the same schedule as in vnmse.py), bitsplit INT4 / INT6 / INT8 with groups of 128
      (code width + a bf16 scale and a bf16 zero per 128 values = +0.25; checked from the
      codec's own count), stochastic rounding, no spike reserve.
  5: dynamiq 5 bits (the paper's headline: 2.5-3x below MXFP8's vNMSE).
  16: the fp16 and bf16 casts (each hop rounds the partial sum to the type, as a
      16-bit NCCL all-reduce does after DDP's fp16/bf16 compression hook).
vNMSE = ||X_hat - X||^2 / ||X||^2 against the exact float64 sum of the workers'
(bf16-stored) gradients. The MX rows use a vectorised OCP MX quantiser compiled
with torch.compile, checked bit-identical to torchao's at the start of each run
(`--no-compile`: eager; `--ref-stride k`: MX and cast rows on every k-th block
of 32 in buckets over 1 Mi coordinates, for slow machines; default all).
Per tensor category (embedding, attention, MLP, norms,
TinyGPT's untied head): the category's own vNMSE and its share of the total squared error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
from experiments import results_io  # noqa: E402
from experiments.bench import benchlib  # noqa: E402
from experiments.studies import llm_grads  # noqa: E402
from experiments.studies.vnmse import butterfly_reference, mx_elements, mx_quantiser, ring_reference  # noqa: E402

import dynamiq  # noqa: E402

COLUMNS = [("ring n=4", "ring", 4), ("butterfly n=4", "butterfly", 4), ("ring n=8", "ring", 8),
           ("butterfly n=8", "butterfly", 8)]
CATS = ["embedding", "head", "attention", "MLP", "norms", "other"]
MX_NAMES = {4.25: "MXFP4 (E2M1)", 6.25: "MXFP6 (E3M2)", 8.25: "MXFP8 (E4M3)"}


def rows():
    r = [("fp16 cast", 16.0, "cast", torch.float16), ("bf16 cast", 16.0, "cast", torch.bfloat16)]
    for b, code in ((8.25, 8), (6.25, 6), (4.25, 4)):
        r.append((f"dynamiq {b:g}", b, "dq", dict(mode="dynamiq", bits=b)))
        r.append((MX_NAMES[b], b, "mx", MX_NAMES[b]))
        r.append((f"bitsplit INT{code} /128", b, "dq",
                  dict(mode="bitsplit", bits=code, group_size=128, spike_reserve=False)))
    r.append(("dynamiq 5", 5.0, "dq", dict(mode="dynamiq", bits=5.0)))
    return r


def variant_rows(bits: float = 5.0):
    """dynamiq at one budget with Config fields changed (no codec change): item 4's search space."""
    d = dict(mode="dynamiq", bits=bits)
    v = [("default (S=256, g=16)", {}),
         ("S=64", dict(supergroup_size=64)), ("S=128", dict(supergroup_size=128)),
         ("S=512", dict(supergroup_size=512)), ("S=1024", dict(supergroup_size=1024)),
         ("g=8", dict(group_size=8)), ("g=32", dict(group_size=32)), ("g=32, S=512", dict(group_size=32, supergroup_size=512)),
         ("g=64, S=1024", dict(group_size=64, supergroup_size=1024)),
         ("eps4=0 (even levels at width 4)", dict(eps=(-1, -1, 0.0, -1))),
         ("eps4=0.15", dict(eps=(-1, -1, 0.15, -1))), ("eps4=0.5", dict(eps=(-1, -1, 0.5, -1))),
         ("eps8=0 (even levels at width 8)", dict(eps=(-1, -1, -1, 0.0))),
         ("widths (1, 2, 4, 8)", dict(widths=(1, 2, 4, 8))), ("widths (4, 8)", dict(widths=(4, 8))),
         ("allocator exact", dict(allocator="exact"))]
    return [(f"dynamiq {bits:g} {name}", bits, "dq", dict(d, **kw)) for name, kw in v]


def ddp_buckets(names, numels, first_mb: float, cap_mb: float):
    """DDP's default bucket assignment: parameters in reverse order, a bucket closes once it holds
    >= its cap in float32 bytes (first bucket `first_mb`, then `cap_mb`); cap 0: one bucket."""
    if cap_mb <= 0:
        return [list(reversed(range(len(names))))]
    out, cur, size = [], [], 0
    for i in reversed(range(len(names))):
        cur.append(i)
        size += numels[i] * 4
        if size >= (first_mb if not out else cap_mb) * 2 ** 20:
            out.append(cur)
            cur, size = [], 0
    if cur:
        out.append(cur)
    return out


# (exponent bits, mantissa bits, exponent bias, largest value, largest power of two) of the MX elements
MX_FORMATS = {"MXFP8 (E4M3)": (4, 3, 7, 448.0, 8), "MXFP6 (E3M2)": (3, 2, 3, 28.0, 4), "MXFP4 (E2M1)": (2, 1, 1, 6.0, 2)}


def mx_fast(name):
    """OCP MX quantise-dequantise (block 32, E8M0 scale = 2^(floor(log2 amax) - emax), elements
    round-to-nearest-even with subnormals, saturating), in a few vectorised torch ops. Written to
    be identical to torchao's to_mx/to_dtype (FLOOR scale mode), which is ~50x slower on the CPU
    for FP6/FP4; check_mx() asserts the two agree bit for bit on the data before a run."""
    _, mbits, bias, vmax, emax = MX_FORMATS[name]

    def Q(v):
        m = v.numel()
        pad = (-m) % 32
        x = (torch.nn.functional.pad(v.float(), (0, pad)) if pad else v.float()).view(-1, 32)
        amax = x.abs().amax(1, keepdim=True)
        e = (((amax.view(torch.int32) >> 23) & 0xFF) - 127 - emax).clamp(-126, 127)  # torchao: scale >= 2^-126
        scale = ((e + 127) << 23).view(torch.float32)
        y = (x / scale).clamp(-vmax, vmax)
        ey = (((y.abs().view(torch.int32) >> 23) & 0xFF) - 127).clamp(min=1 - bias)  # element exponent
        inv_q = ((127 + mbits - ey) << 23).view(torch.float32)  # 1 / spacing of the element's binade
        y = torch.round(y * inv_q) / inv_q
        return (y * scale).view(-1)[:m]
    return Q


_COMPILED = {}


def mx_q(name):
    """mx_fast(name), compiled with torch.compile when COMPILE is set (20-40x less CPU than eager;
    ~35 s to compile each format on first use, then cached by inductor)."""
    if name not in _COMPILED:
        q = mx_fast(name)
        _COMPILED[name] = torch.compile(q, dynamic=True) if COMPILE else q
    return _COMPILED[name]


COMPILE = True


def check_mx(sample: torch.Tensor) -> str:
    """Asserts mx_fast == torchao's reference on `sample` for the three formats."""
    try:
        elems = mx_elements()
    except ImportError:
        return "torchao not installed: the MX rows use the built-in quantiser unchecked"
    for name in MX_FORMATS:
        a, b = mx_q(name)(sample), mx_quantiser(elems[name])(sample)
        if not torch.equal(a, b):
            bad = (a != b).nonzero()[:5].view(-1)
            raise AssertionError(f"{name}: built-in MX quantiser differs from torchao's at {bad.tolist()}: "
                                 f"{a[bad].tolist()} vs {b[bad].tolist()}")
    return (f"MX quantiser ({'torch.compile' if COMPILE else 'eager'}) identical to torchao "
            f"{__import__('torchao').__version__}'s on {sample.numel()} values")


def all_reduce(xs, kind, spec, topo, seed, call):
    """One bucket's all-reduced sum (and dynamiq's stats) for one row."""
    if kind == "dq":
        cfg = dynamiq.Config(topology=topo, seed=seed, **spec)
        out, st = dynamiq.simulate(xs, cfg, return_stats=True, call_index=call)
        return out[0], st[0]
    if kind == "mx":
        Q = mx_q(spec)
    else:
        def Q(v, dt=spec):
            return v.to(dt).float()
        xs = [Q(x) for x in xs]  # the hook casts each rank's bucket first
    return (ring_reference if topo == "ring" else butterfly_reference)(xs, Q), None


REF_SAMPLE_ABOVE = 1 << 20  # buckets with more coordinates than this are sampled for MX and casts


def evaluate(cache, captures, row_list, columns, first_mb, cap_mb, log, light=(), ref_stride=1):
    names, shapes = cache["names"], cache["shapes"]
    numels = [int(torch.Size(s).numel()) for s in shapes]
    cats = [llm_grads.category(n) for n in names]
    buckets = ddp_buckets(names, numels, first_mb, cap_mb)
    out = {}
    for ci, cap in enumerate(captures):
        grads = cache["captures"][cap]["grads"]
        W = max(n for _, _, n in columns)
        bucket_xs = [[torch.cat([grads[names[i]][w].reshape(-1).float() for i in b]) for w in range(W)]
                     for b in buckets]  # built once per capture point
        exacts = {}  # (bucket, n) -> float64 sum
        for label, bits, kind, spec in row_list:
            for col, topo, n in (columns[:1] if cap in light else columns):
                t0 = time.time()
                err_c = {c: 0.0 for c in CATS}
                ref_c = {c: 0.0 for c in CATS}
                err_p, ref_p = {}, {}
                wire, wunits = [], {}
                for bi, b in enumerate(buckets):
                    xs = bucket_xs[bi][:n]
                    keep = None
                    if kind != "dq" and ref_stride > 1 and xs[0].numel() > REF_SAMPLE_ABOVE:
                        # the plain-PyTorch references on every ref_stride-th block of 32 (the same blocks
                        # as in the whole bucket; only the hop order a block sees can differ)
                        keep = (torch.arange(xs[0].numel()) // 32) % ref_stride == 0
                        full = xs[0].numel()
                        xs = [x[keep] for x in xs]
                    if keep is None:
                        if (bi, n) not in exacts:
                            exacts[(bi, n)] = torch.stack([x.double() for x in xs]).sum(0)
                        exact = exacts[(bi, n)]
                    else:
                        exact = torch.stack([x.double() for x in xs]).sum(0)
                    res, st = all_reduce(xs, kind, spec, topo, seed=1000 * ci + bi, call=bi)
                    if st is not None:
                        if st["path"] != "compressed":
                            raise RuntimeError(f"{label}: bucket {bi} took path {st['path']}")
                        wire.append((st["bits_per_coord"], xs[0].numel()))
                        for k, v in st["width_units"].items():
                            wunits[k] = wunits.get(k, 0) + v
                    e2 = (res.double() - exact) ** 2
                    r2 = exact ** 2
                    if keep is not None:
                        e2 = torch.zeros(full, dtype=torch.float64).masked_scatter_(keep, e2)
                        r2 = torch.zeros(full, dtype=torch.float64).masked_scatter_(keep, r2)
                    off = 0
                    for i in b:
                        m = numels[i]
                        ep, rp = float(e2[off:off + m].sum()), float(r2[off:off + m].sum())
                        err_p[names[i]], ref_p[names[i]] = ep, rp
                        err_c[cats[i]] += ep
                        ref_c[cats[i]] += rp
                        off += m
                E, R = sum(err_c.values()), sum(ref_c.values())
                rec = dict(vnmse=E / R, err=err_c, ref=ref_c, err_param=err_p, ref_param=ref_p,
                           seconds=round(time.time() - t0, 2))
                if wire:
                    rec["bits_per_coord"] = sum(b * m for b, m in wire) / sum(m for _, m in wire)
                    rec["width_units"] = {str(k): v for k, v in wunits.items()}
                out[(cap, label, col)] = rec
                log(f"{cap:8s} {label:22s} {col:14s} vNMSE {E / R:.3e}"
                    + (f"  ({rec['bits_per_coord']:.3f} bits)" if wire else "") + f"  {time.time() - t0:5.1f} s")
    return out, buckets


def detail_captures(caps, res, columns):
    """The captures with every column measured: the first and last of pre-training and the last
    fine-tuning one."""
    full = [c for c in caps if all(any(k[0] == c and k[2] == col for k in res) for col, _, _ in columns)]
    pre = [c for c in full if not c.startswith("ft")]
    ft = [c for c in full if c.startswith("ft")]
    out = pre[:1] + pre[-1:] + ft[-1:]
    return list(dict.fromkeys(out))


def fmt(v):
    return f"{v:.2e}"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["tinygpt", "llama"])
    p.add_argument("--captures", nargs="+", default=None,
                   help="capture labels to evaluate (default: all in each cache, e.g. step0 step600)")
    p.add_argument("--columns", nargs="+", default=[c for c, _, _ in COLUMNS])
    p.add_argument("--light", nargs="*", default=["llama:step0", "llama:step40", "llama:ft0"],
                   help="MODEL:CAPTURE points measured in the first column only (time; 2 shared cores)")
    p.add_argument("--variants", nargs="*", default=["tinygpt:step600", "llama:step80", "llama:ft12"],
                   help="MODEL:CAPTURE points where dynamiq 5 runs with other Config fields (first column only; "
                        "part dynamiq_config); none: skip")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1: on a loaded 2-core machine, 2 threads spin-wait on each other)")
    p.add_argument("--no-compile", action="store_true", help="MX quantiser in eager mode (slower, no compiler)")
    p.add_argument("--ref-stride", type=int, default=1,
                   help="MX and cast rows: buckets over 1 Mi coordinates use every k-th block of 32 (1: all)")
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--first-bucket-mb", type=float, default=1.0)
    p.add_argument("--cache-dir", default=llm_grads.DEFAULT_DIR)
    p.add_argument("--out", default=None, help="study folder instead of experiments/results/vnmse_equal_bits")
    p.add_argument("--eval-dir", default=os.path.join(REPO, "experiments", "out", "vnmse_equal_bits"),
                   help="where each model's evaluation is saved; an equal one (same cache file, rows, columns) "
                        "is reused and the README says when it ran")
    p.add_argument("--fresh", action="store_true", help="re-evaluate even if a saved evaluation matches")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    global COMPILE
    COMPILE = not args.no_compile
    run = results_io.Run("vnmse_equal_bits", "vNMSE at equal wire bits, per tensor (TinyGPT and a 21M Llama)",
                         script=__file__, argv=argv, out=args.out)
    columns = [c for c in COLUMNS if c[0] in args.columns]
    row_list = rows()
    t_start = time.time()

    def log(msg):
        print(f"[{time.time() - t_start:6.0f} s] {msg}", flush=True)

    results, metas, variants, evaluated = {}, {}, {}, {}  # metas: per model, plus "mx_check"
    for model in args.models:
        path = os.path.join(args.cache_dir, f"{model}.pt")
        if not os.path.exists(path):
            log(f"{path} missing: running llm_grads.py --model {model}")
            llm_grads.main(["--model", model, "--cache", path])
        cache = llm_grads.load(path)
        if "mx_check" not in metas:
            first = cache["captures"][next(iter(cache["captures"]))]["grads"]
            sample = torch.cat([g[0].reshape(-1).float() for g in first.values()])[: 1 << 21]
            metas["mx_check"] = check_mx(sample)
            log(metas["mx_check"])
        caps = [c for c in cache["captures"] if args.captures is None or c in args.captures]
        caps.sort(key=lambda c: (c.startswith("ft"), cache["captures"][c]["step"]))
        light = {c.split(":", 1)[1] for c in args.light if c.split(":", 1)[0] == model}
        vcaps = [c.split(":", 1)[1] for c in args.variants if c.split(":", 1)[0] == model]
        vcaps = [c for c in vcaps if c in cache["captures"]]
        # an evaluation of the same cache with the same rows is reused (--fresh: never)
        key = dict(cache=[os.path.getsize(path), int(os.path.getmtime(path))], captures=caps, light=sorted(light),
                   columns=[c[0] for c in columns], rows=[r[0] for r in row_list], variants=vcaps,
                   buckets=[args.first_bucket_mb, args.bucket_mb], ref_stride=args.ref_stride)
        saved = os.path.join(args.eval_dir, f"{model}.eval.pt")
        old = torch.load(saved, weights_only=False) if os.path.exists(saved) and not args.fresh else None
        if old is not None and old["key"] == key:
            res, vres, buckets = old["res"], old["vres"], old["buckets"]
            log(f"{model}: evaluation of {old['date']} reused ({saved})")
            evaluated[model] = old["date"]
        else:
            t_eval = time.time()
            res, buckets = evaluate(cache, caps, row_list, columns, args.first_bucket_mb, args.bucket_mb, log,
                                    light, args.ref_stride)
            vres = evaluate(cache, vcaps, variant_rows(5.0), columns[:1], args.first_bucket_mb, args.bucket_mb,
                            log)[0] if vcaps else {}
            evaluated[model] = results_io.when(t_eval)
            os.makedirs(args.eval_dir, exist_ok=True)
            torch.save(dict(key=key, res=res, vres=vres, buckets=buckets, date=evaluated[model]), saved)
        results[model] = res
        if vres:
            variants[model] = vres
        meta = dict(cache["meta"])
        meta.pop("losses", None)
        meta["captures"] = caps
        meta["capture_loss"] = {c: cache["captures"][c]["loss"] for c in caps}
        meta["buckets"] = [sum(int(torch.Size(cache["shapes"][i]).numel()) for i in b) for b in buckets]
        meta["evaluated"] = evaluated[model]
        metas[model] = meta
    mx_check = metas.pop("mx_check", "")
    md = report(results, metas, row_list, columns) + f"\n{mx_check}.\n"
    plot = plot_results(results, metas, row_list, run.path("vnmse_equal_bits.png"))
    print(md)
    payload = {"models": metas, "mx_check": mx_check,
               "results": {m: {" | ".join(k): v for k, v in r.items()} for m, r in results.items()}}
    print("[vnmse_equal_bits]", run.write("vnmse_equal_bits", md, data=payload, plot=plot))
    if variants:
        md = variant_report(variants, results, columns[0][0])
        print(md)
        payload = {"results": {m: {" | ".join(k): v for k, v in r.items()} for m, r in variants.items()}}
        print("[vnmse_equal_bits]", run.write("dynamiq_config", md, data=payload))


def variant_report(variants, results, col) -> str:
    hdr = ["dynamiq 5 with"] + [f"{m} {cap}" for m, r in variants.items() for cap in dict.fromkeys(k[0] for k in r)]
    keys = [(m, cap) for m, r in variants.items() for cap in dict.fromkeys(k[0] for k in r)]
    labels = list(dict.fromkeys(k[1] for r in variants.values() for k in r))
    base = {(m, cap): variants[m][(cap, labels[0], col)]["vnmse"] for m, cap in keys}
    tab = []
    for lab in labels:
        cells = []
        for m, cap in keys:
            rec = variants[m].get((cap, lab, col))
            cells.append("-" if rec is None else
                         f"{rec['vnmse']:.2e} ({base[(m, cap)] / rec['vnmse']:.2f}x, {rec['bits_per_coord']:.3f} b)")
        tab.append([lab.replace("dynamiq 5 ", "")] + cells)
    tab.append(["(MXFP8 at 8.25 bits)"] + [f"{results[m][(cap, 'MXFP8 (E4M3)', col)]['vnmse']:.2e}" for m, cap in keys])
    return (f"dynamiq at 5 bits with other existing Config fields ({col}; simulation only, no codec change): "
            "vNMSE (the default's vNMSE divided by this one: above 1 is better; wire bits per coordinate). "
            "S = supergroup_size, g = group_size, eps4/eps8 = eps at width 4/8.\n\n"
            + benchlib.markdown_table(hdr, tab) + "\n")


def report(results, metas, row_list, columns) -> str:
    parts = []
    for model, res in results.items():
        m = metas[model]
        desc = (f"{m['params'] / 1e6:.2f} M parameters, vocabulary {m['vocab']}, "
                f"{len(m['buckets'])} DDP bucket(s) of {', '.join(f'{b / 1e6:.2f}' for b in m['buckets'])} M")
        parts.append(f"### {model} ({desc}; evaluated {m['evaluated']})\n")
        for cap in m["captures"]:
            hdr = ["scheme", "wire bits"] + [c for c, _, _ in columns]
            tab = []
            for label, bits, _, _ in row_list:
                if (cap, label, columns[0][0]) not in res:
                    continue
                wb = res[(cap, label, columns[0][0])].get("bits_per_coord", bits)
                tab.append([label, f"{wb:.3f}"] + [fmt(res[(cap, label, c)]["vnmse"]) if (cap, label, c) in res
                                                    else "-" for c, _, _ in columns])
            loss = m["capture_loss"].get(cap)
            parts.append(f"**{cap}** (training loss {loss:.2f})\n" if loss == loss else f"**{cap}**\n")
            parts.append(benchlib.markdown_table(hdr, tab) + "\n")
        # per category, ring n=4, early and late
        col = columns[0][0]
        for cap in detail_captures(m["captures"], res, columns):
            hdr = ["scheme (" + col + ", " + cap + ")"]
            present = [c for c in CATS if res[(cap, "dynamiq 5", col)]["ref"][c] > 0]
            any_rec = res[(cap, "dynamiq 5", col)]
            tot = sum(any_rec["ref"].values())
            hdr += [f"{c} ({any_rec['ref'][c] / tot:.0%} of ||X||^2)" for c in present]
            tab = []
            for label, bits, _, _ in row_list:
                rec = res[(cap, label, col)]
                E = sum(rec["err"].values())
                tab.append([label] + [f"{rec['err'][c] / rec['ref'][c]:.2e} ({rec['err'][c] / E:.0%})"
                                      for c in present])
            parts.append(f"Per tensor category, {model} {cap}: the category's vNMSE (its share of the "
                         "total squared error)\n")
            parts.append(benchlib.markdown_table(hdr, tab) + "\n")
            # the tensors that carry dynamiq 5's error
            d5, mx8 = res[(cap, "dynamiq 5", col)], res[(cap, "MXFP8 (E4M3)", col)]
            E = sum(d5["err"].values())
            top = sorted(d5["err_param"], key=lambda k: -d5["err_param"][k])[:6]
            tab = [[k, f"{d5['ref_param'][k] / tot:.1%}", f"{d5['err_param'][k] / E:.1%}",
                    fmt(d5["err_param"][k] / d5["ref_param"][k]),
                    fmt(mx8["err_param"][k] / mx8["ref_param"][k]) if mx8["ref_param"][k] else "-"]
                   for k in top]
            parts.append(f"Tensors with the largest share of dynamiq 5's squared error, {model} {cap} ({col})\n")
            parts.append(benchlib.markdown_table(["tensor", "share of ||X||^2", "share of dynamiq 5 error",
                                                  "vNMSE dynamiq 5", "vNMSE MXFP8"], tab) + "\n")
    # headline: dynamiq 5 and the equal-bits ratios against MX
    hdr = ["model", "capture"] + [c for c, _, _ in columns]
    tab = []
    for model, res in results.items():
        for cap in metas[model]["captures"]:
            for a, b in (("dynamiq 5", "MXFP8 (E4M3)"), ("dynamiq 8.25", "MXFP8 (E4M3)"),
                         ("dynamiq 6.25", "MXFP6 (E3M2)"), ("dynamiq 4.25", "MXFP4 (E2M1)")):
                tab.append([model, f"{cap}: {a} / {b}"] +
                           [f"{res[(cap, a, c)]['vnmse'] / res[(cap, b, c)]['vnmse']:.2f}" if (cap, a, c) in res
                            else "-" for c, _, _ in columns])
    parts.insert(0, "Ratio of vNMSEs (below 1: DynamiQ has the lower error)\n\n"
                 + benchlib.markdown_table(hdr, tab) + "\n")
    return "\n".join(parts)


def plot_results(results, metas, row_list, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    models = list(results)
    fig, axes = plt.subplots(2, len(models), figsize=(6.5 * len(models), 9), squeeze=False)
    fams = {"dynamiq": ("dynamiq", "C0"), "MX": ("MXFP", "C1"), "bitsplit": ("bitsplit", "C2")}
    for j, model in enumerate(models):
        res, m = results[model], metas[model]
        caps = m["captures"]
        show = list(dict.fromkeys([caps[0], caps[-1]]))
        if any(c.startswith("ft") for c in caps):
            pre = [c for c in caps if not c.startswith("ft")]
            show = list(dict.fromkeys([pre[0], pre[-1], [c for c in caps if c.startswith("ft")][-1]]))
        ax = axes[0][j]
        col = "ring n=4"
        for ci, cap in enumerate(show):
            for fam, (prefix, color) in fams.items():
                pts = sorted((b, res[(cap, lab, col)]["vnmse"]) for lab, b, _, _ in row_list
                             if lab.startswith(prefix) and b in (4.25, 6.25, 8.25))
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", color=color,
                        linestyle=["-", "--", ":"][ci], label=f"{fam} {cap}")
            ax.plot([5.0], [res[(cap, "dynamiq 5", col)]["vnmse"]], marker="*", markersize=12, color="C0",
                    linestyle="none")
        for lab in ("fp16 cast", "bf16 cast"):
            ax.axhline(res[(show[-1], lab, col)]["vnmse"], color="grey", lw=0.8,
                       linestyle="-" if lab.startswith("fp16") else "-.")
        ax.set_yscale("log")
        ax.set_xlabel("wire bits per coordinate")
        ax.set_ylabel(f"vNMSE ({col})")
        ax.set_title(f"{model} ({m['params'] / 1e6:.1f} M): star = dynamiq 5; grey = fp16 / bf16 (-.)")
        ax.legend(fontsize=7, ncol=2)
        ax = axes[1][j]
        cap = [c for c in show if not c.startswith("ft")][-1]
        labs = ["dynamiq 5", "MXFP8 (E4M3)", "dynamiq 6.25", "MXFP6 (E3M2)", "bitsplit INT6 /128"]
        rec0 = res[(cap, labs[0], col)]
        cats = [c for c in CATS if rec0["ref"][c] > 0]
        w = 0.8 / len(labs)
        for k, lab in enumerate(labs):
            rec = res[(cap, lab, col)]
            ax.bar([i + k * w for i in range(len(cats))], [rec["err"][c] / rec["ref"][c] for c in cats], w,
                   label=lab)
        ax.set_xticks([i + 0.4 - w / 2 for i in range(len(cats))])
        ax.set_xticklabels(cats)
        ax.set_yscale("log")
        ax.set_ylabel(f"category vNMSE ({col}, {cap})")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


if __name__ == "__main__":
    main()
