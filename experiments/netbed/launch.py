"""Run one process per rank on an emulated cluster (netbed) or on loopback.

The network itself is built and removed by ``netbed.sh`` (next to this file); this module starts the
ranks, watches them, collects their exit codes and logs, and guarantees teardown on normal exit, on
error, on Ctrl-C / SIGTERM / SIGHUP, and (through a reaper process) even when the launcher itself is
SIGKILLed.

Library use::

    from experiments.netbed import Netbed, run

    result = run("train.py", ["--steps", "10"], world=4, rate="1gbit", timeout=600)
    result.raise_for_failure()

    with Netbed(world=2, rate="100mbit") as nb:      # or loopback=True without root
        nb.ranks                                      # [RankSpec(rank, addr, ifname, netns), ...]
        nb.env(0)                                     # the torch.distributed environment of rank 0
        res = nb.launch([sys.executable, "probe.py"], timeout=60)
        srv = nb.spawn(1, ["iperf3", "-s", "-1"])     # any command inside rank 1's namespace

Command line::

    python -m experiments.netbed [--world N] [--rate 1gbit|none] [--loopback] [--timeout S] SCRIPT [ARGS...]

Every rank gets MASTER_ADDR (rank 0's address), MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK (= RANK: all
ranks share one physical host, so device indices must differ), LOCAL_WORLD_SIZE, GLOO_SOCKET_IFNAME and
TP_SOCKET_IFNAME (its own interface), NETBED_ADDRS (every rank's address, comma separated),
NETBED_RATE_BPS (0 when unshaped), NETBED_RUN_ID, PYTHONUNBUFFERED=1 and, unless already set,
OMP_NUM_THREADS = max(1, cpus // world). The caller's environment (PYTHONPATH included) passes through.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Mapping, Sequence

NETBED_SH = Path(__file__).resolve().with_name("netbed.sh")
PREFIX = "dqnb"
# TCP payload per frame that tbf counts at MTU 1500: 1448 B (1500 - 20 IP - 20 TCP - 12 timestamps) of
# 1514 B (+ 14 B Ethernet header; tbf sees no preamble, FCS or gap). Goodput bound = rate x GOODPUT.
GOODPUT_MTU1500 = 1448 / 1514
NETNS_MASTER_PORT = 29500
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_ids = itertools.count()


class NetbedError(RuntimeError):
    """The netbed could not be built, used or removed; the message names the cause and the fix."""


class Interrupted(BaseException):
    """SIGTERM or SIGHUP arrived; raised so that teardown runs (like KeyboardInterrupt for SIGINT)."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


# ------------------------------------------------------------------------------------------ rates
_RATE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgt]?)(bit|bps|b)?(?:/s)?\s*$", re.I)
_UNIT = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_rate(rate: str | float | int | None) -> int | None:
    """Rate in bit/s, or None for an unshaped link.

    Accepts 100mbit, 1gbit, 10Gbit/s, 2.5g, 1e9, 1000000000 (bit/s) and none/unshaped/0.
    """
    if rate is None:
        return None
    if isinstance(rate, (int, float)):
        bps = float(rate)
    else:
        text = rate.strip().lower()
        if text in ("none", "unshaped", "0", ""):
            return None
        m = _RATE_RE.match(text)
        if not m:
            raise NetbedError(f"bad rate {rate!r}: write e.g. 100mbit, 1gbit, 10gbit, 2.5g or none (unshaped)")
        bps = float(m.group(1)) * _UNIT[m.group(2).lower()]
    if bps == 0:
        return None
    if not (1e6 <= bps <= 1e11):
        raise NetbedError(f"rate {rate!r} = {bps:g} bit/s is outside 1 Mbit/s .. 100 Gbit/s")
    return int(round(bps))


def format_rate(bps: int | None) -> str:
    if bps is None:
        return "unshaped"
    for unit, div in (("Gbit/s", 10**9), ("Mbit/s", 10**6), ("kbit/s", 10**3)):
        if bps >= div:
            return f"{bps / div:g} {unit}"
    return f"{bps} bit/s"


