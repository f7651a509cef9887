"""dynamiq's process groups: the private group made for each user group, and its lifecycle.

dynamiq never sends on a group the user passes. The first collective (a hook's
first bucket or an `all_reduce`) on a user group makes a group of dynamiq's own
with the same ranks, backend and timeout (`_private_group`); a destroyed user
group's private group, worker thread and buffers are freed at a later call
(`_sweep_private_groups`). Everything else in the package names groups by
their private group's name (`resolve_group`), which also keys the group's
worker (`_worker.worker_for`).
"""

from __future__ import annotations

import atexit
import threading
from datetime import timedelta
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from . import _C
from ._worker import retire_all, retire_worker

DynamiqError = _C.DynamiqError
TransportError = _C.TransportError

# Each process group's backend string (torch's get_backend_config: "gloo",
# "nccl", "cpu:gloo,cuda:nccl", ...), by group name: what `transport_for` asks
# the C++ transport factory about.
_group_backends: Dict[str, str] = {}
_transports: Dict[Tuple[str, str, bool], Tuple[Optional[dict], str]] = {}


def transport_for(group_name: Optional[str], device: str, staging: bool = False) -> Tuple[Optional[dict], str]:
    """(the transport entry, "") for tensors on `device` ("cpu", "cuda") over the group, or
    (None, why not): the C++ transport factory's choice for the group's backends
    (csrc/hook/transport/transport_factory.h: Gloo for CPU tensors, NCCL for CUDA ones, or
    CUDA tensors staged through host memory over Gloo; UCC, MPI and other backends refused).
    `staging`: host staging asked for. A group not resolved here is taken as Gloo's."""
    backend = _group_backends.get(group_name, "gloo") if group_name is not None else "gloo"
    key = (backend, device, bool(staging))
    found = _transports.get(key)
    if found is None:
        try:
            found = (dict(_C.transport_for(backend, device, bool(staging))), "")
        except DynamiqError as e:
            found = (None, str(e))
        _transports[key] = found
    return found


# dynamiq's own process group for each group a user passes, by the user group's
# name: (the user's group, ours). See _private_group.
_private_groups: Dict[str, Tuple[dist.ProcessGroup, dist.ProcessGroup]] = {}
_private_made: Dict[str, int] = {}  # private groups made so far per user group name (re-inits)
_private_lock = threading.Lock()
# Our groups of user groups that were destroyed, with their stopping workers:
# destroyed in turn once the worker has stopped (see _sweep_private_groups).
_retired: List[tuple] = []


def _sweep_private_groups() -> None:
    """Frees what dynamiq holds for user groups that no longer exist (caller holds _private_lock).

    After `dist.destroy_process_group(g)` (or of all groups, before a new init) our
    group for g, its worker thread and that thread's message buffers would
    otherwise live until exit: a job that makes and destroys subgroups as it goes
    would grow by a thread, sockets and buffers per group. The worker stops once
    the collectives already queued on it are done (it is never interrupted); our
    group is destroyed at a later sweep, once the worker has stopped. Local: no
    communication, so ranks need not sweep at the same time."""
    for name, (user, own) in list(_private_groups.items()):
        if _alive(user) and _alive(own):
            continue
        del _private_groups[name]
        _group_backends.pop(own.group_name, None)
        _retired.append((own, retire_worker(own.group_name)))
    waiting = []
    for own, worker in _retired:
        if worker is not None and worker.is_alive():
            waiting.append((own, worker))
        elif _alive(own):
            try:
                dist.destroy_process_group(own)
            except Exception:  # noqa: BLE001 - already shut down by torch: nothing left to free
                pass
    _retired[:] = waiting


def _new_group_named(name: str, **kw) -> dist.ProcessGroup:
    """`dist.new_group(**kw)` under the name `name`, leaving torch's group counter alone.

    torch names a group from `_world.group_count`, which `new_group` advances on
    the members of a locally synchronised group only. Made through it, dynamiq's
    group for a subgroup would advance the counter on that subgroup's members and
    not on the other ranks (they skip the call, or get None from a dynamiq call
    outside the group), and the user's next `new_group` would then get different
    names on different ranks and hang. Our groups take a name of their own,
    `dynamiq:<user group>:<k>`, the same on every member, and no counter value."""
    c10d = dist.distributed_c10d
    orig = getattr(c10d, "_process_group_name", None)
    if orig is None:  # another torch: its own naming (and counter) then
        return dist.new_group(**kw)
    c10d._process_group_name = lambda ranks, use_hashed_name: name
    try:
        return dist.new_group(**kw)
    finally:
        c10d._process_group_name = orig


