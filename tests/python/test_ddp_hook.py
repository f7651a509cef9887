"""The DDP comm hook in mode "none": training with the hook matches training
without it; no_sync accumulation, gradient_as_bucket_view, bf16 buckets and
DDP's bucket rebuild after the first iteration all work; config switches
between steps apply on every rank."""

import copy

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import dynamiq
from dist_utils import run_ranks


def make_model(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 10))
    return m.to(dtype)


def batch(rank, step, dtype=torch.float32):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 32, generator=g).to(dtype), torch.randint(0, 10, (16,), generator=g)


def train(model, rank, steps, accumulate=1, dtype=torch.float32, forward=None):
    """SGD steps on batch(rank, ...); `forward` (default: the model) computes the
    output, e.g. a torch.compile'd model. Returns copies of the parameters."""
    forward = forward if forward is not None else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        opt.zero_grad()
        for micro in range(accumulate):
            x, y = batch(rank, step * accumulate + micro, dtype)
            ctx = model.no_sync() if micro < accumulate - 1 else _null()
            with ctx:
                loss = torch.nn.functional.cross_entropy(forward(x).float(), y)
                loss.backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _hook_matches_no_hook(rank, world, accumulate, bucket_view, topology):
    base = make_model()
    # small buckets: several per step, so DDP's bucket order and rebuild matter
    ref = DDP(copy.deepcopy(base), bucket_cap_mb=0.01)
    ours = DDP(copy.deepcopy(base), bucket_cap_mb=0.01, gradient_as_bucket_view=bucket_view)
    state = dynamiq.register(ours, dynamiq.Config(mode="none", topology=topology))
    p_ref = train(ref, rank, 6, accumulate)
    p_ours = train(ours, rank, 6, accumulate)
    for a, b in zip(p_ref, p_ours):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    # every step all-reduced every parameter exactly once, across DDP's rebuild
    nparams = sum(p.numel() for p in base.parameters())
    assert state.step == 6
    assert sum(s["numel"] for s in state.last_step_stats) == nparams
    assert len(state.last_step_stats) >= 2
    return [s["numel"] for s in state.last_step_stats]


@pytest.mark.parametrize("world,accumulate,bucket_view,topology", [
    (2, 1, False, "ring"),
    (3, 2, True, "butterfly"),
    (4, 1, True, "twostep"),
])
def test_hook_matches_no_hook(world, accumulate, bucket_view, topology):
    run_ranks(_hook_matches_no_hook, world, accumulate, bucket_view, topology, timeout=600)


def _bf16_model(rank, world):
    model = DDP(make_model(dtype=torch.bfloat16), bucket_cap_mb=0.01)
    dynamiq.register(model, dynamiq.Config(mode="none"))
    # one step: the averaged gradient must equal the mean of the local
    # gradients (computed without DDP and gathered in float32)
    local = make_model(dtype=torch.bfloat16)
    x, y = batch(rank, 0, torch.bfloat16)
    torch.nn.functional.cross_entropy(local(x).float(), y).backward()
    torch.nn.functional.cross_entropy(model(x).float(), y).backward()
    for p_local, p_ddp in zip(local.parameters(), model.parameters()):
        g = p_local.grad.float()
        dist.all_reduce(g)
        g /= world
        # each of <= n-1 hops and the division round to bf16
        torch.testing.assert_close(p_ddp.grad.float(), g, rtol=(world + 1) * 2 ** -8, atol=1e-6)
    params = train(model, rank, 3, dtype=torch.bfloat16)
    flat = torch.cat([p.view(-1) for p in params]).view(torch.int16).to(torch.int32)
    out = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(out, flat)
    assert all(torch.equal(o, out[0]) for o in out), "bf16 replicas diverged"


def test_bf16_buckets_on_gloo():
    run_ranks(_bf16_model, 2)


