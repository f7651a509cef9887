"""torch's comm-hook convention: `ddp.register_comm_hook(dynamiq.HookState(cfg), dynamiq.comm_hook)`
with a state made before init_process_group; it trains bit for bit as `dynamiq.register`,
resumes from a state loaded before it is bound, refuses a state of another model or
another group, and `summary()` / `scalars()` report what the step sent."""

import pickle

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import dynamiq
from dist_utils import run_ranks
from test_ddp_hook import _OneTensorMLP, batch, make_model

CFG = dynamiq.Config(mode="dynamiq", bits=4.0, min_compress_numel=0)


def test_hook_state_is_made_before_init_and_pickles():
    assert not dist.is_initialized()
    st = dynamiq.HookState(CFG)
    assert st.config == CFG and st.process_group is None and st.group_name is None and st.world_size is None
    assert dynamiq.HookState().config == dynamiq.Config()
    assert st.summary() == "dynamiq: no step completed yet" and st.scalars() == {}
    # a trainer that spawns its ranks pickles the state; a loaded sequence number survives
    sd = dict(st.state_dict(), seq=7, step=2)
    st.load_state_dict(sd)
    back = pickle.loads(pickle.dumps(st))
    assert back.state_dict() == sd and back._seq_loaded
    with pytest.raises(TypeError, match="dynamiq.Config"):
        dynamiq.HookState("dynamiq")
    with pytest.raises(TypeError, match="ProcessGroup"):
        dynamiq.HookState(CFG, process_group="world")


def _equivalence(rank, world, how, state):
    model = DDP(make_model(), bucket_cap_mb=0.01)
    if how == "register":
        state = dynamiq.register(model, CFG)
    else:  # made in the parent before any process group existed, and pickled here
        assert isinstance(state, dynamiq.HookState) and state.group_name is None
        model.register_comm_hook(state, dynamiq.comm_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    per_step = []
    for step in range(3):
        x, y = batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        per_step.append(len(state.last_step_stats))
    assert state.process_group is dist.group.WORLD and state.world_size == world
    assert state.group_name.startswith("dynamiq:")
    flat = torch.cat([p.detach().view(-1) for p in model.parameters()])
    return flat, state.step, per_step, dict(state.totals["paths"]), state.state_dict()


def test_comm_hook_trains_bit_for_bit_as_register():
    ref = run_ranks(_equivalence, 2, "register", None)
    ours = run_ranks(_equivalence, 2, "comm_hook", dynamiq.HookState(CFG))
    for r in range(2):
        flat, step, per_step, paths, sd = ours[r]
        # the hook ran on every bucket of every step (DDP's first step sends the model as one
        # bucket, later steps several: bucket_cap_mb=0.01)
        assert step == 3 and per_step[0] == 1 and min(per_step[1:]) >= 2, (step, per_step)
        assert paths == {"compressed": sum(per_step)}, paths
        assert torch.equal(flat, ref[r][0]), f"rank {r}: comm_hook trained other weights than register"
        assert sd == ref[r][4]
    assert torch.equal(ours[0][0], ours[1][0]), "replicas diverged"


def _resume(rank, world, phase, ckpt, state):
    torch.manual_seed(3)
    model = DDP(_OneTensorMLP())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    path = f"{ckpt}/rank{rank}.pt"
    steps = range(4)
    if phase == "second":
        saved = torch.load(path)
        model.module.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        state.load_state_dict(saved["dynamiq"])  # unbound: the state binds at the next bucket
        assert state.group_name is None
        steps = range(2, 4)
    model.register_comm_hook(state, dynamiq.comm_hook)
    for step in steps:
        x, y = batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if phase == "full" and step == 1:  # the checkpoint after 2 of 4 steps
            torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                        "dynamiq": state.state_dict()}, path)
    assert state.last_step_stats[0]["path"] == "compressed" and state.step == 4
    return torch.cat([p.detach().view(-1) for p in model.parameters()])


def test_comm_hook_state_loaded_before_binding_resumes_bit_for_bit(tmp_path):
    # The restarted job makes a default HookState() and loads config, sequence number
    # and allocator state into it before the first bucket binds it: the bound state
    # keeps them, and the job ends where the uninterrupted one ends (one parameter
    # tensor: one bucket layout before and after a restart, see test_ddp_hook's resume test).
    full = run_ranks(_resume, 2, "full", str(tmp_path), dynamiq.HookState(CFG))
    resumed = run_ranks(_resume, 2, "second", str(tmp_path), dynamiq.HookState())
    for r in range(2):
        assert torch.equal(resumed[r], full[r]), f"rank {r}: resumed run differs"


