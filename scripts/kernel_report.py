#!/usr/bin/env python3
"""The compiler's account of the CUDA kernels (scripts/kernel_report.sh runs this; standard library only).

Compiles every CUDA source of the library for sm_90 with the build's own flags (read from a
configured build's compile_commands.json), reads ptxas's -v report and cuobjdump's -res-usage and
-sass of the result, and prints per kernel: registers, stack frame, spills, shared memory, the launch
configuration the launchers made (recorded by the CUDA emulation, see launch.h), theoretical
occupancy on an H100, SASS instructions per value, bytes per value and a roofline estimate of the
kernel's throughput as a fraction of a device-to-device copy. --check fails when a hot kernel of
scripts/kernel_budgets.txt spills, has a stack frame, runs under 50 % occupancy or over its budget
(or its count method finds no count; a hot line with count "-" has no instruction budget).

Definitions (also printed under the table):
  instructions per value  loop:N   static SASS instruction count (NOPs excluded) of the kernel's
                                   largest innermost loop -- the instructions from a backward
                                   branch's target to the branch, with no other backward branch
                                   inside -- divided by N, the values one thread processes per pass
                                   of that SASS loop (after the compiler's unrolling: check N against
                                   the loop's global load bytes, printed with --loops)
                          loops:N  the same over the sum of all innermost loops (kernels that pass
                                   each value through several loops in turn)
                          straight:N  every instruction of the kernel divided by N values per thread
  occupancy               NVIDIA's rules for compute capability 9.0, as cuda_occupancy.h (CUDA 13.0,
                          the Occupancy Calculator's header) applies them: limits by warps, registers
                          (per sub-partition, 256-register allocation unit per warp), shared memory
                          (128-byte granularity, 1 KiB reserved per block, 228 KiB per SM), blocks
                          (32) and barriers; occupancy = resident warps / 64.
  roofline (estimate)     H100 SXM5: 3.35 TB/s HBM3 (NVIDIA H100 datasheet), 132 SMs with 4 warp
                          schedulers each issuing one warp instruction per cycle (NVIDIA H100 Tensor
                          Core GPU Architecture whitepaper), 1.98 GHz boost clock (H100 SXM5 product
                          brief). time per value = max(bytes/3.35e12, instr/(132*4*32*1.98e9)); a copy
                          reads and writes the bucket's bytes once: 2*bucket_bytes/3.35e12 per value.
                          A launch of fewer warps than the 528 schedulers (budget count "@T") divides
                          its throughput by the share it occupies. Ignores latency, tails, launch cost,
                          caches and local-memory traffic: an upper bound, not a measurement.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

# ---- H100 (sm_90) --------------------------------------------------------------------------------

# cudaDeviceProp of an H100 SXM5 as cuda_occupancy.h reads it (CUDA C++ Programming Guide, "Technical
# Specifications per Compute Capability", 9.0) and the architecture constants cuda_occupancy.h keeps
# for computeMajor 9.
H100 = {
    "warp_size": 32,
    "max_threads_per_sm": 2048,  # 64 warps
    "max_threads_per_block": 1024,
    "max_blocks_per_sm": 32,  # cudaOccMaxBlocksPerMultiprocessor, case 9
    "regs_per_sm": 65536,
    "regs_per_block": 65536,
    "max_regs_per_thread": 256,  # cudaOccRegAllocationMaxPerThread, case 9 (ptxas assigns at most 255)
    "reg_alloc_unit": 256,  # registers per warp are rounded up to this (cudaOccRegAllocationGranularity)
    "sub_partitions": 4,  # cudaOccSubPartitionsPerMultiprocessor
    "smem_per_sm": 228 * 1024,  # sharedMemPerMultiprocessor
    "smem_per_block": 48 * 1024,  # sharedMemPerBlock (without cudaFuncSetAttribute)
    "smem_per_block_optin": 227 * 1024,  # sharedMemPerBlockOptin
    "smem_reserved_per_block": 1024,  # reservedSharedMemPerBlock (Ampere and newer)
    "smem_alloc_unit": 128,  # cudaOccSMemAllocationGranularity, case 9
    "barriers_per_block_slot": 2,  # cudaOccMaxBlocksPerSMBlockBarrierLimit, case 9: 2 * 32 barriers
    # roofline
    "sms": 132,
    "schedulers_per_sm": 4,
    "clock_hz": 1.98e9,
    "hbm_bytes_per_s": 3.35e12,
}


def _round_up(x: int, unit: int) -> int:
    return (x + unit - 1) // unit * unit


@dataclass
class Occupancy:
    blocks: int  # resident blocks per SM
    warps: int  # resident warps per SM
    fraction: float  # warps / max warps
    limiter: str  # which limit set `blocks`
    limits: dict  # every limit, blocks per SM


def occupancy(regs: int, threads: int, static_smem: int, dynamic_smem: int, barriers: int = 1,
              optin: bool = False, p: dict = H100) -> Occupancy:
    """Theoretical occupancy of a kernel on one SM (cudaOccMaxActiveBlocksPerMultiprocessor's rules,
    default carve-out preference, no cluster)."""
    ws = p["warp_size"]
    max_warps = p["max_threads_per_sm"] // ws
    warps_per_block = -(-threads // ws)
    limits = {}
    # warps
    limits["warps"] = 0 if threads > p["max_threads_per_block"] else max_warps // warps_per_block
    # registers: allocated per warp in units of 256, from each of the 4 sub-partitions' register files
    regs_per_warp = _round_up(regs * ws, p["reg_alloc_unit"])
    regs_per_block = regs_per_warp * warps_per_block
    regs_assumed = regs_per_warp * _round_up(warps_per_block, p["sub_partitions"])
    if regs > p["max_regs_per_thread"] or regs_per_block > p["regs_per_block"] or regs_assumed > p["regs_per_block"]:
        limits["registers"] = 0
    elif regs_per_warp == 0:
        limits["registers"] = 1 << 30
    else:
        warps_per_sub = (p["regs_per_sm"] // p["sub_partitions"]) // regs_per_warp
        limits["registers"] = warps_per_sub * p["sub_partitions"] // warps_per_block
    # blocks
    limits["blocks"] = p["max_blocks_per_sm"]
    # shared memory: static + dynamic + the reserved 1 KiB, in 128-byte units; the SM's carve-out is
    # the default preference (all 228 KiB) unless a block needs more than that
    per_block = _round_up(static_smem + dynamic_smem + p["smem_reserved_per_block"], p["smem_alloc_unit"])
    block_limit = (p["smem_per_block_optin"] if optin else p["smem_per_block"]) + p["smem_reserved_per_block"]
    if per_block > block_limit:
        limits["shared memory"] = 0
    else:
        limits["shared memory"] = p["smem_per_sm"] // per_block
    # barriers: 2 per block slot on sm_90
    if barriers > 0:
        limits["barriers"] = p["max_blocks_per_sm"] * p["barriers_per_block_slot"] // barriers
    blocks = min(limits.values())
    # the first limit in this order that equals the minimum names the limiter
    limiter = next(k for k in ("registers", "shared memory", "warps", "blocks", "barriers")
                   if k in limits and limits[k] == blocks)
    warps = blocks * warps_per_block
    return Occupancy(blocks, warps, warps / max_warps, limiter, limits)


@dataclass
class Roofline:
    mem_s: float  # seconds per value, memory
    issue_s: float  # seconds per value, instruction issue
    copy_s: float  # seconds per value of a device copy of the bucket's bytes
    bound: str
    fraction: float  # copy time / kernel time
    time_s: float = 0.0  # estimated seconds per value


def roofline(ipv: float, read_b: float, write_b: float, bucket_b: float, threads_per_launch: int | None = None,
             p: dict = H100) -> Roofline:
    """Seconds per value: max(memory, issue), divided by the share of the GPU's warp schedulers a launch
    of `threads_per_launch` threads can keep busy at all (fewer warps than 132 x 4 schedulers leave some
    idle); None: a launch fills the GPU."""
    mem = (read_b + write_b) / p["hbm_bytes_per_s"]
    issue_rate = p["sms"] * p["schedulers_per_sm"] * p["warp_size"] * p["clock_hz"]  # thread-instructions/s
    issue = ipv / issue_rate
    copy = 2.0 * bucket_b / p["hbm_bytes_per_s"]
    t = max(mem, issue)
    bound = "memory" if mem >= issue else "issue"
    if threads_per_launch is not None:
        share = -(-threads_per_launch // p["warp_size"]) / (p["sms"] * p["schedulers_per_sm"])
        if share < 1.0:
            t, bound = t / share, "launch"
    return Roofline(mem, issue, copy, bound, copy / t if t > 0 else float("inf"), t)


# ---- ptxas -v ---------------------------------------------------------------------------------------

@dataclass
class PtxasInfo:
    regs: int = 0
    barriers: int = 0
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    smem: int = 0  # static shared memory
    entry: bool = False


_RE_ENTRY = re.compile(r"ptxas info\s*: Compiling entry function '([^']+)' for '(sm_\d+a?)'")
_RE_FUNC = re.compile(r"ptxas info\s*: Function properties for (\S+)")
_RE_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_RE_USED = re.compile(r"ptxas info\s*: Used (\d+) registers(.*)")


def parse_ptxas(text: str) -> dict[str, PtxasInfo]:
    """ptxas -v's report: {mangled name: PtxasInfo}, entry functions and called device functions."""
    out: dict[str, PtxasInfo] = {}
    entries = set()
    cur = None
    for line in text.splitlines():
        m = _RE_ENTRY.search(line)
        if m:
            entries.add(m.group(1))
            cur = out.setdefault(m.group(1), PtxasInfo())
            cur.entry = True
            continue
        m = _RE_FUNC.search(line)
        if m:
            cur = out.setdefault(m.group(1), PtxasInfo())
            cur.entry = m.group(1) in entries
            continue
        m = _RE_FRAME.search(line)
        if m and cur is not None:
            cur.stack, cur.spill_stores, cur.spill_loads = (int(g) for g in m.groups())
            continue
        m = _RE_USED.search(line)
        if m and cur is not None:
            cur.regs = int(m.group(1))
            rest = m.group(2)
            b = re.search(r"used (\d+) barriers", rest)
            s = re.search(r"(\d+) bytes smem", rest)
            cur.barriers = int(b.group(1)) if b else 0
            cur.smem = int(s.group(1)) if s else 0
    return out