# ------------------------------------------------------------------------------------------ results
@dataclasses.dataclass(frozen=True)
class RankSpec:
    rank: int
    addr: str            # the rank's IPv4 address (127.0.0.1 on loopback)
    ifname: str          # its interface inside its namespace ("lo" on loopback)
    netns: str | None    # its namespace, None on loopback


@dataclasses.dataclass
class RankResult:
    rank: int
    returncode: int | None
    status: str          # ok | failed | signal | timeout | killed (by the launcher, after another rank failed)
    detail: str
    log: Path | None
    seconds: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclasses.dataclass
class RunResult:
    run_id: str
    world: int
    rate_bps: int | None
    loopback: bool
    seconds: float
    logdir: Path
    ranks: list[RankResult]
    first_failure: int | None = None     # the rank that failed first (root cause), if any

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.ranks)

    @property
    def failed(self) -> list[RankResult]:
        return [r for r in self.ranks if not r.ok]

    def summary(self, tail: int = 15) -> str:
        where = "loopback (unshaped)" if self.loopback else f"netbed {self.run_id}, {format_rate(self.rate_bps)}"
        head = "ok" if self.ok else "FAILED"
        lines = [f"{head}: world {self.world} on {where}, {self.seconds:.1f} s, logs in {self.logdir}"]
        for r in self.ranks:
            mark = "" if r.ok else "  <-- first failure" if r.rank == self.first_failure else ""
            lines.append(f"  rank {r.rank}: {r.status}: {r.detail} ({r.seconds:.1f} s){mark}")
        if self.first_failure is not None:
            r = self.ranks[self.first_failure]
            lines.append(f"  last lines of rank {r.rank}'s log {r.log}:")
            lines += ["    | " + s for s in _tail(r.log, tail)]
        return "\n".join(lines)

    def raise_for_failure(self) -> None:
        if not self.ok:
            raise NetbedError(self.summary())


def _tail(path: Path | None, n: int) -> list[str]:
    if path is None or not path.exists():
        return []
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 16384))
        return f.read().decode("utf-8", "replace").splitlines()[-n:]


