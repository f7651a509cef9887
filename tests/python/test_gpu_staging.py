"""CUDA tensors over a Gloo group: several processes on ONE GPU (cuda:0), every
message staged device -> page-locked host -> Gloo -> host -> device
(csrc/hook/transport/staging_transport.h; automatic because the group has no
CUDA backend). Needs a CUDA build and one GPU; skips otherwise. The staging
logic itself runs without a GPU in tests/cpp/cuda_staging.cu (CUDA emulation).

- every mode and topology, fp32 and bf16, 2 and 3 processes: dynamiq.all_reduce
  on cuda:0 equals dynamiq.simulate (the CPU path) bit for bit;
- several async all_reduce futures in flight at once, on different buckets;
- reduce_scatter and all_gather on cuda:0 equal simulate bit for bit;
- the DDP hook on a CUDA model (the worker stream, the futures, the pools):
  every process ends each step with bit-identical parameters.
"""

import pytest
import torch
import torch.distributed as dist

import dynamiq
from dist_utils import run_ranks

MODES = tuple(dynamiq.available_modes())
TOPOLOGIES = tuple(dynamiq.available_topologies(compositions=False))  # the registry's schedules
DTYPES = (torch.float32, torch.bfloat16)

gpu = [pytest.mark.gpu, pytest.mark.skipif(
    not (dynamiq._C.built_with_cuda() and torch.cuda.is_available()),
    reason="needs a CUDA build of dynamiq and a GPU")]


def test_staging_is_chosen_for_cuda_tensors_on_groups_without_nccl():
    from dynamiq import _groups, api
    _groups._group_backends["t-gloo"] = "cpu:gloo,cuda:gloo"
    _groups._group_backends["t-both"] = "cpu:gloo,cuda:nccl"
    _groups._group_backends["t-nccl"] = "cuda:nccl"
    cfg = dynamiq.Config()
    assert api.host_staged("cuda:0", "t-gloo", cfg)
    assert not api.host_staged("cuda:0", "t-both", cfg) and not api.host_staged("cuda:0", "t-nccl", cfg)
    assert api.host_staged("cuda:1", "t-both", dynamiq.Config(host_staging=True))
    assert not api.host_staged("cpu", "t-gloo", dynamiq.Config(host_staging=True))
    with pytest.raises(dynamiq.ConfigError, match="host_staging"):
        dynamiq.Config(host_staging=1)


def _bits(t):
    return t.view(torch.int16 if t.dtype in (torch.bfloat16, torch.float16) else torch.int32)


def _input(rank, dtype, k, n=50_003):
    g = torch.Generator().manual_seed(1000 * k + rank)
    return (torch.randn(n, generator=g) * 1e-3).to(dtype)


def _cases():
    return [(m, t, d) for m in MODES for t in TOPOLOGIES for d in DTYPES]


def _all_reduce_on_one_gpu(rank, world):
    torch.cuda.set_device(0)
    out = []
    for k, (mode, topo, dtype) in enumerate(_cases()):
        x = _input(rank, dtype, k).to("cuda:0")
        dynamiq.all_reduce(x, dynamiq.Config(mode=mode, topology=topo), op="mean")
        out.append(x.cpu())
    # futures in flight together, completed in submission order
    k0 = len(out)
    xs = [_input(rank, torch.float32, k0 + i).to("cuda:0") for i in range(4)]
    futs = [dynamiq.all_reduce(x, dynamiq.Config(mode="dynamiq"), async_op=True) for x in xs]
    for f in futs:
        out.append(f.wait().cpu())
    return out


@gpu[0]
@gpu[1]
@pytest.mark.parametrize("world", [2, 3])
def test_all_reduce_on_one_gpu_over_gloo_equals_the_cpu_path(world):
    res = run_ranks(_all_reduce_on_one_gpu, world, timeout=900)
    cases = _cases()
    for k, (mode, topo, dtype) in enumerate(cases):
        inputs = [_input(r, dtype, k) for r in range(world)]
        expect = dynamiq.simulate(inputs, dynamiq.Config(mode=mode, topology=topo), op="mean", call_index=k)
        for r in range(world):
            assert torch.equal(_bits(res[r][k]), _bits(expect[r])), (mode, topo, dtype, r)
    k0 = len(cases)
    for i in range(4):
        inputs = [_input(r, torch.float32, k0 + i) for r in range(world)]
        expect = dynamiq.simulate(inputs, dynamiq.Config(mode="dynamiq"), call_index=k0 + i)
        for r in range(world):
            assert torch.equal(_bits(res[r][k0 + i]), _bits(expect[r])), ("future", i, r)


def _sharded_on_one_gpu(rank, world):
    torch.cuda.set_device(0)
    out = []
    for k, (coll, mode) in enumerate(_sharded_cases()):
        g = torch.Generator().manual_seed(1000 * k + rank)
        if coll == "reduce_scatter":
            x = (torch.randn(world * 5003, generator=g) * 1e-3).cuda()
            y = torch.empty(5003, device="cuda")
            dynamiq.reduce_scatter(y, x, dynamiq.Config(mode=mode), op="mean")
        else:
            x = (torch.randn(5003, generator=g) * 1e-3).cuda()
            y = torch.empty(world * 5003, device="cuda")
            dynamiq.all_gather(y, x, dynamiq.Config(mode=mode))
        out.append(y.cpu())
    return out


def _sharded_cases():
    return [(c, m) for c in ("reduce_scatter", "all_gather") for m in MODES
            if c == "reduce_scatter" or m in ("none", "lossless")]


@gpu[0]
@gpu[1]
@pytest.mark.parametrize("world", [2, 3])
def test_reduce_scatter_and_all_gather_on_one_gpu_equal_the_cpu_path(world):
    res = run_ranks(_sharded_on_one_gpu, world, timeout=600)
    for k, (coll, mode) in enumerate(_sharded_cases()):
        inputs = []
        for r in range(world):
            g = torch.Generator().manual_seed(1000 * k + r)
            inputs.append(torch.randn(world * 5003 if coll == "reduce_scatter" else 5003, generator=g) * 1e-3)
        expect = dynamiq.simulate(inputs, dynamiq.Config(mode=mode), op="mean", call_index=k, collective=coll)
        for r in range(world):
            assert torch.equal(_bits(res[r][k]), _bits(expect[r])), (coll, mode, r)


def _ddp_on_one_gpu(rank, world, mode):
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0], bucket_cap_mb=1)
    state = dynamiq.register(ddp, dynamiq.Config(mode=mode))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank + 1)
    same = []
    for _ in range(3):
        x = torch.randn(64, 256, generator=g).cuda()
        y = torch.randint(0, 10, (64,), generator=g).cuda()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        flat = torch.cat([p.detach().view(-1) for p in model.parameters()]).cpu()
        gathered = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat)
        same.append(all(torch.equal(_bits(t), _bits(gathered[0])) for t in gathered))
    return same, state.last_step_stats[0]["path"]


@gpu[0]
@gpu[1]
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("mode", ["dynamiq", "lossless"])
def test_ddp_hook_on_one_gpu_keeps_replicas_bit_identical(world, mode):
    res = run_ranks(_ddp_on_one_gpu, world, mode, timeout=600)
    for same, path in res:
        assert all(same), "parameters differ between processes"
        assert path in ("compressed", "exact-mode")