# ---- cuobjdump -res-usage, -sass ----------------------------------------------------------------------

def parse_res_usage(text: str) -> dict[str, dict[str, int]]:
    """cuobjdump -res-usage: {mangled name: {REG, STACK, SHARED, LOCAL, ...}} (SHARED counts the 1 KiB
    the driver reserves per block on sm_80 and newer)."""
    out: dict[str, dict[str, int]] = {}
    name = None
    for line in text.splitlines():
        m = re.match(r"\s*Function (\S+):\s*$", line)
        if m:
            name = m.group(1)
            continue
        if name and "REG:" in line:
            out[name] = {k: int(v) for k, v in re.findall(r"(\w+(?:\[\d+\])?):(\d+)", line)}
            name = None
    return out


@dataclass
class Instr:
    addr: int
    pred: str  # "@P0", "@!P1" or ""
    op: str  # opcode with modifiers, e.g. "LDG.E.128"
    args: str


_RE_SASS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")


def parse_sass(text: str) -> dict[str, list[Instr]]:
    """cuobjdump -sass: {mangled name: [Instr]} (sm_90: one instruction per 16 bytes)."""
    out: dict[str, list[Instr]] = {}
    cur = None
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = out.setdefault(m.group(1), [])
            continue
        if cur is None:
            continue
        m = _RE_SASS.search(line)
        if m:
            cur.append(Instr(int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3), m.group(4).strip()))
    return out


