"""TCP throughput probe for a netbed rank (standard library only; run one per rank under the launcher).

  pair: rank 1 sends BYTES to rank 0; the other ranks only join.
  ring: every rank k sends BYTES to rank (k+1) % n while receiving BYTES from rank (k-1) % n
        (the traffic pattern of a ring all-reduce step; with 2 ranks, both directions at once).
  incast: every rank but 0 sends BYTES to rank 0 at once (what ingress shaping is for).

The sender's clock runs from its first byte to the receiver's 1-byte acknowledgement of the last one;
"start" and "end" are the same instants on CLOCK_MONOTONIC, shared by every process on the host, so
the span of several senders (incast) is max(end) - min(start), whatever their start-up skew.
Rank k listens on its own address (NETBED_ADDRS) at port MASTER_PORT + 1 + k; each rank writes
{"rank", "sent_bytes", "seconds", "start", "end", "mbit_s", "received_bytes"} to OUT_DIR/rank<k>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import threading
import time
from pathlib import Path

CHUNK = 1 << 20


def _serve(listener: socket.socket, result: dict) -> None:
    conn, _ = listener.accept()
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        (n,) = struct.unpack("!Q", _recv_exact(conn, 8))
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        got = 0
        while got < n:
            r = conn.recv_into(view[: min(CHUNK, n - got)])
            if r == 0:
                raise ConnectionError(f"peer closed after {got} of {n} bytes")
            got += r
        conn.sendall(b"k")
    result["received_bytes"] = got


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        r = conn.recv(n - len(out))
        if not r:
            raise ConnectionError("peer closed during the header")
        out += r
    return out


def _send(addr: str, port: int, nbytes: int, result: dict, connect_timeout: float = 60.0) -> None:
    deadline = time.monotonic() + connect_timeout
    while True:
        try:
            s = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    with s:
        s.settimeout(None)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        payload = memoryview(os.urandom(CHUNK))  # incompressible, though nothing here compresses
        start = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process (and netns) on the host
        t0 = time.perf_counter()
        s.sendall(struct.pack("!Q", nbytes))
        left = nbytes
        while left:
            k = min(CHUNK, left)
            s.sendall(payload[:k])
            left -= k
        if s.recv(1) != b"k":
            raise ConnectionError("no acknowledgement from the receiver")
        dt = time.perf_counter() - t0
        end = time.monotonic()
    result.update(sent_bytes=nbytes, seconds=dt, mbit_s=nbytes * 8 / dt / 1e6, start=start, end=end)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bytes", type=int, default=50 * 2**20)
    ap.add_argument("--pattern", choices=["pair", "ring", "incast"], default="pair")
    ap.add_argument("--out-dir", type=Path, required=True)
    a = ap.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    addrs = os.environ["NETBED_ADDRS"].split(",")
    base = int(os.environ["MASTER_PORT"]) + 1
    if world < 2:
        raise SystemExit("probe_tcp needs at least 2 ranks")
    if a.pattern == "pair":
        dst = 0 if rank == 1 else None
        nsrc = 1 if rank == 0 else 0
    elif a.pattern == "incast":
        dst = 0 if rank > 0 else None
        nsrc = world - 1 if rank == 0 else 0
    else:
        dst, nsrc = (rank + 1) % world, 1

    result: dict = {"rank": rank, "pattern": a.pattern}
    errors: list[BaseException] = []

    def guarded(fn, *args):
        try:
            fn(*args)
        except BaseException as e:  # reported below, the rank then fails
            errors.append(e)

    threads = []
    received: list[dict] = [{} for _ in range(nsrc)]
    if nsrc:
        listener = socket.create_server((addrs[rank], base + rank), backlog=nsrc)
        threads += [threading.Thread(target=guarded, args=(_serve, listener, r)) for r in received]
    if dst is not None:
        threads.append(threading.Thread(target=guarded, args=(_send, addrs[dst], base + dst, a.bytes, result)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    if nsrc:
        result["received_bytes"] = sum(r["received_bytes"] for r in received)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    (a.out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
