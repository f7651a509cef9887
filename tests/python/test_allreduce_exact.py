"""Mode "none" through the C++ driver over Gloo point-to-point, world 1-4.

Properties: equal to torch.distributed.all_reduce within the rounding of the
bucket dtype, bit-identical on every rank, for every topology, dtype and op;
the async Future; bf16 buckets sum exactly through dynamiq on Gloo;
simulate() gives the same bytes and values as a real run.
"""

import pytest
import torch
import torch.distributed as dist

import dynamiq
from dist_utils import run_ranks

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Unit roundoff of each dtype: each of the <= n-1 hops rounds a partial sum.
UNIT = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def gather_equal(t: torch.Tensor) -> bool:
    # Compare bit patterns (Gloo gathers int32, not int16).
    bits = (t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)).to(torch.int32)
    out = [torch.empty_like(bits) for _ in range(dist.get_world_size())]
    dist.all_gather(out, bits.contiguous())
    return all(torch.equal(o, out[0]) for o in out)


def _exactness(rank, world):
    checked = 0
    for topology in dynamiq.available_topologies(compositions=False):
        cfg = dynamiq.Config(mode="none", topology=topology, block_bytes=4096)
        for dtype in DTYPES:
            for op in ("sum", "mean"):
                for numel in (1, 1000, 100_003):
                    g = torch.Generator().manual_seed(1000 * rank + numel)
                    x = torch.randn(numel, generator=g).to(dtype)
                    ref = x.float().clone()
                    dist.all_reduce(ref)
                    absref = x.float().abs()
                    dist.all_reduce(absref)
                    if op == "mean":
                        ref /= world
                        absref /= world
                    y = x.clone()
                    dynamiq.all_reduce(y, cfg, op=op)
                    # Ours and the float32 reference each round up to n-1 partial
                    # sums (plus the final division for mean).
                    bound = (world * UNIT[dtype] + world * UNIT[torch.float32]) * absref * 1.0001 + \
                        UNIT[dtype] * ref.abs() + 1e-30
                    err = (y.float() - ref).abs()
                    assert bool((err <= bound).all()), (
                        f"{topology} {dtype} {op} n={numel}: max err {err.max()} vs bound {bound.max()}")
                    assert gather_equal(y), f"{topology} {dtype} {op} n={numel}: ranks differ"
                    checked += 1
    # 2-D input is reduced in place like torch.distributed.all_reduce.
    m = torch.full((3, 5), float(rank + 1))
    dynamiq.all_reduce(m, dynamiq.Config(mode="none"))
    assert torch.equal(m, torch.full((3, 5), float(world * (world + 1) // 2)))
    # async: a Future whose value is the tensor
    z = torch.ones(10)
    fut = dynamiq.all_reduce(z, dynamiq.Config(mode="none"), async_op=True)
    assert isinstance(fut, torch.futures.Future)
    assert fut.wait() is z and torch.equal(z, torch.full((10,), float(world)))
    return checked


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_exact_equals_torch_and_ranks_bit_identical(world):
    res = run_ranks(_exactness, world, timeout=600)
    assert all(r == 54 for r in res)


def _async_beside_torch_collectives(rank, world):
    # The caller keeps using the group while dynamiq's collectives run on their worker:
    # both must come out exact (dynamiq sends on a process group of its own).
    cfg = dynamiq.Config(mode="none", block_bytes=4096)
    xs = [torch.full((20_000 + 1000 * k,), float(rank + k)) for k in range(4)]
    futs = [dynamiq.all_reduce(x, cfg, async_op=True) for x in xs]
    mine = [torch.full((1 + 37 * k,), float(rank * k)) for k in range(12)]
    for m in mine:
        dist.all_reduce(m)
    for f in futs:
        f.wait()
    tri = world * (world - 1) / 2
    for k, x in enumerate(xs):
        assert torch.equal(x, torch.full_like(x, tri + world * k)), k
    for k, m in enumerate(mine):
        assert torch.equal(m, torch.full_like(m, tri * k)), k


@pytest.mark.parametrize("world", [2, 3])
def test_async_all_reduce_beside_torch_collectives_on_the_same_group(world):
    run_ranks(_async_beside_torch_collectives, world)


def _reinit(rank, world, store2):
    # dynamiq's own group is made once per group (not per call), and made again after
    # destroy_process_group and a new init, where the default group's name comes back.
    from datetime import timedelta
    from dynamiq.api import resolve_group
    names = []
    for attempt in range(2):
        for _ in range(2):
            x = torch.full((1000,), float(rank + 1))
            dynamiq.all_reduce(x, dynamiq.Config(mode="none"))
            assert torch.equal(x, torch.full_like(x, world * (world + 1) / 2))
            names.append((dist.group.WORLD.group_name, resolve_group(None)[1]))
        if attempt == 0:
            dist.destroy_process_group()
            dist.init_process_group("gloo", init_method=f"file://{store2}", rank=rank, world_size=world,
                                    timeout=timedelta(seconds=30))
    assert names[0] == names[1] and names[2] == names[3], names
    assert names[0][0] == names[2][0], names  # torch reuses the default group's name
    return names


def test_own_group_made_once_and_again_after_reinit(tmp_path):
    run_ranks(_reinit, 2, str(tmp_path / "store2"))


def _bf16_gloo(rank, world):
    x = torch.full((1000,), float(rank + 1), dtype=torch.bfloat16)
    # torch 1.13's Gloo refused bf16 ("Invalid scalar type"); 2.14.1 accepts it. Printed for the record.
    try:
        dist.all_reduce(x.clone())
        torch_bf16 = "ok"
    except Exception as e:  # noqa: BLE001
        torch_bf16 = type(e).__name__ + ": " + str(e).splitlines()[0][:80]
    dynamiq.all_reduce(x, dynamiq.Config(mode="none"))
    assert torch.equal(x, torch.full((1000,), float(world * (world + 1) // 2), dtype=torch.bfloat16))
    return torch_bf16


def test_bf16_works_on_gloo():
    res = run_ranks(_bf16_gloo, 2)
    print("torch.distributed bf16 all_reduce on Gloo:", res[0])


def _real_run_bytes(rank, world, cfg_json):
    cfg = dynamiq.Config.from_json(cfg_json)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(50_000, generator=g)
    inp = x.clone()
    from dynamiq.api import _next_direct_seq, run_collective  # noqa: F401
    y = x.clone()
    fut = dynamiq.all_reduce(y, cfg, async_op=True)
    fut.wait()
    return inp, y


@pytest.mark.parametrize("topology", ["ring", "butterfly"])
def test_simulate_equals_real_run(topology):
    cfg = dynamiq.Config(mode="none", topology=topology, block_bytes=8192)
    res = run_ranks(_real_run_bytes, 3, cfg.to_json())
    inputs = [r[0] for r in res]
    sim = dynamiq.simulate(inputs, cfg)
    for r in range(3):
        assert torch.equal(sim[r], res[r][1])


def test_simulate_timeout_is_checked_and_large_ones_mean_no_limit():
    xs = [torch.full((100,), float(r)) for r in range(2)]
    for t in (float("inf"), 1e300, 10**12):  # these overflowed the C++ clock: an instant timeout
        assert torch.equal(dynamiq.simulate(xs, dynamiq.Config(mode="none"), timeout=t)[0], torch.full((100,), 1.0))
    for bad in (0, -1.0, float("nan"), "10", True):
        with pytest.raises(ValueError, match="timeout"):
            dynamiq.simulate(xs, dynamiq.Config(mode="none"), timeout=bad)


def test_simulate_does_not_modify_inputs_and_reports_bytes():
    xs = [torch.randn(10_000) for _ in range(5)]
    copies = [x.clone() for x in xs]
    out, stats = dynamiq.simulate(xs, dynamiq.Config(mode="none"), op="mean", return_stats=True)
    for x, c in zip(xs, copies):
        assert torch.equal(x, c)
    ref = torch.stack(xs).double().mean(0)
    assert torch.allclose(out[2].double(), ref, atol=1e-6)
    # ring: each rank sends 2 (n-1)/n of the bucket, to within one unit (256 elements) per chunk
    for s in stats:
        expected = 2 * 4 / 5 * 10_000 * 4
        assert abs(s["bytes_sent"] - expected) <= 2 * 4 * 256 * 4


@pytest.mark.parametrize("numel,bits,world", [(257, 5.0, 2), (257, 5.0, 3), (4097, 2.6, 2), (4097, 2.72, 3)])
def test_dynamiq_bucket_over_budget_takes_the_exact_path(numel, bits, world):
    # A partial last super-group travels padded to S, so on small buckets even the
    # narrowest plan can exceed the budget (257 elements at 5 bits, 4097 at 2.6):
    # the allocator would throw mid-training for some bucket sizes only. Such a
    # bucket is summed exactly instead (every rank decides alike from numel and
    # the config), and a bucket that fits stays compressed.
    cfg = dynamiq.Config(mode="dynamiq", bits=bits, min_compress_numel=0)
    g = torch.Generator().manual_seed(numel)
    xs = [torch.randn(numel, generator=g) for _ in range(world)]
    ref = dynamiq.simulate(xs, dynamiq.Config(mode="none"))
    out, stats = dynamiq.simulate(xs, cfg, return_stats=True)
    for r in range(world):
        assert stats[r]["path"] == "exact-budget"
        assert torch.equal(out[r], ref[r])
    fits = [torch.randn(numel - 1 + 256 * 8, generator=g) for _ in range(world)]
    _, st = dynamiq.simulate(fits, cfg.replace(bits=5.0), return_stats=True)
    assert st[0]["path"] == "compressed"


def _subgroup_then_new_groups(rank, world):
    a = dist.new_group([0, 1])
    x = torch.full((1000,), float(rank + 1))
    # rank 2 is outside `a`: the call returns at once there, as torch's does
    r = dynamiq.all_reduce(x, dynamiq.Config(mode="none"), group=a)
    assert r is None
    count = dist.distributed_c10d._world.group_count
    # torch's next group must get the same name on every rank: dynamiq's own group
    # for `a` (made on ranks 0 and 1 only) took no value of torch's group counter
    b = dist.new_group([0, 1, 2])
    y = torch.ones(10)
    dist.all_reduce(y, group=b)
    z = torch.full((1000,), float(rank + 1))
    dynamiq.all_reduce(z, dynamiq.Config(mode="none"))  # the world, through another group of dynamiq's
    return count, float(x[0]), float(y[0]), float(z[0])


def test_dynamiq_on_a_subgroup_leaves_torchs_group_names_in_step():
    # Before: dynamiq's group for `a` advanced torch's group counter on ranks 0 and 1
    # only, and the `new_group` after it hung on every rank (names differed).
    out = run_ranks(_subgroup_then_new_groups, 3, timeout=90, pg_timeout=20)
    assert len({c for c, *_ in out}) == 1, out
    assert [o[1] for o in out] == [3.0, 3.0, 3.0], out  # ranks 0, 1 summed; rank 2 untouched
    assert all(o[2] == 3.0 and o[3] == 6.0 for o in out), out


def _no_backend_given(rank, world):
    assert dist.get_backend() == "undefined", dist.get_backend()  # the case: torch picks per device
    x = torch.full((1000,), float(rank + 1))
    dynamiq.all_reduce(x, dynamiq.Config(mode="none"))
    return float(x[0])


def test_group_made_without_a_backend():
    assert run_ranks(_no_backend_given, 2, backend="") == [3.0, 3.0]


def _tensor_released(rank, world):
    import gc
    import time
    import weakref

    refs = []
    for async_op in (False, True):
        x = torch.full((1000,), float(rank + 1))
        refs.append(weakref.ref(x))
        fut = dynamiq.all_reduce(x, dynamiq.Config(mode="none"), async_op=async_op)
        if fut is not None:
            fut.wait()
        del x, fut
    deadline = time.monotonic() + 10  # the worker may still be returning from the call
    while any(r() is not None for r in refs) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.05)
    return [r() is None for r in refs]


def test_worker_does_not_keep_the_last_tensor_alive():
    # Before: the worker loop's locals held the last collective's closure (and its
    # tensor, for the hook the bucket and HookState) until the next collective.
    assert run_ranks(_tensor_released, 2) == [[True, True]] * 2


def _subgroup_churn(rank, world, cycles):
    import threading

    from dynamiq import _worker

    def dynamiq_threads():
        return sum(1 for t in threading.enumerate() if t.name.startswith("dynamiq-"))

    base = len(dist.distributed_c10d._world.pg_map)
    seen = []
    for i in range(cycles):
        g = dist.new_group(list(range(world)))
        x = torch.full((100_000,), float(rank + 1))
        dynamiq.all_reduce(x, dynamiq.Config(mode="lossless"), group=g)
        assert torch.equal(x, torch.full_like(x, world * (world + 1) / 2))
        dist.destroy_process_group(g)
        seen.append((len(dist.distributed_c10d._world.pg_map) - base, dynamiq_threads(), len(_worker._workers)))
    return seen


def test_destroyed_subgroups_free_dynamiqs_group_worker_and_buffers():
    # A job that makes and destroys groups as it goes: what dynamiq made for a
    # destroyed group (its own group, worker thread, that thread's buffers) is freed
    # at the next dynamiq call, so it stays bounded. Before: one more group, thread
    # (and 38 MB of lossless buffers for a 16 MB bucket) per cycle.
    cycles = 8
    for seen in run_ranks(_subgroup_churn, 2, cycles, timeout=120):
        groups, threads, workers = zip(*seen)
        assert max(groups) <= 2 and max(threads) <= 2 and max(workers) <= 1, seen