# ------------------------------------------------------------------------------------------ helpers
def _sh(args: Sequence[str], *, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run netbed.sh in its own session, so a terminal's Ctrl-C cannot kill it half-way."""
    env = dict(os.environ)
    env["PATH"] = env.get("PATH", "") + ":" + _SYSTEM_PATH
    cp = subprocess.run(["bash", str(NETBED_SH), *args], capture_output=True, text=True, env=env,
                        start_new_session=True, timeout=timeout)
    if check and cp.returncode != 0:
        msg = cp.stderr.strip() or f"netbed.sh {args[0]} exited with {cp.returncode}"
        raise NetbedError(msg.replace("netbed: error: ", ""))
    return cp


def _which(tool: str) -> str | None:
    return shutil.which(tool) or shutil.which(tool, path=_SYSTEM_PATH)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def netbed_available() -> tuple[bool, str]:
    """(True, "") if this process can build a netbed, else (False, the reason)."""
    if os.geteuid() != 0:
        return False, "not root"
    for tool in ("ip", "tc", "timeout"):
        if _which(tool) is None:
            return False, f"'{tool}' not found"
    cp = _sh(["check"], check=False, timeout=60)
    if cp.returncode != 0:
        return False, (cp.stderr.strip() or cp.stdout.strip()).replace("netbed: ", "")
    return True, ""


def _describe_exit(rc: int, seconds: float, timeout: float | None) -> tuple[str, str]:
    if rc == 0:
        return "ok", "exit 0"
    if rc == 124:
        return "timeout", f"timed out after {timeout:g} s (stopped by SIGTERM)"
    if rc == 137 and timeout is not None and seconds >= timeout:
        return "timeout", f"timed out after {timeout:g} s (needed SIGKILL)"
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = str(-rc)
        return "signal", f"killed by {name}"
    return "failed", f"exit code {rc}"


class _LogPump:
    """Copies new complete lines of the rank logs to stdout with a '[rank k]' prefix."""

    def __init__(self, logs: Mapping[int, Path]):
        self.logs = dict(logs)
        self.pos = {k: 0 for k in logs}
        self.partial = {k: b"" for k in logs}

    def pump(self, final: bool = False) -> None:
        for k, path in self.logs.items():
            try:
                with open(path, "rb") as f:
                    f.seek(self.pos[k])
                    data = f.read()
            except FileNotFoundError:
                continue
            self.pos[k] += len(data)
            buf = self.partial[k] + data
            *lines, rest = buf.split(b"\n")
            if final and rest:
                lines.append(rest)
                rest = b""
            self.partial[k] = rest
            for line in lines:
                sys.stdout.write(f"[rank {k}] {line.decode('utf-8', 'replace')}\n")
        sys.stdout.flush()


# ------------------------------------------------------------------------------------------ Netbed
class Netbed:
    """An emulated cluster of ``world`` ranks; a context manager that builds it and always removes it.

    rate: egress rate of every rank (``"1gbit"``, ``100e6``, ``None``/``"none"`` = unshaped veth).
    loopback: True = no namespaces, no shaping, ranks are plain processes on 127.0.0.1 (no root needed);
        "auto" = loopback only when a netbed cannot be built here (a warning says so).
    ingress: also shape the switch-to-rank direction, so a rank cannot receive faster than ``rate`` either.
    delay: one-way added delay (e.g. "5ms"); needs netem, refused with a clear error where the kernel lacks it.
    subnet: "A.B.C.0/24" for the rank addresses (default 198.18.0.0/24, RFC 2544 benchmarking space).
    local_size: two levels: ``local_size`` consecutive ranks per node, packets between a node's ranks
        unshaped, ``rate`` only between nodes; LOCAL_WORLD_SIZE is set to it (default None: one level).
    """

    def __init__(self, world: int, rate: str | float | None = "1gbit", *, loopback: bool | str = False,
                 ingress: bool = False, delay: str | None = None, subnet: str | None = None, mtu: int = 1500,
                 master_port: int | None = None, run_id: str | None = None, handle_signals: bool = True,
                 kill_wait: float = 3.0, local_size: int | None = None):
        if not isinstance(world, int) or not 1 <= world <= 253:
            raise NetbedError(f"world must be an integer in 1..253, got {world!r}")
        self.world = world
        if local_size is not None and (not isinstance(local_size, int) or local_size < 1 or world % local_size):
            raise NetbedError(f"local_size must divide world ({world}), got {local_size!r}")
        self.local_size = local_size
        self.rate_bps = parse_rate(rate)
        if loopback == "auto":
            ok, why = netbed_available()
            if not ok:
                print(f"netbed: cannot build a netbed here ({why}); falling back to --loopback: "
                      f"no shaping, timings are NOT those of a {format_rate(self.rate_bps)} link", file=sys.stderr)
            loopback = not ok
        self.loopback = bool(loopback)
        if self.loopback:
            if delay:
                raise NetbedError("delay needs a netbed (netem); loopback mode cannot add delay")
            self.rate_bps = None
        self.ingress, self.delay, self.subnet, self.mtu = ingress, delay, subnet, mtu
        self.run_id = run_id or f"{os.getpid()}_{next(_ids)}"
        if not re.fullmatch(r"[A-Za-z0-9_]{1,32}", self.run_id):
            raise NetbedError(f"run id {self.run_id!r}: use 1-32 letters, digits or '_'")
        self.master_port = master_port
        self.handle_signals = handle_signals
        self.kill_wait = kill_wait
        self.ranks: list[RankSpec] = []
        self.netns_inodes: dict[str, int] = {}
        self._procs: list[subprocess.Popen] = []
        self._reaper: subprocess.Popen | None = None
        self._old_handlers: dict[int, object] = {}
        self._is_up = False

    # -------------------------------------------------------------- lifecycle
    def __enter__(self) -> "Netbed":
        self._install_signal_handlers()
        try:
            self.up()
        except BaseException:
            self.down(quiet=True)
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.down(quiet=exc_type is not None)

    def up(self) -> None:
        if self.loopback:
            port = self.master_port or _free_port()
            self.master_port = port
            self.ranks = [RankSpec(k, "127.0.0.1", "lo", None) for k in range(self.world)]
            self._is_up = True
            return
        if os.geteuid() != 0:
            raise NetbedError("netbed needs root: it creates network namespaces (ip netns add) and shapes links "
                              "with tc. Run as root (sudo), or use --loopback / loopback=True for unshaped ranks "
                              "on 127.0.0.1 that need no root.")
        for tool in ("ip", "tc", "timeout", "bash"):
            if _which(tool) is None:
                raise NetbedError(f"'{tool}' not found: install iproute2 (ip, tc) and coreutils (timeout)")
        self.master_port = self.master_port or NETNS_MASTER_PORT
        # Remove netbeds whose launcher died without cleaning up (only dqnb-* with a dead owner).
        _sh(["down", "--stale"], check=False)
        # The reaper removes this netbed when our end of its stdin closes, including when we are SIGKILLed.
        env = dict(os.environ, PATH=os.environ.get("PATH", "") + ":" + _SYSTEM_PATH)
        self._reaper = subprocess.Popen(["bash", str(NETBED_SH), "reap", self.run_id], stdin=subprocess.PIPE,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                        start_new_session=True)
        args = ["up", "--id", self.run_id, "--world", str(self.world), "--owner", str(os.getpid()),
                "--rate", "none" if self.rate_bps is None else f"{self.rate_bps}bit", "--mtu", str(self.mtu)]
        if self.ingress:
            args.append("--ingress")
        if self.local_size and not self.loopback:
            args += ["--local-size", str(self.local_size)]
        if self.delay:
            args += ["--delay", str(self.delay)]
        if self.subnet:
            args += ["--subnet", self.subnet]
        cp = _sh(args)
        ranks = []
        for line in cp.stdout.splitlines():
            f = line.split()
            if len(f) == 5 and f[0] == "rank":
                ranks.append(RankSpec(int(f[1]), f[4], f[3], f[2]))
        if [r.rank for r in ranks] != list(range(self.world)):
            raise NetbedError(f"netbed.sh up printed an unexpected rank list:\n{cp.stdout}")
        self.ranks = ranks
        self.netns_inodes = {}
        for name in [r.netns for r in ranks] + [f"{PREFIX}-{self.run_id}-br"]:
            self.netns_inodes[name] = os.stat(f"/run/netns/{name}").st_ino
        self._is_up = True

    def down(self, quiet: bool = False) -> None:
        """Stop every process started here, then remove the namespaces (killing whatever is left in them)."""
        pending: list[int] = []
        masked = self._defer_signals(pending)
        errors = []
        try:
            self._stop_procs()
            if not self.loopback and (self._is_up or self._reaper is not None):
                cp = _sh(["down", "--id", self.run_id], check=False)
                if cp.returncode != 0:
                    errors.append(cp.stderr.strip())
                left = [n for n in self.netns_inodes if os.path.exists(f"/run/netns/{n}")]
                if left:
                    errors.append(f"namespaces still present after teardown: {left}")
            if self._reaper is not None:
                try:
                    self._reaper.stdin.close()
                    self._reaper.wait(timeout=30)
                except (OSError, subprocess.TimeoutExpired):
                    pass
                self._reaper = None
        finally:
            self._is_up = False
            self._restore_signals(masked)
        if errors:
            msg = "netbed teardown: " + "; ".join(errors)
            if quiet:
                print(msg, file=sys.stderr)
            else:
                raise NetbedError(msg)
        if pending:
            raise Interrupted(pending[0]) if pending[0] != signal.SIGINT else KeyboardInterrupt()

    # -------------------------------------------------------------- signals
    def _install_signal_handlers(self) -> None:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return

        def raise_interrupted(signum, frame):
            raise Interrupted(signum)

        for sig in (signal.SIGTERM, signal.SIGHUP):
            # A signal ignored at start stays ignored (nohup ignores SIGHUP so that a run outlives
            # its terminal; SIGINT is likewise left to Python, which ignores it when it was ignored).
            if signal.getsignal(sig) == signal.SIG_IGN:
                continue
            self._old_handlers[sig] = signal.signal(sig, raise_interrupted)

    def _defer_signals(self, pending: list[int]) -> dict[int, object]:
        """While tearing down, a second Ctrl-C or SIGTERM is noted instead of cutting teardown short."""
        if threading.current_thread() is not threading.main_thread():
            return {}

        def note(signum, frame):
            if not pending:
                print("netbed: tearing down, please wait", file=sys.stderr)
            pending.append(signum)

        return {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
                if signal.getsignal(sig) != signal.SIG_IGN}

    def _restore_signals(self, masked: dict[int, object]) -> None:
        for sig, old in masked.items():
            signal.signal(sig, old)
        if not self._is_up:
            for sig, old in self._old_handlers.items():
                signal.signal(sig, old)
            self._old_handlers = {}

    # -------------------------------------------------------------- processes
    def env(self, rank: int, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of ``rank``: the caller's environment plus the torch.distributed variables."""
        if not self.ranks:
            raise NetbedError("the netbed is not up (use it as a context manager)")
        spec = self.ranks[rank]
        env = dict(os.environ)
        env.update({
            "MASTER_ADDR": self.ranks[0].addr,
            "MASTER_PORT": str(self.master_port),
            "RANK": str(rank),
            "WORLD_SIZE": str(self.world),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(self.local_size or self.world),
            "GLOO_SOCKET_IFNAME": spec.ifname,
            "TP_SOCKET_IFNAME": spec.ifname,
            "NETBED_RUN_ID": self.run_id,
            "NETBED_ADDRS": ",".join(r.addr for r in self.ranks),
            "NETBED_RATE_BPS": str(self.rate_bps or 0),
            "NETBED_LOOPBACK": "1" if self.loopback else "0",
            "PYTHONUNBUFFERED": "1",
        })
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // self.world)))
        if extra:
            env.update(extra)
        return env

    def command(self, rank: int, argv: Sequence[str], timeout: float | None = None,
                kill_after: float = 5.0) -> list[str]:
        """argv wrapped to run inside rank's namespace, under `timeout` when given."""
        cmd = list(map(str, argv))
        if timeout is not None:
            cmd = [_which("timeout") or "timeout", f"--kill-after={kill_after:g}s", f"{timeout:g}s", *cmd]
        if not self.loopback:
            cmd = [_which("ip") or "ip", "netns", "exec", self.ranks[rank].netns, *cmd]
        return cmd

    def spawn(self, rank: int, argv: Sequence[str], *, timeout: float | None = None,
              extra_env: Mapping[str, str] | None = None, **popen_kwargs) -> subprocess.Popen:
        """Start argv in rank's namespace (its own session, rank env); killed at teardown if still running."""
        popen_kwargs.setdefault("stdin", subprocess.DEVNULL)
        p = subprocess.Popen(self.command(rank, argv, timeout), env=self.env(rank, extra_env),
                             start_new_session=True, **popen_kwargs)
        self._procs.append(p)
        return p

    def _signal_proc(self, p: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _stop_procs(self, procs: Sequence[subprocess.Popen] | None = None) -> None:
        procs = [p for p in (self._procs if procs is None else procs) if p.poll() is None]
        for p in procs:
            self._signal_proc(p, signal.SIGTERM)
        deadline = time.monotonic() + self.kill_wait
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in procs:
            if p.poll() is None:
                self._signal_proc(p, signal.SIGKILL)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._procs = [p for p in self._procs if p.poll() is None]

    def launch(self, argv: Sequence[str] | Sequence[Sequence[str]], *, timeout: float | None = 600,
               logdir: str | Path | None = None, stream: str | int | None = None, grace: float = 10.0,
               extra_env: Mapping[str, str] | None = None, kill_after: float = 5.0) -> RunResult:
        """Run argv once per rank (or argv[k] on rank k) and wait for all of them.

        Each rank runs under ``timeout`` seconds (coreutils timeout: SIGTERM, then SIGKILL ``kill_after`` s
        later) with stdout and stderr in ``logdir/rank<k>.log``. When a rank fails, the others get ``grace``
        seconds to finish (they usually fail too, waiting on the dead peer) and are then stopped.
        stream: None = quiet, "all" or a rank number = copy those ranks' lines to stdout as they come.
        """
        if not self.ranks:
            raise NetbedError("the netbed is not up (use it as a context manager)")
        per_rank = isinstance(argv[0], (list, tuple))
        if per_rank and len(argv) != self.world:
            raise NetbedError(f"got {len(argv)} command lines for {self.world} ranks")
        logdir = Path(logdir) if logdir else Path(tempfile.mkdtemp(prefix=f"{PREFIX}-{self.run_id}-"))
        logdir.mkdir(parents=True, exist_ok=True)
        logs = {k: logdir / f"rank{k}.log" for k in range(self.world)}
        pump = None
        if stream is not None:
            shown = range(self.world) if stream == "all" else [int(stream)]
            pump = _LogPump({k: logs[k] for k in shown})

        t0 = time.monotonic()
        procs: dict[int, subprocess.Popen] = {}
        results: dict[int, RankResult] = {}
        first_failure: int | None = None
        fail_time = 0.0
        try:
            for k in range(self.world):
                with open(logs[k], "wb") as log:
                    procs[k] = self.spawn(k, argv[k] if per_rank else argv, timeout=timeout, stdout=log,
                                          stderr=subprocess.STDOUT, extra_env=extra_env)
            hard_deadline = t0 + timeout + kill_after + 10 if timeout is not None else float("inf")
            while len(results) < self.world:
                now = time.monotonic()
                for k, p in procs.items():
                    if k in results or p.poll() is None:
                        continue
                    status, detail = _describe_exit(p.returncode, now - t0, timeout)
                    results[k] = RankResult(k, p.returncode, status, detail, logs[k], now - t0)
                    if status != "ok" and first_failure is None:
                        first_failure, fail_time = k, now
                running = [k for k in procs if k not in results]
                late = first_failure is not None and now - fail_time > grace
                if running and (late or now > hard_deadline):
                    why = (f"stopped by the launcher {grace:g} s after rank {first_failure} failed" if late
                           else "stopped by the launcher: its timeout did not end it")
                    self._stop_procs([procs[k] for k in running])
                    end = time.monotonic()
                    for k in running:
                        results[k] = RankResult(k, procs[k].returncode, "killed", why, logs[k], end - t0)
                if pump:
                    pump.pump()
                if len(results) < self.world:
                    time.sleep(0.05)
        finally:
            # Interrupted (Ctrl-C, SIGTERM) or an error here: stop the ranks now; down() removes the rest.
            self._stop_procs(list(procs.values()))
            if pump:
                pump.pump(final=True)
        return RunResult(self.run_id, self.world, self.rate_bps, self.loopback, time.monotonic() - t0, logdir,
                         [results[k] for k in range(self.world)], first_failure)


def run(script: str | os.PathLike, args: Sequence[str] = (), world: int = 2, rate: str | float | None = "1gbit", *,
        python: str | None = None, timeout: float = 600, logdir: str | Path | None = None,
        stream: str | int | None = None, grace: float = 10.0, extra_env: Mapping[str, str] | None = None,
        **netbed_kwargs) -> RunResult:
    """Run ``python script args...`` on every rank of a fresh netbed and remove the netbed afterwards.

    Returns the RunResult (exit status and log of every rank); call ``.raise_for_failure()`` to turn a
    failed rank into a NetbedError that names it and shows the end of its log. ``netbed_kwargs`` go to
    Netbed (loopback, ingress, delay, subnet, mtu, master_port, run_id).
    """
    argv = [python or sys.executable, str(script), *map(str, args)]
    with Netbed(world, rate, **netbed_kwargs) as nb:
        return nb.launch(argv, timeout=timeout, logdir=logdir, stream=stream, grace=grace, extra_env=extra_env)


# ------------------------------------------------------------------------------------------ CLI
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m experiments.netbed",
        description="Run SCRIPT once per rank, each rank in its own network namespace behind a shaped link "
                    "(or on 127.0.0.1 with --loopback), and remove everything afterwards.")
    ap.add_argument("-n", "--world", type=int, default=2, help="number of ranks (default 2)")
    ap.add_argument("--rate", default=None, help="per-rank egress rate: 100mbit, 1gbit, 10gbit, none (default 1gbit)")
    ap.add_argument("--loopback", action="store_true", help="no namespaces, no shaping, no root needed")
    ap.add_argument("--ingress", action="store_true", help="shape the switch-to-rank direction as well")
    ap.add_argument("--delay", help="added one-way delay, e.g. 5ms (needs netem in the kernel)")
    ap.add_argument("--subnet", help="A.B.C.0/24 for rank addresses (default 198.18.0.0/24)")
    ap.add_argument("--mtu", type=int, default=1500)
    ap.add_argument("--local-size", type=int, help="two levels: ranks per node, RATE only between nodes")
    ap.add_argument("--timeout", type=float, default=600, help="per-rank time limit in seconds (default 600)")
    ap.add_argument("--grace", type=float, default=10, help="seconds the others get after a rank fails (default 10)")
    ap.add_argument("--logdir", help="directory for rank<k>.log (default a new /tmp/dqnb-* directory)")
    ap.add_argument("--tee", default="all", help="copy rank output to stdout: all, none or a rank number")
    ap.add_argument("--python", default=sys.executable, help="interpreter for SCRIPT (default this one)")
    ap.add_argument("--exec", dest="is_exec", action="store_true", help="SCRIPT is an executable, not a Python file")
    ap.add_argument("--id", dest="run_id", help="netbed id (default PID_SEQ)")
    ap.add_argument("--load-json", help="write the run's load record (python/dynamiq/_load.py) to this file")
    ap.add_argument("script")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)

    # `kill -USR1` prints where the launcher is (every thread's Python stack) to stderr: for
    # diagnosing a launcher that does not exit (tests/python/test_netbed.py uses it on a timeout).
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    if a.loopback and a.rate not in (None, "none"):
        print("netbed: --loopback does not shape: --rate is ignored", file=sys.stderr)
    cmd = [a.script, *a.args] if a.is_exec else [a.python, a.script, *a.args]
    tee = None if a.tee == "none" else a.tee
    # the machine's load before and after the ranks run (printed with the summary; --load-json)
    from experiments.results_io import load as _load

    try:
        with Netbed(a.world, a.rate or "1gbit", loopback=a.loopback, ingress=a.ingress, delay=a.delay,
                    subnet=a.subnet, mtu=a.mtu, run_id=a.run_id, local_size=a.local_size) as nb:
            where = "loopback" if nb.loopback else f"netbed {nb.run_id} at {format_rate(nb.rate_bps)}"
            print(f"netbed: {a.world} ranks on {where}: " + ", ".join(f"{r.rank}={r.addr}" for r in nb.ranks),
                  file=sys.stderr, flush=True)
            mon = _load.LoadMonitor()
            res = nb.launch(cmd, timeout=a.timeout, logdir=a.logdir, stream=tee, grace=a.grace)
            rec = mon.finish()
    except NetbedError as e:
        print(f"netbed: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("netbed: interrupted (SIGINT); everything removed", file=sys.stderr)
        return 130
    except Interrupted as e:
        print(f"netbed: {e}; everything removed", file=sys.stderr)
        return 128 + e.signum
    print(res.summary(), file=sys.stderr)
    print(_load.format_record(rec, prefix="netbed: "), file=sys.stderr)
    if a.load_json:
        with open(a.load_json, "w") as f:
            json.dump(dict(rec, command=cmd, world=a.world, rate=a.rate or "1gbit"), f, indent=1)
    if res.ok:
        return 0
    rc = res.ranks[res.first_failure].returncode if res.first_failure is not None else 1
    return rc if rc and 0 < rc < 256 else 1


if __name__ == "__main__":
    sys.exit(main())