def _branch_target(ins: Instr) -> int | None:
    if not ins.op.startswith("BRA"):
        return None
    m = re.search(r"(?:^|[\s,])(0x[0-9a-f]+)\s*$", ins.args)
    return int(m.group(1), 16) if m else None


@dataclass
class Loop:
    start: int  # index of the first instruction (the branch's target)
    end: int  # index of the backward branch
    size: int  # instructions in [start, end], NOPs excluded
    load_bytes: int  # bytes of global loads (LDG) per pass
    store_bytes: int  # bytes of global stores (STG) per pass
    local_ops: int  # LDL/STL per pass (local memory: stack arrays or spills)


def _access_bytes(op: str) -> int:
    for suffix, n in ((".128", 16), (".64", 8), (".U16", 2), (".S16", 2), (".U8", 1), (".S8", 1)):
        if suffix in op:
            return n
    return 4


def find_loops(instrs: list[Instr]) -> list[Loop]:
    """Innermost loops: [target, branch] of each backward BRA (branches to one head merged) holding
    no other backward branch's range. A BRA to itself (the trap after EXIT) is not a loop."""
    index = {ins.addr: i for i, ins in enumerate(instrs)}
    heads: dict[int, int] = {}
    for i, ins in enumerate(instrs):
        t = _branch_target(ins)
        if t is None or t > ins.addr or t not in index:
            continue
        if t == ins.addr:  # the trap loop
            continue
        s = index[t]
        heads[s] = max(heads.get(s, i), i)
    ranges = sorted(heads.items())
    inner = [(s, e) for s, e in ranges
             if not any((s2, e2) != (s, e) and s <= s2 and e2 <= e for s2, e2 in ranges)]
    loops = []
    for s, e in inner:
        body = [x for x in instrs[s:e + 1] if x.op != "NOP"]
        lb = sum(_access_bytes(x.op) for x in body if x.op.startswith("LDG"))
        sb = sum(_access_bytes(x.op) for x in body if x.op.startswith("STG"))
        lo = sum(1 for x in body if x.op.startswith(("LDL", "STL")))
        loops.append(Loop(s, e, len(body), lb, sb, lo))
    return loops


