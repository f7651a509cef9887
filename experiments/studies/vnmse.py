"""The DynamiQ paper's error tables (its table 3 and table 6) in miniature, on
real gradients.

    python experiments/studies/vnmse.py                 # ~10 min on 2 cores
    python experiments/studies/vnmse.py --steps 100 --captures 0 50 100 --out experiments/out/vnmse  # quicker

Writes experiments/results/vnmse/ (`--out DIR` for a scratch run elsewhere).

Gradients: a byte-level transformer LM (dynamiq.demo.TinyGPT, d=128, 4
layers, 0.8 M parameters) trained with AdamW on the text of CPython's pydoc
topics (ships with CPython: no downloads) by 8 simulated workers (each step
averages 8 per-worker gradients, each from its own batch). At each capture
step the 8 per-worker gradient vectors are kept. For each row, the all-reduce
of those vectors is run with the real codec and schedule
(`dynamiq.simulate`, identical to a real run) or, for MX formats, with a
plain-PyTorch reference of the same schedule using torchao's OCP MX
quantiser at every hop. vNMSE = ||X_hat - X||^2 / ||X||^2 against the exact
float64 sum, averaged over capture steps. Columns: ring n=4, butterfly n=4,
ring n=8 (n=4 uses the first 4 workers).

MX summation (paper appendix C): every hop dequantises, adds in float32 and
re-quantises with torchao's `to_mx` (block 32, E8M0 scales, E4M3 / E3M2 /
E2M1 elements); the owner quantises the full sum once for the all-gather.
With per-32 power-of-two block scales, appendix C's global pre-scaling factor
mu only shifts exponents and cannot change the error (no overflow is possible
when each block's scale follows its own maximum), so it is omitted.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from experiments import results_io  # noqa: E402
from experiments.bench import benchlib  # noqa: E402

import dynamiq  # noqa: E402
from dynamiq.demo import TinyGPT, corpus, get_batch, lm_loss  # noqa: E402


# ---- gradients ----------------------------------------------------------------------------
def capture_gradients(steps: int, captures: list, workers: int, seed: int = 0):
    torch.manual_seed(seed)
    model = TinyGPT(d=128, layers=4, ctx=64)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    data = corpus()
    params = list(model.parameters())
    out = {}
    t0 = time.time()
    for step in range(steps + 1):
        grads = []
        for w in range(workers):
            model.zero_grad()
            loss = lm_loss(model, *get_batch(data, w, step, 8, 64))
            loss.backward()
            grads.append(torch.cat([p.grad.reshape(-1) for p in params]).clone())
        if step in captures:
            out[step] = grads
            print(f"[grad] step {step:4d} loss {loss.item():.3f} captured ({len(grads[0])} coordinates, "
                  f"{time.time() - t0:.0f} s)", flush=True)
        if step == steps:
            break
        mean = torch.stack(grads).mean(0)
        off = 0
        for p in params:
            p.grad = mean[off:off + p.numel()].view_as(p).clone()
            off += p.numel()
        opt.step()
    return out


# ---- a plain-PyTorch reference all-reduce over any per-message quantiser ---------------------
def chunks_of(numel: int, n: int, align: int = 32):
    units = (numel + align - 1) // align
    b = [min(numel, (units * c // n) * align) for c in range(n + 1)]
    return [(b[c], b[c + 1]) for c in range(n)]


def ring_reference(xs, Q):
    n = len(xs)
    out = torch.empty_like(xs[0])
    for c, (lo, hi) in enumerate(chunks_of(xs[0].numel(), n)):
        acc = Q(xs[(c + 1) % n][lo:hi])
        for k in range(2, n + 1):
            acc = Q(acc + xs[(c + k) % n][lo:hi])  # the last hop is the owner c: it quantises once for the gather
        out[lo:hi] = acc
    return out


def butterfly_reference(xs, Q):
    n = len(xs)
    assert n & (n - 1) == 0, "reference butterfly: powers of two"
    parts = [x.clone() for x in xs]
    ranges = [(0, n)] * n
    bounds = chunks_of(xs[0].numel(), n)
    d = n // 2
    while d >= 1:
        new = [p.clone() for p in parts]
        new_ranges = []
        for r in range(n):
            lo, hi = ranges[r]
            half = (hi - lo) // 2
            keep = (lo, lo + half) if (r & d) == 0 else (lo + half, hi)
            a, b = bounds[keep[0]][0], bounds[keep[1] - 1][1]
            new[r][a:b] = parts[r][a:b] + Q(parts[r ^ d][a:b])  # the partner sends its partial sum
            new_ranges.append(keep)
        parts, ranges = new, new_ranges
        d //= 2
    out = torch.empty_like(xs[0])
    for r in range(n):
        a, b = bounds[r]
        out[a:b] = Q(parts[r][a:b])
    return out


def mx_quantiser(elem):
    from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx

    def Q(v):
        m = v.numel()
        pad = (-m) % 32
        vv = torch.nn.functional.pad(v.float(), (0, pad)) if pad else v.float()
        s, d = to_mx(vv, elem, 32)
        return to_dtype(d, s, elem, 32, torch.float32)[:m]
    return Q


def mx_elements():
    import torch as _t
    from torchao.prototype.mx_formats import constants as C
    return {"MXFP8 (E4M3)": _t.float8_e4m3fn, "MXFP6 (E3M2)": C.DTYPE_FP6_E3M2, "MXFP4 (E2M1)": _t.float4_e2m1fn_x2}


# ---- rows ---------------------------------------------------------------------------------
def rows(available):
    r = []
    for b in (3.0, 4.0, 5.0, 6.0):
        r.append((f"dynamiq {b:g} bits", "dq", dict(mode="dynamiq", bits=b)))
    # the paper's table 6 ladder (cumulative), at a 5-bit budget where widths vary
    flat32 = dict(hierarchical_scales=False, group_size=32, rounding="independent")
    r += [
        ("  ablation: uniform levels, one width (4), flat bf16 scales /32, independent", "dq",
         dict(mode="dynamiq", bits=5.0, widths=(4,), uniform_levels=True, **flat32)),
        ("  + non-uniform levels", "dq", dict(mode="dynamiq", bits=5.0, widths=(4,), **flat32)),
        ("  + variable widths {2,4,8}", "dq", dict(mode="dynamiq", bits=5.0, **flat32)),
        ("  + hierarchical scales (uint8 /16 under bf16 /256)", "dq",
         dict(mode="dynamiq", bits=5.0, rounding="independent")),
        ("  + correlated rounding (= dynamiq 5 bits)", "dq", dict(mode="dynamiq", bits=5.0)),
    ]
    for name in mx_elements():
        r.append((name, "mx", name))
    for b in (2, 3, 4, 5, 6, 7, 8):
        r.append((f"bitsplit INT{b}", "dq", dict(mode="bitsplit", bits=b, spike_reserve=False)))
        r.append((f"bitsplit INT{b} + spike reserve", "dq", dict(mode="bitsplit", bits=b, spike_reserve=True)))
    r.append(("lossless (error against mode none)", "dq", dict(mode="lossless")))
    return r


COLUMNS = [("ring n=4", "ring", 4), ("butterfly n=4", "butterfly", 4), ("ring n=8", "ring", 8)]


def vnmse(result, xs):
    exact = torch.stack([x.double() for x in xs]).sum(0)
    return float(((result.double() - exact) ** 2).sum() / (exact ** 2).sum())


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--captures", type=int, nargs="+", default=[0, 100, 300, 600])
    p.add_argument("--out", default=None, help="study folder to write instead of experiments/results/vnmse")
    p.add_argument("--grads-cache", default=None,
                   help="torch.save the captured gradients here, or load them if the file exists "
                        "(for the same --steps/--captures): re-evaluates rows without retraining")
    args = p.parse_args(argv)
    run = results_io.Run("vnmse", "vNMSE on real gradients (the DynamiQ paper's tables 3/4/6 in miniature)",
                         script=__file__, argv=argv, out=args.out)
    key = (args.steps, sorted(set(args.captures)))
    if args.grads_cache and os.path.exists(args.grads_cache):
        cached = torch.load(args.grads_cache)
        if cached["key"] != key:
            sys.exit(f"{args.grads_cache} holds steps/captures {cached['key']}, not {key}")
        grads = cached["grads"]
        print(f"[grad] loaded {sorted(grads)} from {args.grads_cache}", flush=True)
    else:
        grads = capture_gradients(args.steps, set(args.captures), workers=8)
        if args.grads_cache:
            torch.save({"key": key, "grads": grads}, args.grads_cache)
    available = dynamiq.available_modes()
    try:
        mxe = mx_elements()
    except ImportError:
        mxe = {}
    results = {}
    per_step = {}  # (label, column) -> {capture step: vNMSE}
    extra = {}
    all_rows = rows(available)
    t0 = time.time()
    for i, (label, kind, spec) in enumerate(all_rows):
        for col, topo, n in COLUMNS:
            vals, ratios = [], []
            err = None
            for step, g in sorted(grads.items()):
                xs = g[:n]
                try:
                    if kind == "dq":
                        if spec["mode"] not in available:
                            raise RuntimeError(f"mode {spec['mode']} not built")
                        cfg = dynamiq.Config(topology=topo, seed=step, **spec)
                        out, st = dynamiq.simulate(xs, cfg, return_stats=True)
                        res = out[0]
                        if spec["mode"] == "lossless":
                            ref, st_none = dynamiq.simulate(xs, dynamiq.Config(mode="none", topology=topo),
                                                            return_stats=True)
                            ratios.append(sum(s["bytes_sent"] for s in st) / sum(s["bytes_sent"] for s in st_none))
                            # lossless is measured against mode "none" (same float32 sums): exactly 0
                            vals.append(vnmse(res, [ref[0]] + [torch.zeros_like(ref[0])] * (len(xs) - 1)))
                            continue
                    else:
                        if spec not in mxe:
                            raise RuntimeError("torchao not installed")
                        Q = mx_quantiser(mxe[spec])
                        res = (ring_reference if topo == "ring" else butterfly_reference)(xs, Q)
                    vals.append(vnmse(res, xs))
                except Exception as e:  # noqa: BLE001 - shown as a failed cell
                    err = f"{type(e).__name__}: {e}"[:80]
                    break
            results[(label, col)] = err if err else sum(vals) / len(vals)
            if not err:
                per_step[(label, col)] = dict(zip(sorted(grads), vals))
            if ratios:
                extra[(label, col)] = sum(ratios) / len(ratios)
        print(f"[{i + 1}/{len(all_rows)} {time.time() - t0:5.0f}s] {label:70s} " +
              "  ".join(f"{results[(label, c)]:.2e}" if isinstance(results[(label, c)], float)
                        else str(results[(label, c)]) for c, _, _ in COLUMNS), flush=True)

    headers = ["scheme"] + [c for c, _, _ in COLUMNS]
    table = []
    for label, kind, spec in all_rows:
        cells = []
        for c, _, _ in COLUMNS:
            v = results[(label, c)]
            cell = f"{v:.2e}" if isinstance(v, float) else f"({v})"
            if (label, c) in extra:
                cell += f" (wire {extra[(label, c)]:.3f} of raw)"
            cells.append(cell)
        table.append([label] + cells)
    md = (f"vNMSE of the all-reduced sum of real TinyGPT gradients ({len(next(iter(grads.values()))[0])} coordinates), "
          f"averaged over capture steps {sorted(grads)}. dynamiq/bitsplit/lossless: the real codec and schedule "
          "(dynamiq.simulate); MX: torchao's OCP MX quantiser at every hop of the same schedule.\n\n"
          + benchlib.markdown_table(headers, table))
    # the average hides a trend: per capture step, ring n=4, for the headline rows
    col0 = COLUMNS[0][0]
    steps = sorted(grads)
    trend = [[label] + [f"{per_step[(label, col0)][st]:.2e}" for st in steps]
             for label, kind, _ in all_rows
             if (label, col0) in per_step and (label.startswith("dynamiq") or kind == "mx")]
    md += (f"\n\nPer capture step ({col0}):\n\n"
           + benchlib.markdown_table(["scheme"] + [f"step {st}" for st in steps], trend))
    print(md)
    run.write("vnmse", md, data={"results": {f"{k[0]} | {k[1]}": v for k, v in results.items()},
                                 "per_step": {f"{k[0]} | {k[1]}": {str(st): v for st, v in d.items()}
                                              for k, d in per_step.items()},
                                 "lossless_ratio": {f"{k[0]} | {k[1]}": v for k, v in extra.items()}})


if __name__ == "__main__":
    main()