def _group_timeout(g: dist.ProcessGroup) -> Optional[timedelta]:
    """The longest timeout of the group's backends (None: not found, torch's default)."""
    found = []
    for dev in ("cpu", "cuda"):
        try:
            found.append(g._get_backend(torch.device(dev)).options._timeout)
        except Exception:  # noqa: BLE001 - no backend for that device, or no options
            continue
    return max(found) if found else None


def _alive(pg: dist.ProcessGroup) -> bool:
    """Whether `pg` is still registered (destroy_process_group unregisters every group).

    Decided by torch's registry, the same on every rank, and not by the identity of
    Python wrappers, so that every member makes a new group at the same call."""
    try:
        return pg in dist.distributed_c10d._world.pg_map
    except AttributeError:  # a torch without that registry: groups live until exit
        return True


def _private_group(g: dist.ProcessGroup) -> dist.ProcessGroup:
    """dynamiq's process group with the ranks, backends and timeout of `g`, made on first use.

    dynamiq's collectives run on a background thread. On the user's own group they
    could interleave with collectives the calling thread issues meanwhile: DDP
    all-reduces its unused-parameter map on the autograd thread while the hook's
    last buckets are still being sent (`find_unused_parameters=True`), a caller
    may use the group while an `all_reduce(async_op=True)` is in flight, and Gloo
    or NCCL then pair different operations on different ranks (an abort, a hang,
    or silently mixed data). A group of dynamiq's own keeps the two streams of
    operations apart. Made collectively: every member calls this for `g` in the
    same order (register() and all_reduce() are called on every rank);
    non-members need not (use_local_synchronization).
    """
    with _private_lock:
        _sweep_private_groups()
        entry = _private_groups.get(g.group_name)
        if entry is not None:  # (the sweep kept it: both groups alive)
            return entry[1]
        # (after destroy_process_group and a new init a reused name gets a new group)
        k = _private_made.get(g.group_name, 0)
        try:
            own = _new_group_named(f"dynamiq:{g.group_name}:{k}", ranks=dist.get_process_group_ranks(g),
                                   timeout=_group_timeout(g), backend=dist.get_backend_config(g),
                                   use_local_synchronization=True, group_desc=f"dynamiq:{g.group_name}")
            _private_made[g.group_name] = k + 1
        except Exception as e:  # noqa: BLE001 - a peer that never joins: the store's timeout
            raise TransportError(f"dynamiq: making dynamiq's process group for group '{g.group_name}' "
                                 f"failed (did every rank call dynamiq on this group?): {e}") from e
        _private_groups[g.group_name] = (g, own)
        return own


def resolve_group(group: Optional[dist.ProcessGroup]) -> Tuple[dist.ProcessGroup, str]:
    """(dynamiq's process group for `group`, its name); `group` None means the default group."""
    if not dist.is_available() or not dist.is_initialized():
        raise DynamiqError("dynamiq: torch.distributed is not initialized; call "
                           "torch.distributed.init_process_group('gloo', ...) first")
    g = group if group is not None else dist.group.WORLD
    if not getattr(g, "group_name", None):
        raise DynamiqError("dynamiq: cannot find the name of the process group")
    own = _private_group(g)
    name = own.group_name
    # the backend config, not get_backend: init_process_group() without a backend
    # reports "undefined" there, and "cpu:gloo,cuda:nccl" here on a GPU host
    _group_backends[name] = str(dist.get_backend_config(g))
    return own, name


def _not_a_member(group: Optional[dist.ProcessGroup]) -> bool:
    """True on a rank outside `group` (torch's collectives return at once there)."""
    return group is not None and dist.is_initialized() and group == dist.GroupMember.NON_GROUP_MEMBER




def _release_at_exit() -> None:
    """At interpreter exit (atexit, while the interpreter is intact): lets every worker
    finish its queued collectives and end (`_worker.retire_all`), then drops dynamiq's
    references to process groups, so that dynamiq keeps no group (the user's or its
    own) alive into finalization. torch's Gloo threads of a group that lives into
    finalization can abort the process there (pytorch/pytorch#190489; see
    experiments/results/gloo_exit_abort)."""
    with _private_lock:
        retired = [w for _, w in _retired]
    retire_all(extra=retired)
    with _private_lock:
        _private_groups.clear()
        _retired.clear()
        _group_backends.clear()


atexit.register(_release_at_exit)