def count_instructions(instrs: list[Instr]) -> int:
    """Static instructions, NOPs and the trap loop after the last EXIT excluded."""
    n = len([x for x in instrs if x.op != "NOP"])
    if instrs:
        last = [x for x in instrs if x.op != "NOP"]
        if last and last[-1].op.startswith("BRA") and _branch_target(last[-1]) == last[-1].addr:
            n -= 1
    return n


def instructions_per_value(instrs: list[Instr], method: str) -> tuple[float | None, str]:
    """(instructions per value, what was counted) for a budget line's count method."""
    if method == "-":
        return None, "not counted"
    m = re.fullmatch(r"(loop|loops|straight):(\d+(?:\.\d+)?)", method)
    if not m:
        raise ValueError(f"unknown count method {method!r} (loop:N, loops:N or straight:N)")
    kind, n = m.group(1), float(m.group(2))
    if kind == "straight":
        total = count_instructions(instrs)
        return total / n, f"{total} instr / {n:g}"
    loops = find_loops(instrs)
    if not loops:
        return None, "no loop"
    if kind == "loop":
        big = max(loops, key=lambda lp: lp.size)
        return big.size / n, f"loop {big.size} instr @{instrs[big.start].addr:#x} / {n:g}"
    total = sum(lp.size for lp in loops)
    return total / n, f"{len(loops)} loops {total} instr / {n:g}"


# ---- names --------------------------------------------------------------------------------------

def demangle(names: list[str], filt: str) -> dict[str, str]:
    if not names:
        return {}
    r = subprocess.run([filt], input="\n".join(names) + "\n", capture_output=True, text=True, check=True)
    return dict(zip(names, r.stdout.splitlines()))


def dtype_names(csrc: str) -> dict[str, str]:
    """{"0": "f32", ...} from common.h's enum class DType (for short kernel names)."""
    try:
        with open(os.path.join(csrc, "kernels", "base", "common.h")) as f:
            m = re.search(r"enum class DType[^{]*\{([^}]*)\}", f.read())
    except OSError:
        return {}
    out = {}
    for name, val in re.findall(r"k(\w+)\s*=\s*(\d+)", m.group(1) if m else ""):
        out[val] = name.lower()
    return out


def short_name(demangled: str, dtypes: dict[str, str]) -> str:
    """`void ns::(anonymous namespace)::k<(dynamiq::DType)0>(args)` -> `k<f32>`."""
    s = demangled
    if s.startswith("void "):
        s = s[5:]
    # drop the parameter list: the last top-level parenthesised group
    depth = 0
    for i in range(len(s) - 1, -1, -1):
        if s[i] == ")":
            depth += 1
        elif s[i] == "(":
            depth -= 1
            if depth == 0:
                s = s[:i]
                break
    s = re.sub(r"\(anonymous namespace\)::", "", s)
    s = re.sub(r"\((?:\w+::)*DType\)(\d+)", lambda m: dtypes.get(m.group(1), m.group(0)), s)
    # drop namespaces outside template arguments
    head = s.split("<", 1)
    head[0] = head[0].rsplit("::", 1)[-1]
    s = "<".join(head)
    return re.sub(r"\b(?:\w+::)+", "", s)


def base_name(short: str) -> str:
    return short.split("<", 1)[0]


# ---- budgets and launches -------------------------------------------------------------------------

@dataclass
class Budget:
    pattern: re.Pattern
    op: str
    hot: bool
    ipv_max: float | None
    count: str
    read_b: float
    write_b: float
    bucket_b: float
    line: int
    threads_per_launch: int | None = None  # count's "@T": the threads one launch runs (small launches)


def load_budgets(path: str) -> list[Budget]:
    out = []
    with open(path) as f:
        for no, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].strip()
            if not line or line.startswith("="):
                continue
            cols = line.split()
            if len(cols) != 8:
                raise ValueError(f"{path}:{no}: 8 columns expected, got {len(cols)}: {line}")
            pat, op, cls, ipv, count, rb, wb, bb = cols
            if cls not in ("hot", "cold"):
                raise ValueError(f"{path}:{no}: class must be hot or cold, not {cls}")
            count, _, tpl = count.partition("@")
            if count != "-":
                instructions_per_value([], count)  # validates the method
            out.append(Budget(re.compile(pat), op, cls == "hot", None if ipv == "-" else float(ipv), count,
                              float(rb), float(wb), float(bb), no, int(tpl) if tpl else None))
    return out


