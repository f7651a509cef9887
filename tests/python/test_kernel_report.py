"""scripts/kernel_report.py's parsing and arithmetic, on recorded compiler output of small kernels.

data/kernel_report/tiny.cu was compiled once with nvcc 13.0 (`nvcc -O3 -cubin -arch=sm_90 -Xptxas -v`);
tiny.ptxas.txt, tiny.res.txt and tiny.sass are ptxas's report and cuobjdump's -res-usage and -sass of
the result. The expected numbers below were read off those files by hand (and the SASS loops counted
by hand), and the occupancy cases worked out by hand from NVIDIA's rules for compute capability 9.0
(cuda_occupancy.h): no dynamiq import, no GPU, no compiler needed.
"""

import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "python", "data", "kernel_report")

_spec = importlib.util.spec_from_file_location("kernel_report", os.path.join(ROOT, "scripts", "kernel_report.py"))
kr = importlib.util.module_from_spec(_spec)
sys.modules["kernel_report"] = kr  # (dataclasses look their module up)
_spec.loader.exec_module(kr)


def _read(name):
    with open(os.path.join(DATA, name)) as f:
        return f.read()


@pytest.fixture(scope="module")
def tiny():
    return kr.parse_ptxas(_read("tiny.ptxas.txt")), kr.parse_res_usage(_read("tiny.res.txt")), kr.parse_sass(_read("tiny.sass"))


SCALE4, LOCAL, SPILL, REV, NESTED = ("_Z6scale4PK6float4PS_fl", "_Z11local_arrayPKiPf", "_Z5spillPKfPf",
                                     "_Z10reverse256Pf", "_Z6nestedPKfPfl")


def test_ptxas_registers_stack_spills_smem(tiny):
    p, _, _ = tiny
    assert set(p) == {SCALE4, LOCAL, SPILL, REV, NESTED}
    assert all(i.entry for i in p.values())
    assert (p[SCALE4].regs, p[SCALE4].stack, p[SCALE4].spill_stores, p[SCALE4].spill_loads) == (22, 0, 0, 0)
    # the run-time indexed array: a 256-byte frame (64 floats), no spill
    assert (p[LOCAL].regs, p[LOCAL].stack, p[LOCAL].spill_stores, p[LOCAL].spill_loads) == (34, 256, 0, 0)
    # __maxnreg__(24) with 24 live values: spilled
    assert (p[SPILL].regs, p[SPILL].stack, p[SPILL].spill_stores, p[SPILL].spill_loads) == (24, 88, 84, 100)
    assert (p[REV].regs, p[REV].barriers, p[REV].smem) == (10, 1, 1024)
    assert p[SCALE4].smem == 0 and p[SCALE4].barriers == 0


def test_res_usage_agrees_with_ptxas(tiny):
    p, r, _ = tiny
    assert set(r) == set(p)
    for name, info in p.items():
        assert (r[name]["REG"], r[name]["STACK"]) == (info.regs, info.stack), name
    # SHARED counts the 1 KiB the driver reserves per block on sm_90
    assert r[REV]["SHARED"] == 1024 + 1024 and r[SCALE4]["SHARED"] == 0


def test_sass_loop_body(tiny):
    _, _, s = tiny
    assert set(s) == {SCALE4, LOCAL, SPILL, REV, NESTED}
    # scale4: one loop, /*01c0*/ MOV R8, R10 ... /*02e0*/ @!P0 BRA 0x1c0: 19 instructions, one 16-byte load
    # and one 16-byte store per pass (a float4: 4 values)
    loops = kr.find_loops(s[SCALE4])
    assert len(loops) == 1
    lp = loops[0]
    assert (s[SCALE4][lp.start].addr, s[SCALE4][lp.end].addr) == (0x1C0, 0x2E0)
    assert (lp.size, lp.load_bytes, lp.store_bytes, lp.local_ops) == (19, 16, 16, 0)
    assert kr.instructions_per_value(s[SCALE4], "loop:4")[0] == pytest.approx(19 / 4)
    # nested: the outer loop (0x110-0x270) holds the inner one (0x160-0x1d0: 8 instructions, a 4-byte
    # load): only the inner one is innermost
    loops = kr.find_loops(s[NESTED])
    assert [(s[NESTED][x.start].addr, s[NESTED][x.end].addr, x.size, x.load_bytes) for x in loops] == \
        [(0x160, 0x1D0, 8, 4)]
    # reverse256: no loop (the BRA to itself after EXIT is not one); 19 instructions 0x000-0x120
    assert kr.find_loops(s[REV]) == []
    assert kr.instructions_per_value(s[REV], "loop:1") == (None, "no loop")
    assert kr.instructions_per_value(s[REV], "straight:1")[0] == 19
    assert kr.count_instructions(s[REV]) == 19