def _switch(rank, world):
    model = DDP(make_model(), bucket_cap_mb=0.01)
    state = dynamiq.register(model, dynamiq.Config(mode="none", topology="ring"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    paths = []
    for step, topo in enumerate(["ring", "butterfly", "twostep", "ring"]):
        state.config = state.config.replace(topology=topo)
        x, y = batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        paths.append({s["path"] for s in state.last_step_stats})
    sd = state.state_dict()
    fresh = dynamiq.HookState()
    fresh.load_state_dict(sd)
    assert fresh.seq == state.seq and fresh.step == state.step and fresh.config == state.config
    return paths


def test_config_switch_and_state_dict():
    res = run_ranks(_switch, 2)
    assert res[0] == [{"exact"}] * 4


class _Branchy(torch.nn.Module):
    """Two heads; steps that use `other` leave `head` without a gradient (and vice versa)."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(32, 96)
        self.head = torch.nn.Linear(96, 10)
        self.other = torch.nn.Linear(96, 10)

    def forward(self, x, use_other=False):
        h = torch.relu(self.body(x))
        return self.other(h) if use_other else self.head(h)


def _ddp_own_collectives(rank, world, ddp_kw, mode):
    # With find_unused_parameters=True DDP all-reduces its unused-parameter map on the
    # autograd thread right after the last bucket's hook returns, while dynamiq's worker
    # is still sending that bucket. On one process group the two interleave differently
    # on different ranks: Gloo aborted the process ("op.preamble.length <= op.nbytes")
    # in both find_unused cases before dynamiq used a group of its own. static_graph=True
    # (whose first step delays every bucket until that map is reduced) is here as a
    # configuration that must keep working; it did not fail before.
    torch.manual_seed(0)
    base = _Branchy()
    ref = DDP(copy.deepcopy(base), bucket_cap_mb=0.001, **ddp_kw)
    ours = DDP(copy.deepcopy(base), bucket_cap_mb=0.001, **ddp_kw)
    state = dynamiq.register(ours, dynamiq.Config(mode=mode, min_compress_numel=0))
    dynamic = "find_unused_parameters" in ddp_kw
    params = []
    for model in (ref, ours):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(5):
            x, y = batch(rank, step)
            opt.zero_grad()
            out = model(x, use_other=dynamic and step % 2 == 1)
            torch.nn.functional.cross_entropy(out, y).backward()
            opt.step()
        params.append(torch.cat([p.detach().view(-1) for p in model.parameters()]))
    assert state.step == 5
    if mode != "dynamiq":  # exact modes: the same training as DDP's own all-reduce
        torch.testing.assert_close(params[1], params[0], rtol=1e-5, atol=1e-6)
    return params[1]


@pytest.mark.parametrize("ddp_kw,mode,world", [
    ({"find_unused_parameters": True}, "none", 2),
    ({"find_unused_parameters": True}, "dynamiq", 3),
    ({"static_graph": True}, "lossless", 2),
])
def test_ddp_own_collectives_do_not_mix_with_dynamiqs(ddp_kw, mode, world):
    res = run_ranks(_ddp_own_collectives, world, ddp_kw, mode)
    assert all(torch.equal(r, res[0]) for r in res), "replicas diverged"


def _data_parallel_subgroups(rank, world, mode):
    # Hybrid parallelism: DDP over groups {0, 2} and {1, 3} (each rank holds, say,
    # one tensor-parallel shard); dynamiq averages over the model's group only.
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    g = groups[rank % 2]
    base = make_model(seed=rank % 2)  # the two groups train different models
    ref = DDP(copy.deepcopy(base), process_group=g, bucket_cap_mb=0.01)
    ours = DDP(copy.deepcopy(base), process_group=g, bucket_cap_mb=0.01)
    state = dynamiq.register(ours, dynamiq.Config(mode=mode, min_compress_numel=0))
    p_ref = train(ref, rank, 3)
    p_ours = train(ours, rank, 3)
    if mode == "none":
        for a, b in zip(p_ref, p_ours):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    assert state.world_size == 2
    return torch.cat([p.view(-1) for p in p_ours]), {s["path"] for s in state.last_step_stats}


@pytest.mark.parametrize("mode", ["none", "dynamiq"])
def test_ddp_on_data_parallel_subgroups(mode):
    res = run_ranks(_data_parallel_subgroups, 4, mode)
    # replicas agree within their group; the groups trained different models
    assert torch.equal(res[0][0], res[2][0]) and torch.equal(res[1][0], res[3][0])
    assert not torch.equal(res[0][0], res[1][0])
    assert res[0][1] == {"exact" if mode == "none" else "compressed"}


def _two_models(rank, world):
    # Two models with the same weights, data and seed, registered on one group (a GAN's
    # generator and discriminator, a teacher and a student): their gradient estimates
    # must carry independent rounding noise, not the same random numbers twice.
    cfg = dynamiq.Config(mode="dynamiq", bits=5.0, min_compress_numel=0)
    models = [DDP(make_model(), bucket_cap_mb=0.01) for _ in range(2)]
    states = [dynamiq.register(m, cfg) for m in models]
    x, y = batch(rank, 0)
    for m in models:
        torch.nn.functional.cross_entropy(m(x), y).backward()
    exact = make_model()
    torch.nn.functional.cross_entropy(exact(x), y).backward()
    grads = [torch.cat([p.grad.view(-1) for p in m.parameters()]) for m in (exact, *models)]
    dist.all_reduce(grads[0])
    grads[0] /= world
    return grads, [{s["path"] for s in st.last_step_stats} for st in states]


def test_two_models_on_one_group_draw_different_randomness():
    res = run_ranks(_two_models, 2)
    (exact, a, b), paths = res[0]
    assert paths == [{"compressed"}, {"compressed"}]
    for g in (a, b):  # both estimates of the same mean gradient (5 bits: ~0.11 measured)
        assert ((g - exact).norm() / exact.norm()).item() < 0.25
    assert not torch.equal(a, b), "the two models' all-reduces drew the same random numbers"
    # and the two errors are not correlated: |cos| of two independent errors is ~1/sqrt(d)
    ea, eb = a - exact, b - exact
    assert abs(torch.nn.functional.cosine_similarity(ea, eb, dim=0).item()) < 0.2


def _uneven_inputs(rank, world):
    # torch's Join: a rank out of data shadows the others' all-reduces by running the
    # comm hook on zero buckets, so every rank must keep matching dynamiq's collectives.
    from torch.distributed.algorithms.join import Join
    params = []
    for hooked in (False, True):
        model = DDP(make_model(), bucket_cap_mb=0.01)
        if hooked:
            dynamiq.register(model, dynamiq.Config(mode="none"))
        with Join([model]):
            train(model, rank, 2 + 2 * rank)  # rank r has 2 + 2r batches
        # read after the context: leaving it gives every rank the last joiner's parameters
        params.append(torch.cat([p.detach().view(-1) for p in model.parameters()]))
    torch.testing.assert_close(params[1], params[0], rtol=1e-5, atol=1e-6)
    return params[1]


def test_uneven_inputs_with_join():
    res = run_ranks(_uneven_inputs, 3)
    assert all(torch.equal(r, res[0]) for r in res), "replicas diverged"


def _hook_error(rank, world):
    # A failing collective inside the hook reaches loss.backward() on every rank as
    # an error that names dynamiq's exception and message (DDP rethrows it from C++
    # as a RuntimeError), not as a cast failure of the hook's result.
    model = DDP(make_model(), bucket_cap_mb=0.01)
    state = dynamiq.register(model, dynamiq.Config(mode="none"))
    state.config = state.config.replace(topology="butterfly" if rank == 1 else "ring")
    x, y = batch(rank, 0)
    try:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    except RuntimeError as e:
        return str(e)
    return "no error"


def test_hook_error_reaches_backward_with_its_message():
    res = run_ranks(_hook_error, 2, pg_timeout=20)
    for msg in res:
        assert "DynamiqError: ranks disagree on topology" in msg, msg
        assert "Unable to cast" not in msg, msg


class _OneTensorMLP(torch.nn.Module):
    """A two-layer MLP whose weights are views into one parameter: DDP's bucket then
    has one layout, in the first step after a restart too (see the test)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(64 * 32 + 10 * 64) * 0.1)

    def forward(self, x):
        w1, w2 = self.w[:64 * 32].view(64, 32), self.w[64 * 32:].view(10, 64)
        return torch.relu(x @ w1.T) @ w2.T


def _resume(rank, world, phase, ckpt):
    cfg = dynamiq.Config(mode="dynamiq", bits=4.0, min_compress_numel=0)
    torch.manual_seed(3)
    model = DDP(_OneTensorMLP())
    state = dynamiq.register(model, cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    path = f"{ckpt}/rank{rank}.pt"
    steps = range(6)
    if phase == "first":
        steps = range(3)
    elif phase.startswith("second"):
        saved = torch.load(path)
        model.module.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        if phase == "second":
            state.load_state_dict(saved["dynamiq"])
        steps = range(3, 6)
    for step in steps:
        x, y = batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    assert state.last_step_stats[0]["path"] == "compressed"
    if phase == "first":
        torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                    "dynamiq": state.state_dict()}, path)
    return torch.cat([p.detach().view(-1) for p in model.parameters()])