@dataclass
class Composite:
    name: str
    bucket_b: float
    patterns: list  # one row each: the first row whose "unit:kernel" the regex finds


def load_composites(path: str) -> list[Composite]:
    """The budget file's "= name | bucket_B | pattern pattern ..." lines: operations made of several
    kernels that each pass every value once (estimate: a copy's time / the sum of their times)."""
    out = []
    with open(path) as f:
        for no, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].strip()
            if not line.startswith("="):
                continue
            parts = [x.strip() for x in line[1:].split("|")]
            if len(parts) != 3 or not parts[2]:
                raise ValueError(f"{path}:{no}: '= name | bucket_B | patterns' expected: {line}")
            out.append(Composite(parts[0], float(parts[1]), [re.compile(x) for x in parts[2].split()]))
    return out


def composite_estimate(c: Composite, rows: list) -> tuple[float | None, str]:
    """(fraction of a copy, the kernels summed or what is missing)."""
    total, names = 0.0, []
    for pat in c.patterns:
        r = next((r for r in rows if r.roof and pat.search(f"{r.unit}:{r.kernel}")), None)
        if r is None:
            return None, f"no estimated row for {pat.pattern}"
        total += r.roof.time_s
        names.append(r.kernel)
    copy = 2.0 * c.bucket_b / H100["hbm_bytes_per_s"]
    return copy / total, " + ".join(names)


@dataclass
class Launch:
    threads: int
    smem: int
    blocks: int  # grid blocks summed over the distinct recorded grids of this configuration
    launches: int  # distinct grids recorded
    source: str = ""  # which run recorded it


def load_launches(path: str, source: str = "") -> dict[tuple[str, str], list[Launch]]:
    """The emulation's launch log (launch.h: name, file, grid, block, dynamic shared bytes per line):
    {(unit, kernel base name): [Launch, most blocks first]}."""
    agg: dict[tuple[str, str, int, int], Launch] = {}
    with open(path) as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            if len(cols) != 5:
                continue
            name, src, grid, block, smem = cols
            unit = os.path.splitext(os.path.basename(src))[0]
            # (a launch of a template with several arguments is written DQ_LAUNCH((k<T, true>), ...))
            base = re.sub(r"<.*", "", name.strip().lstrip("(")).strip().rsplit("::", 1)[-1]
            threads = 1
            for d in block.split("x"):
                threads *= int(d)
            blocks = 1
            for d in grid.split("x"):
                blocks *= int(d)
            k = (unit, base, threads, int(smem))
            if k not in agg:
                agg[k] = Launch(threads, int(smem), 0, 0, source)
            agg[k].blocks += blocks
            agg[k].launches += 1
    out: dict[tuple[str, str], list[Launch]] = {}
    for (unit, base, _, _), la in agg.items():
        out.setdefault((unit, base), []).append(la)
    for v in out.values():
        v.sort(key=lambda la: -la.blocks)
    return out


# ---- compiling ------------------------------------------------------------------------------------

_DROP_WITH_ARG = {"-o", "-MF", "-MT", "-MQ", "-gencode", "-arch", "--gpu-architecture", "-code", "--gpu-code",
                  "--dependency-output"}
_DROP = {"-c", "-MD", "-MMD", "--compile", "-cubin", "--cubin", "-ptx"}


def cubin_command(entry: dict, nvcc: str, out: str, arch: str) -> list[str]:
    """The build's command for one .cu, turned into a device-only compile to a cubin for `arch`
    with ptxas's report: the same defines, include paths, standard, optimisation and --fmad."""
    args = entry.get("arguments") or shlex.split(entry["command"])
    res = [nvcc]
    skip = False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a in _DROP_WITH_ARG:
            skip = True
            continue
        if a in _DROP or a == entry["file"]:
            continue
        if re.match(r"(--generate-code|-gencode|-arch|--gpu-architecture|-code|--gpu-code|-o|-MF|-MT)=", a):
            continue
        if re.match(r"-(gencode|arch|code|o)\S", a) and not a.startswith("-opt"):
            continue
        res.append(a)
    return res + [f"-arch={arch}", "-cubin", "-Xptxas", "-v", "-o", out, entry["file"]]


@dataclass
class Unit:
    name: str  # .cu file stem
    source: str
    ptxas: dict = field(default_factory=dict)
    res: dict = field(default_factory=dict)
    sass: dict = field(default_factory=dict)
    log: str = ""