def test_sass_local_memory_ops(tiny):
    _, _, s = tiny
    ops = [i.op for i in s[LOCAL]]
    assert ops.count("STL.128") == 16 and "LDL" in ops  # the 64 floats stored, then read at run-time indices
    assert not any(o.startswith(("LDL", "STL")) for o in (i.op for i in s[SCALE4]))


# (regs, threads, static smem, dynamic smem, barriers) -> (blocks per SM, warps per SM, limiter); the
# arithmetic of each case in its comment (64 warps, 32 blocks, 16384 registers per sub-partition,
# registers per warp rounded up to 256, shared memory per block + 1 KiB rounded up to 128 B of 228 KiB)
OCCUPANCY_CASES = [
    # 32 regs: 1024/warp, 16 warps per sub-partition, 64 per SM = 8 blocks of 8 warps: 100 %
    ((32, 256, 0, 0, 0), (8, 64, "registers")),
    # 56 regs: 1792/warp, 16384 // 1792 = 9 warps per sub-partition, 36 per SM // 8 = 4 blocks: 50 %
    ((56, 256, 0, 0, 1), (4, 32, "registers")),
    # 72 regs: 2304/warp, 7 per sub-partition, 28 per SM // 4 = 7 blocks of 4 warps = 28 warps: 43.75 %
    ((72, 128, 0, 0, 0), (7, 28, "registers")),
    # 48 regs, 2 warps per block: 1536/warp, 16384 // 1536 = 10 warps per sub-partition (not 65536 //
    # 1536 = 42 per SM), 40 per SM = 20 blocks: 62.5 %
    ((48, 64, 0, 0, 0), (20, 40, "registers")),
    # 40 regs -> 1280/warp, 12 per sub-partition, 48 per SM = 6 blocks; 45 KiB dynamic + 1 KiB reserved =
    # 47104 B, 233472 // 47104 = 4 blocks (without the reserved KiB: 5): 32 warps
    ((40, 256, 0, 45 * 1024, 1), (4, 32, "shared memory")),
    # 45666 B dynamic + 1024 = 46690 B, rounded up to 128 B: 46720, 233472 // 46720 = 4 (unrounded: 5);
    # 4 blocks of 4 warps
    ((32, 128, 0, 45666, 0), (4, 16, "shared memory")),
    # static 4096 + dynamic 0 + 1024 = 5120 B: 45 blocks by shared memory, 8 by warps (256 threads), 32 regs
    # allow 8: 8 blocks, 64 warps (registers come first among equal limits)
    ((32, 256, 4096, 0, 1), (8, 64, "registers")),
    # one warp per block, 16 regs: 32 blocks (the per-SM block limit) = 32 warps: 50 %
    ((16, 32, 0, 0, 0), (32, 32, "blocks")),
    # 255 regs x 1024 threads: 8192/warp x 32 warps = 262144 > 65536 registers per block: cannot launch
    ((255, 1024, 0, 0, 0), (0, 0, "registers")),
    # 49 KiB dynamic without opting in: over the 48 KiB (+1 KiB reserved) per block: cannot launch
    ((32, 128, 0, 49 * 1024, 0), (0, 0, "shared memory")),
]


@pytest.mark.parametrize("args, want", OCCUPANCY_CASES)
def test_occupancy_by_hand(args, want):
    o = kr.occupancy(*args)
    assert (o.blocks, o.warps, o.limiter) == want
    assert o.fraction == want[1] / 64


def test_occupancy_opt_in_shared_memory():
    # 100 KiB dynamic, opted in: 100 KiB + 1 KiB = 103424 B, 233472 // 103424 = 2 blocks of 8 warps
    o = kr.occupancy(32, 256, 0, 100 * 1024, 1, optin=True)
    assert (o.blocks, o.warps, o.limiter) == (2, 16, "shared memory")


