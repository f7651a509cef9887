"""One background worker thread per process group.

Every dynamiq collective on a group (hook buckets and `all_reduce` calls)
runs on that group's worker in submission order, so all ranks issue their
point-to-point traffic in the same order. The C++ driver releases the GIL,
so the worker communicates while the autograd thread keeps computing.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Dict, Optional

import torch

_workers: Dict[str, "GroupWorker"] = {}
_workers_lock = threading.Lock()


class GroupWorker:
    def __init__(self, group_name: str) -> None:
        self.group_name = group_name
        self._q: "queue.SimpleQueue" = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=f"dynamiq-{group_name}", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], object], device: Optional[torch.device] = None) -> torch.futures.Future:
        # A future holding CUDA tensors must know their devices (it records an
        # event at set_result that the consumer's stream waits on).
        cuda = device is not None and device.type == "cuda"
        fut: torch.futures.Future = torch.futures.Future(devices=[device]) if cuda else torch.futures.Future()
        self._q.put((fn, fut))
        return fut

    def _loop(self) -> None:
        while True:
            fn, fut = self._q.get()
            try:
                result = fn()
            except BaseException as e:  # noqa: BLE001 - every failure must reach the Future
                fut.set_exception(e)
            else:
                fut.set_result(result)


def worker_for(group_name: str) -> GroupWorker:
    with _workers_lock:
        w = _workers.get(group_name)
        if w is None:
            w = GroupWorker(group_name)
            _workers[group_name] = w
        return w
