"""Per-worker gradients of an LLM-shaped model, captured during a short
pre-training run and a fine-tuning stand-in, cached for the error studies
(vnmse_equal_bits.py). No downloads: the text and the tokenizer come from
this machine.

    python experiments/studies/llm_grads.py                  # 72 min on 2 cores loaded by other jobs (~15-20 idle)
    python experiments/studies/llm_grads.py --model tinygpt  # the vnmse.py TinyGPT gradients (40 min loaded)

Writes experiments/out/llm_grads/<model>.pt (`--cache FILE` elsewhere):
per capture point, per named parameter, the 8 workers' gradients (bf16 by
default, `--dtype float32`), with the run's settings, losses, timings and the
corpus digests. Same machine, same seed: same file (torch's CPU kernels are
deterministic for this model at a fixed thread count; `--threads`).

Model (`--model llama`): a Llama-style decoder from `transformers`
(LlamaConfig, random init: RMSNorm, rotary positions, SwiGLU MLP, tied input
and output embedding as in Llama 3.2 1B and Gemma 1B), d=512, 4 layers, 8
heads, MLP 1408, a byte-level BPE vocabulary of 16,384 trained with
`tokenizers` on the two corpora. 21.24 M parameters (8.39 M of them the tied
embedding). Sized for 2 CPU cores: 4 layers, 64-token sequences, 2 per worker, 80 + 12 steps.

Data: pre-training corpus = Debian's man pages (/usr/share/man/man[1-8],
gzip'd groff, decompressed in Python, markup stripped), a seeded sample of
`--corpus-mb` MB; fine-tuning corpus = CPython's pydoc topics (the TinyGPT
corpus), a different domain (Python reference prose and code).

Training: data parallel with `--workers` 8 simulated workers, each a
micro-batch of `--micro-batch` sequences of `--seq` tokens; a step averages the
8 per-worker gradients (computed as one batched backward pass, which gives the
same mean) and takes an AdamW step (lr warm-up then cosine decay; the
fine-tuning phase restarts at a lower constant lr). At each capture point every
worker's gradient is computed on its own micro-batch, as DDP's ranks do, and
kept. Capture points: pre-training steps `--captures` (step 0 = random init),
then `ft0` (the first fine-tuning gradient, the paper's figure 1 point) and
`ft<k>` after `--ft-steps` fine-tuning steps.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import hashlib
import os
import random
import re
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)

DEFAULT_DIR = os.path.join(REPO, "experiments", "out", "llm_grads")


# ---- text ---------------------------------------------------------------------------------
_ESC = re.compile(r"\\f(\[[^\]]*\]|\(..|.)|\\s[-+]?\d|\\\*(\(..|\[[^\]]*\]|.)|\\\((..)|\\[&|^%]|\\c")


_TEXT_MACROS = {"TH", "SH", "SS", "B", "I", "BR", "BI", "IB", "IR", "RB", "RI", "SM", "SB", "IP", "TP", "UR", "MT",
                "Nm", "Nd", "Sh", "Ss", "Ar", "Fl", "Op", "It", "Xr", "Pa", "Cm", "Em", "Dv", "Va", "Fn", "Ft", "Fa",
                "Li", "Ql", "Sy", "Ev", "Er", "Dl", "Ic", "Aq", "Dq", "Sq", "Pq", "Qq"}


def strip_roff(src: str) -> str:
    """groff man source -> plain-ish text: comments and formatting requests dropped, the text
    arguments of font and section macros kept, font/size/string escapes removed."""
    out = []
    for line in src.splitlines():
        if line.startswith(('.\\"', "'\\\"", '\\"')):
            continue
        if line.startswith((".", "'")):
            parts = line[1:].split(None, 1)
            if len(parts) < 2 or parts[0] not in _TEXT_MACROS:
                continue
            line = parts[1].replace('"', "")
            if parts[0] in ("IP", "TP"):
                line = re.sub(r"\s+-?[0-9.]+[mnuiPcp]?$", "", line)
        line = _ESC.sub("", line).replace("\\-", "-").replace("\\e", "\\").replace("\\ ", " ")
        if line.strip():
            out.append(line)
    return "\n".join(out)


def man_corpus(mb: float, seed: int) -> str:
    """A seeded sample of the English man pages (the Google Cloud CLI's excepted), about `mb` MB of text."""
    files = sorted(f for f in glob.glob("/usr/share/man/man[1-8]/*.gz")
                   if not os.path.basename(f).startswith("gcloud"))  # 16k near-identical CLI pages
    if not files:
        sys.exit("no man pages under /usr/share/man/man[1-8] (apt-get install man-db manpages)")
    random.Random(seed).shuffle(files)
    parts, size = [], 0
    for f in files:
        try:
            text = strip_roff(gzip.open(f).read().decode("utf-8", "replace"))
        except (OSError, EOFError):
            continue
        if len(text) < 200:  # .so redirections and stubs
            continue
        parts.append(text)
        size += len(text)
        if size >= mb * 1e6:
            break
    return "\n\n".join(parts)


def pydoc_corpus() -> str:
    from pydoc_data import topics

    return "\n\n".join(topics.topics[k] for k in sorted(topics.topics))


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def train_tokenizer(texts, vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|eos|>"])
    chunks = [c for t in texts for c in t.split("\n\n")]  # paragraphs: keeps the trainer's memory small
    tok.train_from_iterator(chunks, trainer=trainer)
    return tok


def encode(tok, text: str) -> torch.Tensor:
    eos = tok.token_to_id("<|eos|>")
    ids = []
    for doc in text.split("\n\n"):
        ids += tok.encode(doc + "\n\n").ids
    ids.append(eos)
    return torch.tensor(ids, dtype=torch.int32)


def batch(data: torch.Tensor, worker: int, step: int, phase: int, mb: int, seq: int):
    g = torch.Generator().manual_seed(1_000_003 * step + 7919 * worker + 104_729 * phase)
    starts = torch.randint(0, data.numel() - seq - 1, (mb,), generator=g)
    idx = starts[:, None] + torch.arange(seq + 1)[None, :]
    s = data[idx].long()
    return s[:, :-1], s[:, 1:]


# ---- models -------------------------------------------------------------------------------
def llama(vocab: int, d: int, layers: int, heads: int, ffn: int, seq: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=d, intermediate_size=ffn, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=seq,
                      tie_word_embeddings=True, rms_norm_eps=1e-5, attention_dropout=0.0)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg)


def category(name: str) -> str:
    """embedding / attention / MLP / norms / head: for the per-tensor tables (Llama and TinyGPT names)."""
    if "embed" in name or name.startswith(("tok.", "pos.")):
        return "embedding"
    if name.startswith("head."):
        return "head"
    if "norm" in name or ".ln" in name or name.startswith("ln."):
        return "norms"
    if "attn" in name:
        return "attention"
    if "mlp" in name:
        return "MLP"
    return "other"


def lm_loss(model, x, y):
    logits = model(input_ids=x).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1))


