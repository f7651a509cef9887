"""The GPU path: CUDA buckets over NCCL. Needs 2 GPUs and a CUDA build; skips otherwise.

This file has never run: no GPU has been available to this project (see the
README's hardware table). On a machine with GPUs it is the acceptance test of
the GPU driver, against the CPU path as the oracle:

- every mode and topology, fp32 and bf16: a CUDA all_reduce over NCCL gives,
  on every rank, exactly (bit for bit) what the same collective gives on the
  CPU path (`dynamiq.simulate` with the same call index: same Philox
  streams), with the communicators made lazily and eagerly (the two ways
  ProcessGroupNCCL orders point-to-point operations; see
  experiments/results/nccl_order/README.md);
- an inf on one rank reaches every rank's result (the exact path);
- the DDP hook on a CUDA model: every rank ends each step with bit-identical
  parameters, close to what exact averaging gives;
- reduce_scatter (every mode) and all_gather (none, lossless) on CUDA tensors give
  what simulate(collective=...) gives, bit for bit, shards whole and padded;
- FSDP2 on CUDA with dynamiq.fsdp.enable: lossless trains bit-identically to none.
"""

import pytest
import torch
import torch.distributed as dist

import dynamiq
from dist_utils import run_ranks

WORLD = 2
MODES = tuple(m for m in dynamiq.available_modes() if m != "bounded")  # bounded has no CUDA codec yet
TOPOLOGIES = tuple(dynamiq.available_topologies(compositions=False))  # the registry's schedules
DTYPES = (torch.float32, torch.bfloat16)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not (dynamiq._C.built_with_cuda() and torch.cuda.is_available() and torch.cuda.device_count() >= WORLD),
    reason=f"needs a CUDA build of dynamiq and {WORLD} GPUs")]


def _input(rank, dtype, k):
    g = torch.Generator().manual_seed(1000 * k + rank)
    x = torch.randn(70_003, generator=g) * 1e-3
    return x.to(dtype)


def _cases():
    return [(m, t, d) for m in MODES for t in TOPOLOGIES for d in DTYPES]


def _all_reduce_cuda(rank, world):
    out = []
    for k, (mode, topo, dtype) in enumerate(_cases()):
        x = _input(rank, dtype, k).cuda()
        dynamiq.all_reduce(x, dynamiq.Config(mode=mode, topology=topo), op="mean")
        out.append(x.cpu())
    k = len(out)  # an inf on rank 1: every rank's result is non-finite
    x = _input(rank, torch.float32, k)
    if rank == 1:
        x[123] = float("inf")
    x = x.cuda()
    dynamiq.all_reduce(x, dynamiq.Config(mode="dynamiq"), op="mean")
    out.append(x.cpu())
    return out


@pytest.mark.parametrize("eager", [False, True], ids=["lazy-communicators", "eager-communicators"])
def test_cuda_all_reduce_equals_the_cpu_path_bit_for_bit(eager):
    res = run_ranks(_all_reduce_cuda, WORLD, timeout=900, backend="nccl", eager=eager)
    for k, (mode, topo, dtype) in enumerate(_cases()):
        inputs = [_input(r, dtype, k) for r in range(WORLD)]
        expect = dynamiq.simulate(inputs, dynamiq.Config(mode=mode, topology=topo), op="mean", call_index=k)
        for r in range(WORLD):
            got, want = res[r][k], expect[r]
            assert got.dtype == want.dtype
            assert torch.equal(got.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                               want.view(torch.int16 if dtype == torch.bfloat16 else torch.int32)), \
                (mode, topo, dtype, r)
    for r in range(WORLD):
        assert not torch.isfinite(res[r][-1][123]), "the inf did not reach rank %d" % r


def _ddp(rank, world):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank], bucket_cap_mb=1)
    state = dynamiq.register(ddp, dynamiq.Config(mode="dynamiq"))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank + 1)
    worst = 0.0
    for _ in range(3):
        x = torch.randn(64, 256, generator=g).cuda()
        y = torch.randint(0, 10, (64,), generator=g).cuda()
        # the exact mean of the local gradients, for comparison
        with ddp.no_sync():
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
        exact = [p.grad.detach().clone() for p in model.parameters()]
        for e in exact:
            dist.all_reduce(e)
            e /= world
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        for p, e in zip(model.parameters(), exact):
            worst = max(worst, ((p.grad - e).norm() / e.norm().clamp_min(1e-30)).item())
        opt.step()
    flat = torch.cat([p.detach().view(-1) for p in model.parameters()]).view(torch.int32)
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    return all(torch.equal(t, gathered[0]) for t in gathered), worst, state.last_step_stats[0]["path"]


