"""Topologies and transports come from the C++ core (`_C`), not from lists in Python.

The topology registry (csrc/hook/collective/topology.h) lists every topology with its id (part
of the wire fingerprint: pinned here), the collectives it runs and whether it is a schedule or a
composition (hierarchical); `Config` and the bindings check names and ids against it. The
transport factory (csrc/hook/transport/transport_factory.h) decides which transport carries a
tensor over a group from the group's backends and the tensor's device, and refuses UCC, MPI and
other backends with a message naming them, instead of taking them for CPU-only Gloo groups.
"""
import pytest
import torch

import dynamiq
from dynamiq import _C
from dist_utils import run_ranks


def test_topologies_their_wire_ids_and_collectives():
    assert dynamiq.available_topologies() == ["ring", "butterfly", "twostep", "hierarchical"]
    for i, topo in enumerate(dynamiq.available_topologies()):
        assert _C.topology_id(topo) == i
        assert dynamiq.Config(mode="none", topology=topo)._to_cpp().topology == i
    info = {t["name"]: t for t in _C.available_topologies()}
    assert info["hierarchical"]["composition"] and info["hierarchical"]["collectives"] == ["all-reduce"]
    assert info["ring"]["collectives"] == ["all-reduce", "reduce-scatter", "all-gather"]
    assert dynamiq.available_topologies("reduce_scatter") == ["ring", "butterfly", "twostep"]
    assert dynamiq.available_topologies("all_reduce", compositions=False) == ["ring", "butterfly", "twostep"]
    with pytest.raises(dynamiq.DynamiqError, match="unknown topology 'mesh'"):
        _C.topology_id("mesh")


def test_config_takes_the_topology_list_from_C(monkeypatch):
    entries = [{"name": "ring", "id": 0, "collectives": ["all-reduce"], "composition": False},
               {"name": "mesh", "id": 9, "collectives": ["all-reduce"], "composition": False}]
    monkeypatch.setattr(_C, "available_topologies", lambda: entries)
    assert dynamiq.available_topologies() == ["ring", "mesh"]
    with pytest.raises(dynamiq.ConfigError, match="topology='butterfly' is invalid; allowed: ring, mesh$"):
        dynamiq.Config(topology="butterfly")
    # past Python's list, the binding checks the name against the registry itself
    with pytest.raises(dynamiq.ConfigError, match="unknown topology 'mesh' .registered: ring, butterfly"):
        dynamiq.Config(mode="none", topology="mesh")