def compile_unit(entry: dict, nvcc: str, cuobjdump: str, outdir: str, arch: str, launcher: list[str]) -> Unit:
    src = entry["file"]
    name = os.path.splitext(os.path.basename(src))[0]
    cubin = os.path.join(outdir, name + ".cubin")
    cmd = launcher + cubin_command(entry, nvcc, cubin, arch)
    r = subprocess.run(cmd, cwd=entry.get("directory") or None, capture_output=True, text=True)
    u = Unit(name, src, log=r.stdout + r.stderr)
    if r.returncode != 0:
        raise RuntimeError(f"nvcc failed on {src} (rc {r.returncode}):\n{shlex.join(cmd)}\n{u.log[-4000:]}")
    u.ptxas = parse_ptxas(u.log)
    res = subprocess.run([cuobjdump, "-res-usage", cubin], capture_output=True, text=True, check=True).stdout
    sass = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True, check=True).stdout
    with open(os.path.join(outdir, name + ".ptxas.txt"), "w") as f:
        f.write(u.log)
    with open(os.path.join(outdir, name + ".sass"), "w") as f:
        f.write(sass)
    u.res = parse_res_usage(res)
    u.sass = parse_sass(sass)
    return u


def record_launches(name: str, cmd: str, log: str, outdir: str) -> None:
    """Runs `cmd` (a program built against the CUDA emulation) with the launch log on."""
    if os.path.exists(log):
        os.remove(log)
    env = dict(os.environ, DYNAMIQ_CUDA_EMU_LAUNCH_LOG=log)
    r = subprocess.run(shlex.split(cmd), env=env, capture_output=True, text=True)
    with open(os.path.join(outdir, f"{name}.log"), "w") as f:
        f.write(r.stdout + r.stderr)
    if r.returncode != 0:
        raise RuntimeError(f"{cmd} failed (rc {r.returncode}):\n{(r.stdout + r.stderr)[-3000:]}")


def library_sources(cc: list[dict], root: str) -> list[dict]:
    """The library's CUDA sources in compile_commands.json: csrc/**/*.cu (tests and benchmarks not)."""
    csrc = os.path.realpath(os.path.join(root, "csrc")) + os.sep
    seen, out = set(), []
    for e in cc:
        f = os.path.realpath(os.path.join(e.get("directory", ""), e["file"]))
        if f.endswith(".cu") and f.startswith(csrc) and f not in seen:
            seen.add(f)
            out.append(dict(e, file=f))
    return sorted(out, key=lambda e: e["file"])


# ---- the report -----------------------------------------------------------------------------------

@dataclass
class Row:
    unit: str
    kernel: str  # short demangled name
    demangled: str
    mangled: str
    info: PtxasInfo
    res: dict
    instrs: list
    budget: Budget | None = None
    launch: Launch | None = None
    other_launches: int = 0
    occ: Occupancy | None = None
    ipv: float | None = None
    ipv_how: str = ""
    roof: Roofline | None = None
    problems: list = field(default_factory=list)


def build_rows(units: list[Unit], budgets: list[Budget], launches, filt: str, dtypes) -> list[Row]:
    mangled = sorted({m for u in units for m in u.sass})
    dem = demangle(mangled, filt)
    rows = []
    for u in units:
        for m, instrs in sorted(u.sass.items(), key=lambda kv: dem.get(kv[0], kv[0])):
            info = u.ptxas.get(m, PtxasInfo())
            short = short_name(dem.get(m, m), dtypes)
            key = f"{u.name}:{short}"
            matched = [b for b in budgets if b.pattern.search(key)]
            # a kernel with several budget lines (one kernel serving several operations) gets one row
            # per operation
            for b in matched or [None]:
                rows.append(Row(u.name, short, dem.get(m, m), m, info, u.res.get(m, {}), instrs, b))
    base_counts: dict[str, int] = {}
    for r in rows:
        base_counts[base_name(r.kernel)] = base_counts.get(base_name(r.kernel), 0) + 1
    for r in rows:
        la = launches.get((r.unit, base_name(r.kernel)))
        if la is None:  # launched from a header: match by name alone if it is unique
            cands = [v for (u, b), v in launches.items() if b == base_name(r.kernel)]
            la = cands[0] if len(cands) == 1 else None
        if la:
            r.launch, r.other_launches = la[0], len(la) - 1
            r.occ = occupancy(r.info.regs, la[0].threads, r.info.smem, la[0].smem, r.info.barriers,
                              optin=la[0].smem + r.info.smem > H100["smem_per_block"])
        if r.budget:
            r.ipv, r.ipv_how = instructions_per_value(r.instrs, r.budget.count)
            if r.ipv is not None:
                r.roof = roofline(r.ipv, r.budget.read_b, r.budget.write_b, r.budget.bucket_b,
                                  r.budget.threads_per_launch)
        check_row(r)
    return rows


