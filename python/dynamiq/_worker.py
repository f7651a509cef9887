"""One background worker thread per process group.

Every dynamiq collective on a group (hook buckets and `all_reduce` calls)
runs on that group's worker in submission order, so all ranks issue their
point-to-point traffic in the same order. The C++ driver releases the GIL,
so the worker communicates while the autograd thread keeps computing.

CUDA collectives run on a stream of the worker's own per device (a
non-blocking stream made for it, not one of torch's pooled streams, which NCCL
and Future callbacks share), with that device current: it waits for an event recorded after
the bucket's producer (`api.ready_event`), and dynamiq's kernels, copies and
waits go there, so they neither wait for the training's later kernels on its
stream nor hold them up. The Future is completed on that stream too (torch
records its completion event on the current stream).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from typing import Callable, Dict, Optional

import torch

from . import _C

_workers: Dict[str, "GroupWorker"] = {}
_workers_lock = threading.Lock()


class GroupWorker:
    def __init__(self, group_name: str) -> None:
        self.group_name = group_name
        self._q: "queue.SimpleQueue" = queue.SimpleQueue()
        self._streams: Dict[torch.device, tuple] = {}  # device -> (ExternalStream, handle); worker thread only
        self._thread = threading.Thread(target=self._loop, name=f"dynamiq-{group_name}", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], object], device: Optional[torch.device] = None) -> torch.futures.Future:
        # A future holding CUDA tensors must know their devices (it records an
        # event at set_result that the consumer's stream waits on).
        cuda = device is not None and device.type == "cuda"
        fut: torch.futures.Future = torch.futures.Future(devices=[device]) if cuda else torch.futures.Future()
        self._q.put((fn, fut, device if cuda else None))
        return fut

    def _stream_context(self, device: Optional[torch.device]):
        """On the worker: makes its own stream for `device` current (nothing for CPU work)."""
        if device is None:
            return contextlib.nullcontext()
        entry = self._streams.get(device)
        if entry is None:
            index = device.index if device.index is not None else torch.cuda.current_device()
            handle = _C.new_cuda_stream(index)
            entry = (torch.cuda.ExternalStream(handle, device=torch.device("cuda", index)), handle)
            self._streams[device] = entry
        ctx = contextlib.ExitStack()
        # the device first: torch.cuda.stream alone would restore the thread's
        # previous stream, of device 0, on exit, and so make a context on GPU 0
        # in every process whose GPU is another
        ctx.enter_context(torch.cuda.device(entry[0].device))
        ctx.enter_context(torch.cuda.stream(entry[0]))
        return ctx

    def on_worker(self) -> bool:
        """True on this worker's own thread (where callbacks of its futures run)."""
        return threading.current_thread() is self._thread

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:  # retired (retire_worker): the thread ends, and its buffers with it
                self._close_streams()
                return
            # one call per item, so that nothing of it (the closure, its tensor, the
            # Future and its value) outlives it while the loop waits for the next
            self._run(*item)
            del item

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _close_streams(self) -> None:
        """Before the thread ends: its buffers are freed then, on no stream of ours, so
        everything queued on its streams (sends still reading them) must be done."""
        for s, handle in self._streams.values():
            try:
                s.synchronize()
                _C.destroy_cuda_stream(handle, s.device.index)
            except Exception:  # noqa: BLE001 - a broken device: nothing left to order
                pass
        self._streams.clear()

    def _run(self, fn: Callable[[], object], fut: torch.futures.Future, device: Optional[torch.device]) -> None:
        try:
            ctx = self._stream_context(device)
        except BaseException as e:  # noqa: BLE001 - e.g. no stream can be made
            _fail(fut, e)
            return
        with ctx:
            try:
                result = fn()
            except BaseException as e:  # noqa: BLE001 - every failure must reach the Future
                _fail(fut, e)
                return
            try:
                fut.set_result(result)
            except BaseException as e:  # noqa: BLE001 - e.g. a result the Future cannot hold
                _fail(fut, e)


def _fail(fut: torch.futures.Future, e: BaseException) -> None:
    """Marks `fut` failed with `e`; never lets an exception end the worker.

    torch's Future takes only Exceptions: others (SystemExit, KeyboardInterrupt
    raised inside a collective's Python code) are wrapped. If the Future cannot
    be completed at all, the error is dropped rather than the worker, whose
    death would leave every later collective on the group waiting forever."""
    if not isinstance(e, Exception):
        e = RuntimeError(f"dynamiq: collective interrupted by {type(e).__name__}: {e}")
    try:
        fut.set_exception(e)
    except BaseException:  # noqa: BLE001 - already completed: nothing left to tell
        pass


def worker_for(group_name: str) -> GroupWorker:
    with _workers_lock:
        w = _workers.get(group_name)
        if w is None:
            w = GroupWorker(group_name)
            _workers[group_name] = w
        return w


def retire_worker(group_name: str) -> Optional[GroupWorker]:
    """Stops the worker of a group that is gone, once the collectives queued on it are
    done (a later collective on that name gets a new worker). Returns it, or None."""
    with _workers_lock:
        w = _workers.pop(group_name, None)
    if w is not None:
        w._q.put(None)
    return w


# How long the exit handler waits for the collectives still queued on the workers.
_EXIT_WAIT_S = float(os.environ.get("DYNAMIQ_EXIT_WAIT_S", "30"))


def retire_all(extra=()) -> None:
    """At interpreter exit, before finalization: stops every worker once its queued
    collectives are done (at most DYNAMIQ_EXIT_WAIT_S seconds in all).

    A worker is a daemon thread. Left running into `Py_FinalizeEx`, one that is
    inside a collective (a script that exits with an `async_op=True` collective in
    flight) would be ended when it next takes the GIL, by an unwinding that aborts
    the process ("terminate called without an active exception"), and the
    collective's result and its Future callbacks would be lost. Here, while the
    interpreter is intact, each worker finishes its queue and ends."""
    with _workers_lock:
        workers = list(_workers.values())
        _workers.clear()
    workers += [w for w in extra if w is not None]  # retired earlier, maybe still finishing
    for w in workers:
        w._q.put(None)
    deadline = time.monotonic() + _EXIT_WAIT_S
    for w in workers:
        w._thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [w.group_name for w in workers if w._thread.is_alive()]
    if stuck:
        import sys
        print(f"dynamiq: at exit, collectives on {', '.join(stuck)} were still running after "
              f"{_EXIT_WAIT_S:g} s (DYNAMIQ_EXIT_WAIT_S); exiting without them", file=sys.stderr)

