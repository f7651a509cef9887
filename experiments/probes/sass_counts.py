"""Per-kernel instruction counts of `cuobjdump -sass` output (a file, or - for stdin).

    cuobjdump -sass kernels.cubin | python3 experiments/probes/sass_counts.py -

Prints one line per kernel: the SASS instruction count and the counts of the
instructions that matter for a bandwidth-bound codec kernel: IMAD.WIDE (the
64-bit multiplies of address arithmetic and of Philox's mulhilo), IMAD.HI,
16-byte global loads and stores, all global loads and stores, local memory
(LDL/STL: a stack frame in use), shuffles, barriers, shared memory and
branches. Static counts: they say what is in the code, not how often it runs.
"""
import collections
import re
import subprocess
import sys

PATTERNS = ["IMAD.WIDE", "IMAD.HI", "LDG.E.128", "STG.E.128", "LDG", "STG", "LDL", "STL", "SHFL", "BAR",
            "LDS", "STS", "ATOMS", "BRA"]


def counts(text):
    out = []
    for part in re.split(r"\n\s+Function : ", text)[1:]:
        name = part.split("\n", 1)[0].strip()
        try:
            name = subprocess.run(["c++filt", name], capture_output=True, text=True).stdout.strip() or name
        except OSError:
            pass
        ops = []
        for line in part.split("\n"):
            m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)", line)
            if m:
                ops.append(m.group(2))
        c = collections.Counter()
        for op in ops:
            for p in PATTERNS:
                if op == p or op.startswith(p + ".") or (p in ("LDG", "STG") and op.startswith(p)):
                    c[p] += 1
        out.append((name, len(ops), c))
    return out


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "-"
    text = sys.stdin.read() if src == "-" else open(src).read()
    for name, total, c in counts(text):
        name = name.replace("dynamiq::cuda::(anonymous namespace)::", "")
        print(f"{name}: {total} instructions; " + ", ".join(f"{p} {c[p]}" for p in PATTERNS if c[p]))


if __name__ == "__main__":
    main()