def check_row(r: Row) -> None:
    if not (r.budget and r.budget.hot):
        return
    i = r.info
    if i.spill_stores or i.spill_loads:
        r.problems.append(f"spills ({i.spill_stores} B stored, {i.spill_loads} B loaded)")
    if i.stack:
        r.problems.append(f"{i.stack}-byte stack frame")
    if r.occ is None:
        r.problems.append("no launch recorded (the emulation run did not launch it)")
    elif r.occ.fraction < 0.5:
        r.problems.append(f"occupancy {100 * r.occ.fraction:.1f} % < 50 % ({r.occ.limiter}-limited)")
    if r.ipv is None and r.budget.count != "-":
        # (count "-": a kernel whose SASS no loop:/straight: count describes -- DynamiQ's straight-line
        # octet kernels, counted by experiments/probes/dynamiq_kernel_paths.cu instead -- is held to
        # spills, stack and occupancy only, as its budget line says)
        r.problems.append(f"instructions per value not found ({r.ipv_how})")
    elif r.budget.ipv_max is not None and r.ipv > r.budget.ipv_max:
        r.problems.append(f"{r.ipv:.1f} instructions per value > budget {r.budget.ipv_max:g}")


def fmt_table(rows: list[Row]) -> str:
    hdr = ("unit", "kernel", "op", "hot", "regs", "stack", "spill st/ld", "smem s/d", "threads", "from", "occ %",
           "limit", "instr/val", "budget", "B rd/wr", "bound", "est %copy")
    lines = []
    for r in rows:
        b = r.budget
        occ = f"{100 * r.occ.fraction:.1f}" if r.occ else "-"
        lines.append((
            r.unit, r.kernel, b.op if b else "-", ("hot" if b.hot else "cold") if b else "-",
            str(r.info.regs), str(r.info.stack), f"{r.info.spill_stores}/{r.info.spill_loads}",
            f"{r.info.smem}/{r.launch.smem if r.launch else '-'}",
            str(r.launch.threads) if r.launch else "-", r.launch.source if r.launch else "-", occ,
            r.occ.limiter if r.occ else "-",
            f"{r.ipv:.1f}" if r.ipv is not None else "-",
            (f"{b.ipv_max:g}" if b.ipv_max is not None else "-") if b else "-",
            f"{b.read_b:g}/{b.write_b:g}" if b else "-",
            r.roof.bound if r.roof else "-",
            (f"{100 * r.roof.fraction:.0f}" + ("*" if r.info.stack or r.info.spill_stores else "")) if r.roof else "-"))
    widths = [max(len(h), *(len(x[i]) for x in lines)) if lines else len(h) for i, h in enumerate(hdr)]
    out = ["  ".join(h.ljust(w) for h, w in zip(hdr, widths)).rstrip()]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(c.ljust(w) for c, w in zip(x, widths)).rstrip() for x in lines]
    return "\n".join(out)