def test_roofline_arithmetic():
    # float32 compress-like: 4 B read, 0.625 B written, 40 instructions per value: memory 4.625 B /
    # 3.35e12 B/s = 1.381 ps, issue 40 / (132 * 4 * 32 * 1.98e9 = 3.345e13 /s) = 1.196 ps: memory-bound,
    # and the copy's 8 B per value take 2.388 ps: 173 % of a copy (it writes less than a copy does)
    r = kr.roofline(40, 4.0, 0.625, 4.0)
    issue_rate = 132 * 4 * 32 * 1.98e9
    assert r.mem_s == pytest.approx(4.625 / 3.35e12)
    assert r.issue_s == pytest.approx(40 / issue_rate)
    assert r.copy_s == pytest.approx(8 / 3.35e12)
    assert r.bound == "memory" and r.fraction == pytest.approx(8 / 4.625)
    # 200 instructions per value: issue 5.98 ps > memory: issue-bound, 2.388 / 5.98 = 39.9 % of a copy
    r = kr.roofline(200, 4.0, 0.625, 4.0)
    assert r.bound == "issue" and r.fraction == pytest.approx((8 / 3.35e12) / (200 / issue_rate))
    assert r.fraction == pytest.approx(0.3994, abs=1e-3)


def test_cubin_command_keeps_the_build_flags():
    e = {"directory": "/b", "file": "/src/csrc/k.cu",
         "command": "/usr/local/bin/nvcc -forward-unknown-to-host-compiler -DA=1 -I/src/csrc -isystem /inc -O3 "
                    "-DNDEBUG -std=c++20 \"--generate-code=arch=compute_80,code=[sm_80]\" "
                    "\"--generate-code=arch=compute_90,code=[compute_90,sm_90]\" -Xcompiler=-fPIC --fmad=false "
                    "--generate-line-info -x cu -c /src/csrc/k.cu -o CMakeFiles/k.cu.o -MD -MT x.o -MF x.d"}
    cmd = kr.cubin_command(e, "nvcc", "/out/k.cubin", "sm_90")
    assert cmd[0] == "nvcc"
    for kept in ("-DA=1", "-I/src/csrc", "/inc", "-O3", "-std=c++20", "--fmad=false", "--generate-line-info"):
        assert kept in cmd, kept
    assert not any("generate-code" in a or a in ("-c", "-MD", "CMakeFiles/k.cu.o", "x.d") for a in cmd), cmd
    assert cmd[-9:] == ["-x", "cu", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o", "/out/k.cubin",
                        "/src/csrc/k.cu"][-9:]
    assert cmd.count("/src/csrc/k.cu") == 1


def test_names_and_launch_log(tmp_path):
    dt = {"0": "f32", "1": "bf16", "2": "f16"}
    assert kr.short_name("void dynamiq::(anonymous namespace)::compress_kernel<(dynamiq::DType)1>"
                         "(dynamiq::BitsplitCudaBlock, const void *)", dt) == "compress_kernel<bf16>"
    assert kr.short_name("dynamiq::cuda::(anonymous namespace)::dynamiq_kernel(dynamiq::cuda::(anonymous "
                         "namespace)::Args, int)", dt) == "dynamiq_kernel"
    log = tmp_path / "launches.tsv"
    log.write_text("compress_kernel<T>\t/x/csrc/kernels/bitsplit/cuda/bitsplit_kernels.cu\t8x1x1\t128x1x1\t0\n"
                   "compress_kernel<T>\t/x/csrc/kernels/bitsplit/cuda/bitsplit_kernels.cu\t1x1x1\t128x1x1\t0\n"
                   "dynamiq_kernel\t/x/dynamiq_kernels.cu\t2x1x1\t64x1x1\t336\n"
                   "dynamiq_kernel\t/x/dynamiq_kernels.cu\t64x1x1\t256x1x1\t5136\n"
                   "(split_kernel<T, true>)\t/x/lossless_encode_kernels.cu\t32x1x1\t256x1x1\t0\n")
    la = kr.load_launches(str(log))
    bs = la[("bitsplit_kernels", "compress_kernel")]
    assert [(x.threads, x.smem, x.blocks, x.launches) for x in bs] == [(128, 0, 9, 2)]
    dq = la[("dynamiq_kernels", "dynamiq_kernel")]
    assert [(x.threads, x.smem) for x in dq] == [(256, 5136), (64, 336)]  # most blocks first
    # a template of several arguments is launched as DQ_LAUNCH((k<T, true>), ...): the same base name
    sp = la[("lossless_encode_kernels", "split_kernel")]
    assert [(x.threads, x.blocks) for x in sp] == [(256, 32)]


def test_budget_file_parses_and_names_the_hot_kernels():
    budgets = kr.load_budgets(os.path.join(ROOT, "scripts", "kernel_budgets.txt"))
    hot = [b for b in budgets if b.hot]
    # every hot kernel has an instruction budget, but DynamiQ's straight-line octet kernels (count "-":
    # no loop:/straight: count is the path a thread runs; experiments/probes/dynamiq_kernel_paths.cu
    # counts it), which --check holds to spills, stack and occupancy only
    uncounted = [b.pattern.pattern for b in hot if b.count == "-"]
    assert uncounted and all(p.startswith("dynamiq_kernels:warp_kernel<") for p in uncounted), uncounted
    assert hot and all(b.ipv_max is not None for b in hot if b.count != "-")
    ops = {b.op for b in hot}
    assert {"compress", "hop", "decompress", "stats"} <= ops