def test_resume_from_checkpoint_continues_bit_for_bit(tmp_path):
    # A job stopped after step 3 and resumed from its checkpoint (model, optimizer
    # with momentum, HookState: sequence number and allocator offsets) in new
    # processes ends where the uninterrupted job ends, bit for bit. This needs the
    # bucket to hold the same values in the same places: DDP lays a fresh model's
    # buckets out in parameter order and rebuilds them in gradient-ready order after
    # the first step, so with several parameters the first step after a restart can
    # see another layout than the uninterrupted run (then a lossy mode gives other,
    # equally valid, rounding). One parameter tensor keeps one layout.
    full = run_ranks(_resume, 2, "full", str(tmp_path))
    run_ranks(_resume, 2, "first", str(tmp_path))
    # the hook state is the same on every rank (one rank's copy is enough to resume)
    states = [torch.load(f"{tmp_path}/rank{r}.pt")["dynamiq"] for r in range(2)]
    assert states[0] == states[1] and states[0]["alloc_u"], states
    resumed = run_ranks(_resume, 2, "second", str(tmp_path))
    for r in range(2):
        assert torch.equal(resumed[r], full[r]), f"rank {r}: resumed run differs"
    # without the hook's state the random stream restarts, and the result differs
    fresh = run_ranks(_resume, 2, "second-without-hook-state", str(tmp_path))
    assert not torch.equal(fresh[0], full[0])