# ---- the run ------------------------------------------------------------------------------
def run_llama(args) -> dict:
    t_start = time.time()
    pre = man_corpus(args.corpus_mb, args.seed)
    ft = pydoc_corpus()
    print(f"[data] man pages {len(pre) / 1e6:.1f} MB ({digest(pre)}), pydoc topics {len(ft) / 1e6:.2f} MB "
          f"({digest(ft)}), {time.time() - t_start:.0f} s", flush=True)
    tok = train_tokenizer([pre, ft], args.vocab)
    data_pre, data_ft = encode(tok, pre), encode(tok, ft)
    vocab = tok.get_vocab_size()
    print(f"[tokenizer] BPE vocabulary {vocab}: {data_pre.numel()} + {data_ft.numel()} tokens "
          f"({len(pre) / data_pre.numel():.2f} / {len(ft) / data_ft.numel():.2f} chars per token), "
          f"{time.time() - t_start:.0f} s", flush=True)

    torch.manual_seed(args.seed)
    model = llama(vocab, args.d, args.layers, args.heads, args.ffn, args.seq)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    nparam = sum(p.numel() for _, p in named)
    print(f"[model] Llama d={args.d} layers={args.layers} heads={args.heads} ffn={args.ffn} vocab={vocab}: "
          f"{nparam / 1e6:.2f} M parameters ({len(named)} tensors)", flush=True)
    opt = torch.optim.AdamW([p for _, p in named], lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    W, mb, seq = args.workers, args.micro_batch, args.seq
    total = args.steps + args.ft_steps
    ft_points = {args.steps: "ft0", total: f"ft{args.ft_steps}"} if args.ft_steps else {args.steps: "ft0"}
    captures = {}
    losses = []
    t_train = time.time()

    def lr_at(step):
        if step >= args.steps:
            return args.ft_lr
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        import math
        frac = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    last = total if args.ft_steps else args.steps
    for step in range(last + 1):
        phase = 1 if step >= args.steps else 0
        data = data_ft if phase else data_pre
        label = ft_points.get(step) if phase else (f"step{step}" if step in args.captures else None)
        if step == args.steps and args.steps in args.captures:
            # the last pre-training gradient: same weights as ft0, pre-training data
            label_pre = f"step{step}"
        else:
            label_pre = None
        xs = [batch(data, w, step, phase, mb, seq) for w in range(W)]
        if label_pre:
            captures[label_pre] = capture(model, named, [batch(data_pre, w, step, 0, mb, seq) for w in range(W)],
                                          step, args.dtype)
            print(f"[capture] {label_pre}: loss {captures[label_pre]['loss']:.3f}", flush=True)
        if label:
            captures[label] = capture(model, named, xs, step, args.dtype)
            loss = captures[label]["loss"]
            print(f"[capture] {label}: loss {loss:.3f}", flush=True)
        if step == last:
            break
        model.zero_grad(set_to_none=True)
        x = torch.cat([b[0] for b in xs])
        y = torch.cat([b[1] for b in xs])
        loss = lm_loss(model, x, y)  # mean over all tokens = mean of the workers' means (equal sizes)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for _, p in named], 1.0)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.step()
        losses.append(round(loss.item(), 4))
        el = time.time() - t_train
        print(f"[train] step {step + 1:4d}/{last} {'ft ' if phase else ''}loss {loss.item():.3f} "
              f"lr {lr_at(step):.1e}  {el:6.0f} s  ({el / (step + 1):.1f} s/step)", flush=True)
    meta = dict(model="llama", params=nparam, vocab=vocab, d=args.d, layers=args.layers, heads=args.heads,
                ffn=args.ffn, seq=seq, micro_batch=mb, workers=W, steps=args.steps, ft_steps=args.ft_steps,
                lr=args.lr, ft_lr=args.ft_lr, warmup=args.warmup, seed=args.seed, corpus_mb=args.corpus_mb,
                pre_digest=digest(pre), ft_digest=digest(ft), pre_tokens=int(data_pre.numel()),
                ft_tokens=int(data_ft.numel()), losses=losses, train_seconds=round(time.time() - t_train),
                total_seconds=round(time.time() - t_start), threads=torch.get_num_threads(),
                torch=torch.__version__, transformers=__import__("transformers").__version__,
                tokenizers=__import__("tokenizers").__version__)
    return dict(meta=meta, names=[n for n, _ in named], shapes=[list(p.shape) for _, p in named],
                captures=captures)


def capture(model, named, xs, step, dtype) -> dict:
    """Each worker's own gradient on its micro-batch, per named parameter: {name: (W, *shape)}."""
    per = {n: [] for n, _ in named}
    losses = []
    for x, y in xs:
        model.zero_grad(set_to_none=True)
        loss = lm_loss(model, x, y)
        loss.backward()
        losses.append(loss.item())
        for n, p in named:
            per[n].append(p.grad.detach().to(dtype).clone())
    model.zero_grad(set_to_none=True)
    return dict(step=step, loss=sum(losses) / len(losses), grads={n: torch.stack(v) for n, v in per.items()})


def run_tinygpt(args) -> dict:
    """vnmse.py's TinyGPT capture (seed 0, steps 0/100/300/600), re-keyed per named parameter."""
    from experiments.studies import vnmse
    from dynamiq.demo import TinyGPT

    t0 = time.time()
    grads = vnmse.capture_gradients(600, {0, 100, 300, 600}, workers=args.workers, seed=0)
    torch.manual_seed(0)
    named = list(TinyGPT(d=128, layers=4, ctx=64).named_parameters())
    caps = {}
    for step, gs in sorted(grads.items()):
        off, per = 0, {}
        for n, p in named:
            per[n] = torch.stack([g[off:off + p.numel()].view_as(p) for g in gs]).to(args.dtype)
            off += p.numel()
        assert off == gs[0].numel()
        caps[f"step{step}"] = dict(step=step, loss=float("nan"), grads=per)
    meta = dict(model="tinygpt", params=sum(p.numel() for _, p in named), vocab=256, d=128, layers=4, seq=64,
                micro_batch=8, workers=args.workers, steps=600, seed=0, total_seconds=round(time.time() - t0),
                torch=torch.__version__)
    return dict(meta=meta, names=[n for n, _ in named], shapes=[list(p.shape) for _, p in named], captures=caps)


def load(path: str) -> dict:
    return torch.load(path, weights_only=False)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("llama", "tinygpt"), default="llama")
    p.add_argument("--cache", default=None, help="output file (default experiments/out/llm_grads/<model>.pt)")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--corpus-mb", type=float, default=8.0)
    p.add_argument("--vocab", type=int, default=16384)
    p.add_argument("--d", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--ffn", type=int, default=1408)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=80, help="pre-training steps")
    p.add_argument("--captures", type=int, nargs="+", default=[0, 10, 40, 80])
    p.add_argument("--ft-steps", type=int, default=12, help="fine-tuning steps after pre-training (0: none)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--ft-lr", type=float, default=2e-4)
    p.add_argument("--warmup", type=int, default=10)
    args = p.parse_args(argv)
    args.dtype = getattr(torch, args.dtype)
    args.captures = set(args.captures)
    torch.set_num_threads(args.threads)
    out = args.cache or os.path.join(DEFAULT_DIR, f"{args.model}.pt")
    res = run_llama(args) if args.model == "llama" else run_tinygpt(args)
    res["meta"]["command"] = " ".join(["python", os.path.relpath(os.path.abspath(__file__), REPO)]
                                      + list(sys.argv[1:] if argv is None else argv))
    res["meta"]["dtype"] = str(args.dtype).replace("torch.", "")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    torch.save(res, out + ".tmp")
    os.replace(out + ".tmp", out)
    print(f"[llm_grads] {out}: {len(res['captures'])} capture points {sorted(res['captures'])}, "
          f"{os.path.getsize(out) / 2 ** 20:.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