def _backward_error(model, rank):
    x, y = batch(rank, 0)
    try:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    except Exception as e:  # noqa: BLE001 - DDP may rethrow the hook's error as a RuntimeError
        return f"{type(e).__name__}: {e}"
    return "no error"


def _bad_use(rank, world):
    out = {}
    # a state bound to one model (by register, and stepped) given to another
    a = DDP(make_model(), bucket_cap_mb=0.01)
    state = dynamiq.register(a, CFG)
    x, y = batch(rank, 0)
    torch.nn.functional.cross_entropy(a(x), y).backward()
    b = DDP(make_model(), bucket_cap_mb=0.01)
    b.register_comm_hook(state, dynamiq.comm_hook)
    out["other_model"] = _backward_error(b, rank)
    # one unbound state registered on two models
    shared = dynamiq.HookState(CFG)
    c, d = DDP(make_model()), DDP(make_model())
    c.register_comm_hook(shared, dynamiq.comm_hook)
    d.register_comm_hook(shared, dynamiq.comm_hook)
    out["two_models"] = _backward_error(c, rank)
    # the state's group is not the model's (same ranks, another group)
    sub = dist.new_group([0, 1])
    e = DDP(make_model())
    e.register_comm_hook(dynamiq.HookState(CFG, process_group=sub), dynamiq.comm_hook)
    out["group"] = _backward_error(e, rank)
    try:
        dynamiq.register(DDP(make_model()), CFG, process_group=sub)
        out["register_group"] = "no error"
    except dynamiq.DynamiqError as err:
        out["register_group"] = str(err)
    # not a HookState at all
    f = DDP(make_model())
    f.register_comm_hook(None, dynamiq.comm_hook)
    out["none"] = _backward_error(f, rank)
    # after all that the group is in step: a correct model trains
    g = DDP(make_model(), bucket_cap_mb=0.01)
    good = dynamiq.HookState(CFG)
    g.register_comm_hook(good, dynamiq.comm_hook)
    assert _backward_error(g, rank) == "no error"
    assert good.step == 1 and good.totals["paths"] == {"compressed": 1}
    return out


def test_comm_hook_refuses_a_state_of_another_model_or_group():
    res = run_ranks(_bad_use, 2, pg_timeout=30)
    for out in res:
        assert "DynamiqError" in out["other_model"] and "already bound to another DDP model" in out["other_model"], out
        assert "registered on 2 DDP models" in out["two_models"], out
        assert "process-group mismatch" in out["group"] and "ranks [0, 1]" in out["group"], out
        assert "process-group mismatch" in out["register_group"], out
        assert "state must be a dynamiq.HookState" in out["none"], out


def _summary(rank, world):
    model = DDP(make_model(), bucket_cap_mb=0.01)
    state = dynamiq.HookState(dynamiq.Config(mode="none", topology="ring"))
    model.register_comm_hook(state, dynamiq.comm_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    lines, scalars = [], []
    for step, cfg in enumerate([state.config, CFG]):
        state.config = cfg
        x, y = batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        lines.append(state.summary())
        scalars.append(state.scalars())
    return lines, scalars, sum(p.numel() for p in model.parameters())


def test_summary_reports_what_the_step_sent():
    lines, sc, nparams = run_ranks(_summary, 2)[0]
    for k, line in enumerate(lines):
        assert line.startswith(f"dynamiq step {k + 1}: ") and "\n" not in line, line
    # a ring all-reduce of n=2 ranks sends each rank's half twice: the whole fp32 model
    none, dq = sc
    assert none["dynamiq/ring_bytes"] == 4 * nparams
    assert abs(none["dynamiq/saved_fraction"]) < 0.01 and none["dynamiq/meta_bytes_sent"] == 0, none
    assert none["dynamiq/bits_per_coord"] == 32.0 and none["dynamiq/paths/exact"] == none["dynamiq/buckets"]
    # at most 4 bits of 32 in the plan; on the wire that, the statistics all-reduce and block headers
    bits, saved = dq["dynamiq/bits_per_coord"], dq["dynamiq/saved_fraction"]
    assert 3.5 < bits <= 4.0 and dq["dynamiq/paths/compressed"] == dq["dynamiq/buckets"], dq
    meta = dq["dynamiq/meta_bytes_sent"] / dq["dynamiq/ring_bytes"]
    assert 1 - bits / 32 - meta - 0.01 < saved <= 1 - bits / 32 - meta, dq
    assert dq["dynamiq/t_total_ms"] >= dq["dynamiq/t_codec_ms"] > 0 and dq["dynamiq/t_wire_ms"] > 0, dq
    assert "% saved" in lines[1] and "paths compressed" in lines[1], lines[1]