def test_python_keeps_no_list_of_topologies():
    # Config, the sharded collectives' check, the bench and the demo learn the topologies and
    # the collectives each runs from _C (config.topologies): no tuple, list or set literal, and
    # no dict's keys, in the package name two topologies (docstrings and messages may name them).
    import ast
    import pathlib

    pkg = pathlib.Path(dynamiq.__file__).parent
    topos = set(dynamiq.available_topologies())
    found = []
    for path in sorted(pkg.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
                elts = node.keys if isinstance(node, ast.Dict) else node.elts
                names = [e.value for e in elts if isinstance(e, ast.Constant) and e.value in topos]
                if len(names) >= 2:
                    found.append(f"{path.name}:{node.lineno} {names}")
    assert not found, found


def test_binding_takes_a_topology_by_name_or_registered_id():
    c = _C.CollectiveConfig()
    c.topology = "twostep"
    assert c.topology == 2
    c.topology = 3
    assert c.topology == 3
    for bad, why in ((7, "topology id 7 is not registered"), (300, "out of range"), ("mesh", "unknown topology"),
                     (True, "a name or a registry id"), (1.0, "a name or a registry id")):
        with pytest.raises(dynamiq.DynamiqError, match=why):
            c.topology = bad
    assert c.topology == 3


def test_sharded_collectives_take_their_topologies_from_the_registry(monkeypatch):
    from dynamiq.api import check_sharded_config

    cfg = dynamiq.Config(mode="none", topology="hierarchical")
    with pytest.raises(dynamiq.DynamiqError, match="topology 'hierarchical' runs all-reduces only; a reduce-scatter "
                                                   "runs on 'ring', 'butterfly', 'twostep'$"):
        check_sharded_config(cfg, "reduce_scatter", "who")
    entries = list(_C.available_topologies()) + [
        {"name": "mesh", "id": 9, "collectives": ["all-reduce", "all-gather"], "composition": False}]
    monkeypatch.setattr(_C, "available_topologies", lambda: entries)
    with pytest.raises(dynamiq.DynamiqError, match="an all-gather runs on 'ring', 'butterfly', 'twostep', 'mesh'$"):
        check_sharded_config(cfg, "all_gather", "who")
    check_sharded_config(dynamiq.Config(mode="none", topology="ring"), "all_gather", "who")


@pytest.mark.parametrize("backend,device,staging,want", [
    ("gloo", "cpu", False, ("gloo", False, False, True)),
    ("gloo", "cuda", False, ("gloo", True, False, True)),       # no NCCL: staged through host memory
    ("nccl", "cuda", False, ("nccl", False, True, False)),      # ordered, exact-size receives
    ("nccl", "cuda", True, None),                               # staging asked for, no Gloo to stage over
    ("nccl", "cpu", False, None),
    ("cpu:gloo,cuda:nccl", "cpu", False, ("gloo", False, False, True)),
    ("cpu:gloo,cuda:nccl", "cuda", False, ("nccl", False, True, False)),
    ("cpu:gloo,cuda:nccl", "cuda", True, ("gloo", True, False, True)),
    ("cpu:gloo,cuda:ucc", "cuda", False, ("gloo", True, False, True)),  # served by staging, UCC unused
    ("cuda:gloo", "cuda", False, None),                         # CUDA over Gloo is staged, and there is no CPU side
    ("ucc", "cpu", False, None),
    ("ucc", "cuda", False, None),
    ("mpi", "cpu", False, None),
    ("cpu:mpi,cuda:nccl", "cpu", False, None),
])
def test_transport_entries_for_backends_and_devices(backend, device, staging, want):
    if want is None:
        with pytest.raises(dynamiq.DynamiqError, match=f"cannot send {device} tensors") as e:
            _C.transport_for(backend, device, staging)
        msg = str(e.value)
        assert "dynamiq sends over gloo (cpu), nccl (cuda), gloo (cuda, staged through host memory)" in msg
        for name in ("ucc", "mpi"):
            assert (f"backend '{name}' is not supported" in msg) == (name in backend), msg
        return
    e = _C.transport_for(backend, device, staging)
    assert (e["backend"], e["host_staging"], e["ordered"], e["shorter_receives"]) == want
    assert e["device"] == device


def _refused_over_a_fake_group(rank, world):
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: F401 (registers backend "fake")

    from dynamiq.api import resolve_group

    g = dist.new_group(ranks=[0], backend="fake")
    with pytest.raises(dynamiq.DynamiqError) as checked:  # the Python check before queueing
        dynamiq.all_reduce(torch.ones(4096), dynamiq.Config(mode="none"), group=g)
    _, name = resolve_group(g)
    with pytest.raises(dynamiq.DynamiqError) as bound:  # the binding, from the backends c10d reports
        _C.all_reduce(torch.ones(4096), name, dynamiq.Config(mode="none")._to_cpp(), "sum", 0)
    return str(checked.value), str(bound.value)


def test_an_unsupported_backend_is_refused_naming_it():
    checked, bound = run_ranks(_refused_over_a_fake_group, 1)[0]
    for msg in (checked, bound):
        assert "cannot send cpu tensors over this process group" in msg, msg
        assert "backend 'fake' is not supported" in msg, msg
        assert "dynamiq sends over gloo (cpu)" in msg, msg