def _compiled(rank, world):
    # torch.compile on a DDP model (Dynamo splits the graph at bucket boundaries, and
    # DDP's reducer still calls the hook): the same training as compiled DDP without it.
    base = make_model()
    params = []
    for hooked in (False, True):
        model = DDP(copy.deepcopy(base))
        if hooked:
            state = dynamiq.register(model, dynamiq.Config(mode="none"))
        trained = train(model, rank, 3, forward=torch.compile(model))
        params.append(torch.cat([p.view(-1) for p in trained]))
    torch.testing.assert_close(params[1], params[0], rtol=1e-5, atol=1e-6)
    assert state.step == 3 and sum(s["numel"] for s in state.last_step_stats) == params[1].numel()
    return params[1]


def test_torch_compile_ddp_model():
    res = run_ranks(_compiled, 2, timeout=600)
    assert torch.equal(res[0], res[1])


class _SparseEmbeddingModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(1000, 32, sparse=True)
        self.head = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))

    def forward(self, ids):
        return self.head(self.emb(ids).mean(dim=1))


def _sparse_grads(rank, world, mode):
    # nn.Embedding(sparse=True): DDP hands the hook a sparse bucket of its own. The hook
    # averages it uncompressed (torch's sparse all-reduce on dynamiq's group) and the
    # dense buckets as configured; the training equals DDP's own (mode none) or keeps
    # the replicas equal (dynamiq).
    torch.manual_seed(0)
    base = _SparseEmbeddingModel()
    params = []
    for hooked in (False, True):
        model = DDP(copy.deepcopy(base))
        if hooked:
            state = dynamiq.register(model, dynamiq.Config(mode=mode, min_compress_numel=0))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            g = torch.Generator().manual_seed(100 * step + rank)
            ids = torch.randint(0, 1000, (8, 5), generator=g)
            y = torch.randint(0, 10, (8,), generator=g)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(ids), y).backward()
            opt.step()
        params.append(torch.cat([p.detach().view(-1) for p in model.parameters()]))
    if mode == "none":
        torch.testing.assert_close(params[1], params[0], rtol=1e-5, atol=1e-6)
    assert sum(s["numel"] for s in state.last_step_stats) == params[1].numel()
    return params[1], sorted(s["path"] for s in state.last_step_stats)


