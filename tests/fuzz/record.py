"""Writes a fuzzing campaign (build/fuzz-logs/summary.json from scripts/fuzz.sh) to
experiments/results/fuzz/ (README.md section and fuzz.json), through experiments/results_io.py.

    python3 tests/fuzz/record.py [--command "bash scripts/fuzz.sh --record 600"]
"""
import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from experiments import results_io  # noqa: E402

WHAT = {
    "fuzz_codec": "every registered codec (the input's first byte picks it): decompress, "
                  "decompress-accumulate, fused hop, dynamic_bytes",
    "fuzz_lossless_block": "lossless block parser, ZipCCL and Huffman decoders",
    "fuzz_plan": "DynamiQ plan from received statistics and a restored allocator state",
    "fuzz_collective": "one rank of a whole all_reduce: header exchange, metadata, executor, codecs",
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--command", default=None)
    p.add_argument("--summary", default=os.path.join(REPO, "build", "fuzz-logs", "summary.json"))
    a = p.parse_args()
    s = json.load(open(a.summary))
    build = os.path.basename(s.get("build", "build/fuzz"))
    generic = build != "fuzz"
    part = "fuzz" if not generic else "fuzz_" + build[len("fuzz-"):]
    env = "" if not generic else ("FUZZ_CPU_ARCH= " if build == "fuzz-generic" else f"FUZZ_CPU_ARCH={build[5:]} ")
    cpu = s.get("cpu_seconds_per_target")
    if cpu:
        env += f"FUZZ_CPU_SECONDS={cpu} "
    cmd = a.command or f"{env}bash scripts/fuzz.sh --record {s['seconds_per_target']}"
    run = results_io.Run("fuzz", "Coverage-guided fuzzing of the decoders (libFuzzer, ASan + UBSan)", command=cmd)
    rows = ["| target | what it feeds | executions | per CPU s | CPU s | wall s | edges covered | of instrumented | "
            "features | corpus | peak RSS MB | result |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for t in s["targets"]:
        per_cpu = round(t["execs"] / t["cpu_s"]) if t.get("execs") and t.get("cpu_s") else "?"
        rows.append(f"| `{t['target']}` | {WHAT.get(t['target'], '')} | {t['execs']:,} | {per_cpu} | "
                    f"{t['cpu_s']} | {t['wall_s']} | {t['cov']} | {t['counters']} | {t['ft']} | {t['corpus']} | "
                    f"{t['peak_rss_mb']} | {t['result']} |")
    kernels = ("the portable kernels (`-DDYNAMIQ_CPU_ARCH=`, no intrinsics)" if generic
               else "the default `-march=x86-64-v3` build (AVX2 kernels)")
    md = (f"Build: {kernels}, clang 19, `-O1 -g1`, ASan + UBSan. "
          + (f"Each target until it had used {cpu} s of CPU time (at most {s['seconds_per_target']} s of wall "
             "time), at `nice -n 19` on a shared machine; " if cpu else
             f"{s['seconds_per_target']} s of wall time per target at `nice -n 19`; ") +
          "`edges covered` is libFuzzer's `cov` (instrumented edges reached), `of instrumented` the edges of "
          "the whole binary (the library's other paths included), `features` its `ft`.\n\n" + "\n".join(rows))
    print(run.write(part, md, data=s))


if __name__ == "__main__":
    main()