NOTES = """\
columns: regs, stack (bytes), spill st/ld (bytes) from ptxas -v; smem s/d = static / dynamic shared bytes per
block (dynamic: as launched); threads per block as launched (both recorded on the CUDA emulation by the run
in the "from" column: bench = bench_cuda_emu --dry-run at its default parameters, tests = emulated GPU tests
at theirs; a kernel launched with several configurations shows the one with most blocks); occ % = theoretical occupancy on an H100 (sm_90) and its limiting resource;
instr/val = SASS instructions per value (count method per kernel in scripts/kernel_budgets.txt: loop:N = the
largest innermost loop's static instruction count / N values per thread per pass, loops:N = all innermost
loops, straight:N = the whole kernel); B rd/wr = global bytes read / written per value (budget file, float32
buckets unless the row says otherwise); est %copy = ESTIMATE (roofline, not a measurement): a device copy's
time for the bucket's bytes / max(memory time, issue time), H100 SXM5: 3.35 TB/s HBM3, 132 SMs x 4 schedulers
x 1 warp instruction/cycle at 1.98 GHz; bound = which term is larger, or "launch" where a launch has fewer warps
than the GPU's 528 schedulers (count "@T" in the budget file: T threads per launch), which divides the
throughput by the share of schedulers it can occupy; * = the kernel uses local memory (stack
frame or spills), whose traffic the bytes leave out: the estimate is optimistic."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compile-commands", required=True)
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--budgets", default=None)
    ap.add_argument("--record", action="append", default=[],
                    help="NAME=COMMAND: a program run on the CUDA emulation with DYNAMIQ_CUDA_EMU_LAUNCH_LOG set "
                         "(beside the compiles); the first run that launched a kernel gives its configuration")
    ap.add_argument("--launch-log", action="append", default=[],
                    help="NAME=FILE: a launch log already written (read after the --record runs)")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--nvcc", default="nvcc")
    ap.add_argument("--cuobjdump", default="cuobjdump")
    ap.add_argument("--cxxfilt", default="c++filt")
    ap.add_argument("--launcher", default="", help="a compiler launcher (ccache)")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--loops", action="store_true", help="print every innermost loop of each budgeted kernel")
    a = ap.parse_args(argv)
    budgets = load_budgets(a.budgets or os.path.join(a.root, "scripts", "kernel_budgets.txt"))
    with open(a.compile_commands) as f:
        entries = library_sources(json.load(f), a.root)
    if not entries:
        print(f"kernel_report: no CUDA source of csrc/ in {a.compile_commands} (configure with CUDA on)",
              file=sys.stderr)
        return 2
    os.makedirs(a.out_dir, exist_ok=True)
    launcher = shlex.split(a.launcher)
    records = [(name, cmd, os.path.join(os.path.abspath(a.out_dir), f"launches_{name}.tsv"))
               for name, _, cmd in (r.partition("=") for r in a.record)]
    logs = [(name, path) for name, _, path in records] + [(n or os.path.basename(p), p) for n, _, p in (x.rpartition("=") for x in a.launch_log)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as ex:
        runs = [ex.submit(record_launches, name, cmd, path, a.out_dir) for name, cmd, path in records]
        units = list(ex.map(lambda e: compile_unit(e, a.nvcc, a.cuobjdump, a.out_dir, a.arch, launcher), entries))
        for r in runs:
            r.result()
    launches: dict = {}
    for name, path in logs:
        if os.path.exists(path):
            for k, v in load_launches(path, name).items():
                launches.setdefault(k, v)
    rows = build_rows(units, budgets, launches, a.cxxfilt, dtype_names(os.path.join(a.root, "csrc")))
    print(f"# kernel report: {len(units)} CUDA sources, {len({r.mangled for r in rows})} kernels, {a.arch}; "
          f"launches recorded by: {', '.join(n for n, _ in logs) if launches else 'nothing (no occupancy)'}")
    print(fmt_table(rows))
    print()
    print(NOTES)
    comps = load_composites(a.budgets or os.path.join(a.root, "scripts", "kernel_budgets.txt"))
    if comps:
        print("\n# operations of several kernels, ESTIMATE: a copy's time / the sum of the kernels' estimated times")
        for c in comps:
            frac, how = composite_estimate(c, rows)
            print(f"  {c.name}: {'-' if frac is None else f'{100 * frac:.0f} % of a copy'} ({how})")
        print()
    unmatched = [r for r in rows if r.budget is None]
    if unmatched:
        print(f"# not in the budget file (no bytes, no estimate): {', '.join(sorted({r.unit + ':' + r.kernel for r in unmatched}))}")
    for u in units:
        calls = [m for m, i in u.ptxas.items() if not i.entry]
        if calls:
            print(f"# {u.name}: non-inlined device functions (calls): {len(calls)}")
    mismatch = [f"{r.unit}:{r.kernel}" for r in rows
                if r.res and (r.res.get("REG") != r.info.regs or r.res.get("STACK") != r.info.stack)]
    if mismatch:
        print(f"# ptxas -v and cuobjdump -res-usage disagree on registers or stack for: {', '.join(mismatch)}")
    if a.loops:
        for r in rows:
            if not r.budget:
                continue
            print(f"\n## loops of {r.unit}:{r.kernel} ({r.budget.op}): {r.ipv_how}")
            for lp in sorted(find_loops(r.instrs), key=lambda lp: -lp.size):
                print(f"  {r.instrs[lp.start].addr:#07x}-{r.instrs[lp.end].addr:#07x}: {lp.size} instr, "
                      f"LDG {lp.load_bytes} B, STG {lp.store_bytes} B, LDL/STL {lp.local_ops}")
    if not a.check:
        return 0
    hot = [r for r in rows if r.budget and r.budget.hot]
    missing = [b for b in budgets if b.hot and not any(r.budget is b for r in rows)]
    bad = [r for r in hot if r.problems]
    print()
    for b in missing:
        print(f"CHECK FAIL: budget line {b.line} ({b.pattern.pattern}, {b.op}) matches no kernel")
    for r in bad:
        print(f"CHECK FAIL: {r.unit}:{r.kernel} ({r.budget.op}): {'; '.join(r.problems)}")
    if bad or missing:
        print(f"kernel check: {len(bad) + len(missing)} of {len(hot) + len(missing)} hot kernel rows fail")
        return 1
    print(f"kernel check: all {len(hot)} hot kernel rows pass (no spill, no stack frame, occupancy >= 50 %, "
          "instructions per value within budget)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