@pytest.mark.parametrize("mode", ["none", "dynamiq"])
def test_sparse_embedding_gradients(mode):
    res = run_ranks(_sparse_grads, 2, mode)
    assert torch.equal(res[0][0], res[1][0]), "replicas diverged"
    assert res[0][1] == sorted(["sparse", "exact" if mode == "none" else "compressed"]), res[0][1]


def _pool_after_first_step(rank, world, max_collective_bytes=None):
    config = {} if max_collective_bytes is None else {"max_collective_bytes": max_collective_bytes}
    # DDP's first step all-reduces the whole model as one bucket (8 MB here); later
    # steps use 1 MB buckets. The worker's buffer pool (stats "pool_bytes") must hold
    # the first step's working set only until 16 later collectives have passed.
    # Lossless: its final bytes (worst-case sized buffers) are kept for the all-gather
    # (mode none keeps them in the bucket itself and holds little more than its windows).
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(32)]), bucket_cap_mb=1)
    state = dynamiq.register(model, dynamiq.Config(mode="lossless", **config))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    pools, calls, slices = [], [], []
    for step in range(5):
        opt.zero_grad()
        model(torch.randn(4, 256)).pow(2).mean().backward()
        opt.step()
        pools.append(max(s["pool_bytes"] for s in state.last_step_stats))
        calls.append(len(state.last_step_stats))
        slices.append(sum(s["slices"] for s in state.last_step_stats))
    if config:
        return pools, calls, slices, torch.cat([p.detach().view(-1) for p in model.parameters()])
    return pools, calls


def test_first_step_bucket_split_by_max_collective_bytes():
    # The same job with the whole-model bucket of the first step run as 2 MiB
    # collectives: 5 slices, a pool of about one slice's working set instead of the
    # bucket's (measured 3.4 MB after the first step; 13.5 MB unsplit), and the same
    # exact result.
    split = run_ranks(_pool_after_first_step, 2, 2 << 20)
    whole = run_ranks(_pool_after_first_step, 2, 0)
    for rank in range(2):
        pools, calls, slices, params = split[rank]
        assert calls[0] == 1 and slices[0] == 5, (calls, slices)  # 8.03 MB in <= 2 MiB slices
        assert slices[1:] == calls[1:], slices  # later buckets (~1 MB) are not split
        assert pools[0] < 4 << 20, pools
        assert whole[rank][0][0] > 8 << 20, whole[rank][0]
        assert torch.equal(params, whole[rank][3]), "lossless must give the same result split or not"


def test_buffer_pool_shrinks_after_ddp_first_step():
    pools, calls = run_ranks(_pool_after_first_step, 2)[0]
    assert calls[0] == 1 and all(c >= 8 for c in calls[1:]), calls  # one bucket, then 1 MB buckets
    assert pools[0] >= 4 << 20, pools  # the rank's half of 8 MB, kept for the all-gather
    # 16+ collectives of 1 MB buckets later (measured 2.7 MB; 13.5 MB, the first step's,
    # without trimming)
    assert pools[-1] < 4 << 20 and pools[-1] <= pools[0] // 2, pools