def test_ddp_hook_on_cuda_model():
    res = run_ranks(_ddp, WORLD, timeout=600, backend="nccl")
    for same, worst, path in res:
        assert same, "parameters differ between ranks"
        assert path == "compressed"
        assert worst < 0.5, f"relative gradient error {worst:.3f}: far above 5-bit DynamiQ's"


def _no_backend_given(rank, world):
    # init_process_group() without a backend: torch reports "undefined" from
    # get_backend and "cpu:gloo,cuda:nccl" from get_backend_config; dynamiq must
    # read the latter (it once read the former and refused CUDA tensors)
    assert dist.get_backend() == "undefined"
    x = torch.full((1000,), float(rank + 1), device="cuda")
    dynamiq.all_reduce(x, dynamiq.Config(mode="none"))
    return float(x[0])


def test_group_made_without_a_backend_carries_cuda_tensors():
    assert run_ranks(_no_backend_given, WORLD, backend="") == [float(WORLD * (WORLD + 1) // 2)] * WORLD


def _sharded_cases():
    return [(c, m, t, d, s) for c in ("reduce_scatter", "all_gather") for m in MODES for t in TOPOLOGIES
            for d in DTYPES for s in (4096, 5003)
            if c == "reduce_scatter" or m in ("none", "lossless")]


def _sharded_cuda(rank, world):
    out = []
    for k, (coll, mode, topo, dtype, shard) in enumerate(_sharded_cases()):
        cfg = dynamiq.Config(mode=mode, topology=topo)
        g = torch.Generator().manual_seed(1000 * k + rank)
        if coll == "reduce_scatter":
            x = (torch.randn(world * shard, generator=g) * 1e-3).to(dtype).cuda()
            y = torch.empty(shard, dtype=dtype, device="cuda")
            dynamiq.reduce_scatter(y, x, cfg, op="mean")
        else:
            x = (torch.randn(shard, generator=g) * 1e-3).to(dtype).cuda()
            y = torch.empty(world * shard, dtype=dtype, device="cuda")
            dynamiq.all_gather(y, x, cfg)
        out.append(y.cpu())
    return out


def test_cuda_reduce_scatter_and_all_gather_equal_the_cpu_path_bit_for_bit():
    res = run_ranks(_sharded_cuda, WORLD, timeout=900, backend="nccl")
    for k, (coll, mode, topo, dtype, shard) in enumerate(_sharded_cases()):
        inputs = []
        for r in range(WORLD):
            g = torch.Generator().manual_seed(1000 * k + r)
            n = WORLD * shard if coll == "reduce_scatter" else shard
            inputs.append((torch.randn(n, generator=g) * 1e-3).to(dtype))
        expect = dynamiq.simulate(inputs, dynamiq.Config(mode=mode, topology=topo), op="mean", call_index=k,
                                  collective=coll)
        iv = torch.int16 if dtype == torch.bfloat16 else torch.int32
        for r in range(WORLD):
            assert torch.equal(res[r][k].view(iv), expect[r].view(iv)), (coll, mode, topo, dtype, shard, r)


def _fsdp_cuda(rank, world):
    from torch.distributed.fsdp import fully_shard
    out = {}
    for mode in ("none", "lossless"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64)).cuda()
        fully_shard(model[0])
        fully_shard(model)
        dynamiq.fsdp.enable(model, dynamiq.Config(mode=mode), all_gather=mode)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        losses = []
        for step in range(10):
            g = torch.Generator().manual_seed(100 * step + rank)
            x = torch.randn(32, 64, generator=g).cuda()
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach().cpu())
        out[mode] = torch.stack(losses)
    return out


def test_fsdp2_on_cuda_lossless_equals_none():
    res = run_ranks(_fsdp_cuda, WORLD, timeout=600, backend="nccl")
    for r in range(WORLD):
        assert torch.equal(res[r]["none"], res[r]["lossless"]), r