def test_check_flags_each_problem():
    b = kr.Budget(kr.re.compile("x"), "compress", True, 10.0, "straight:1", 4, 1, 4, 1)
    spill = kr.PtxasInfo(regs=24, stack=88, spill_stores=84, spill_loads=100)
    r = kr.Row("u", "k", "k", "k", spill, {}, [], b)
    r.occ = kr.occupancy(72, 128, 0, 0)
    r.ipv = 12.0
    kr.check_row(r)
    text = "; ".join(r.problems)
    assert "spills" in text and "88-byte stack frame" in text and "occupancy 43.8 %" in text and "> budget 10" in text
    ok = kr.Row("u", "k", "k", "k", kr.PtxasInfo(regs=32), {}, [], b)
    ok.occ, ok.ipv = kr.occupancy(32, 256, 0, 0), 9.5
    kr.check_row(ok)
    assert ok.problems == []
    # a count method that finds no count fails; a hot line with count "-" has no instruction budget
    lost = kr.Row("u", "k", "k", "k", kr.PtxasInfo(regs=32), {}, [], b)
    lost.occ, lost.ipv_how = kr.occupancy(32, 256, 0, 0), "no innermost loop"
    kr.check_row(lost)
    assert lost.problems == ["instructions per value not found (no innermost loop)"]
    uncounted = kr.Budget(kr.re.compile("x"), "compress", True, None, "-", 4, 1, 4, 1)
    u = kr.Row("u", "k", "k", "k", kr.PtxasInfo(regs=32), {}, [], uncounted)
    u.occ, u.ipv_how = kr.occupancy(32, 256, 0, 0), "not counted"
    kr.check_row(u)
    assert u.problems == []
    u.info = spill
    kr.check_row(u)
    assert any("stack frame" in p for p in u.problems)


def test_composite_estimate_adds_the_kernels_times():
    # two memory-bound kernels on float32 values: 8 B and 2 B per value -> 10 B / 3.35e12 B/s in all;
    # a copy moves 8 B per value: 8 / 10 = 80 % of a copy
    b1 = kr.Budget(kr.re.compile("a"), "encode", True, None, "straight:1", 4, 4, 4, 1)
    b2 = kr.Budget(kr.re.compile("b"), "encode", True, None, "straight:1", 1, 1, 4, 2)
    rows = []
    for name, b in (("a_kernel", b1), ("b_kernel", b2)):
        r = kr.Row("u", name, name, name, kr.PtxasInfo(), {}, [], b)
        r.roof = kr.roofline(1.0, b.read_b, b.write_b, b.bucket_b)
        rows.append(r)
    c = kr.Composite("a then b", 4.0, [kr.re.compile("a_kernel"), kr.re.compile("b_kernel")])
    frac, how = kr.composite_estimate(c, rows)
    assert frac == pytest.approx(0.8) and how == "a_kernel + b_kernel"
    missing = kr.Composite("a then c", 4.0, [kr.re.compile("a_kernel"), kr.re.compile("c_kernel")])
    assert kr.composite_estimate(missing, rows) == (None, "no estimated row for c_kernel")
    comps = kr.load_composites(os.path.join(ROOT, "scripts", "kernel_budgets.txt"))
    assert any("lossless" in c.name and c.bucket_b == 4 for c in comps)


def test_roofline_small_launch_leaves_schedulers_idle():
    # 296 threads per launch (one per 1024-value segment of a 1 MiB message): 10 warps of the GPU's
    # 132 * 4 = 528 schedulers; a memory-bound 2-byte-per-value kernel on float32 values would reach
    # 8 / 2 = 400 % of a copy, this launch 400 % * 10 / 528 = 7.58 %
    full = kr.roofline(1.0, 1.0, 1.0, 4.0)
    small = kr.roofline(1.0, 1.0, 1.0, 4.0, threads_per_launch=296)
    assert full.bound == "memory" and full.fraction == pytest.approx(4.0)
    assert small.bound == "launch" and small.fraction == pytest.approx(4.0 * 10 / 528)
    assert small.time_s == pytest.approx(full.time_s * 528 / 10)
    # a launch that fills every scheduler is not limited
    assert kr.roofline(1.0, 1.0, 1.0, 4.0, threads_per_launch=528 * 32).fraction == pytest.approx(4.0)
