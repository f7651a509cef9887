"""The emulated cluster (experiments/netbed): shaping is real, and teardown leaves nothing behind.

Tests that build namespaces are skipped without root, without ip/tc, or where `netbed.sh check` fails
(no CAP_NET_ADMIN, no veth or tbf). The loopback and argument tests run anywhere. Whole file: ~40 s.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from experiments.netbed import (GOODPUT_MTU1500, Netbed, NetbedError, netbed_available,  # noqa: E402
                                parse_rate, run)

NETBED_SH = REPO / "experiments" / "netbed" / "netbed.sh"
PROBE_TCP = REPO / "experiments" / "netbed" / "probe_tcp.py"
TBF_BURST = 131072  # netbed.sh's bucket below 1 Gbit/s x 1 ms: bytes tbf may pass without waiting

_AVAILABLE, _WHY = netbed_available()
needs_netbed = pytest.mark.skipif(not _AVAILABLE, reason=f"cannot build a netbed here: {_WHY}")
# Under pytest-xdist this file's tests must run one after another on one worker (scripts/test.sh:
# --dist loadfile): each checks that nothing holds its namespaces after teardown, and a netbed made
# meanwhile by another worker can reuse a freed namespace's inode number.


def _netns_holders(inodes: set[int]) -> list[str]:
    """Everything that still keeps one of these network namespaces alive: a process inside it, an open
    file descriptor on it, or a bind mount (a name under /run/netns). Empty means the kernel freed the
    namespaces, and with them their veth ends and bridge."""
    want = {f"net:[{i}]" for i in inodes}
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/ns/net") in want:
                found.append(f"process {pid} inside")
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in want:
                    found.append(f"fd {fd} of process {pid}")
            except OSError:
                pass
    with open("/proc/self/mountinfo") as f:
        found += [f"mount {line.split()[4]}" for line in f if any(w in line for w in want)]
    return found


def _host_snapshot() -> tuple[set[str], set[str]]:
    """The host's own links and the namespaces that are not ours: teardown must leave both unchanged."""
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    names = {line.split(":")[1].strip().split("@")[0] for line in links.splitlines()}
    netns = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
    return names, {n for n in netns if not n.startswith("dqnb-")}


def _assert_gone(run_id: str, inodes: set[int]) -> None:
    names = os.listdir("/run/netns") if os.path.isdir("/run/netns") else []
    ours = [n for n in names if n.startswith(f"dqnb-{run_id}-")]
    assert ours == [], f"namespaces left behind: {ours}"
    assert not os.path.exists(f"/run/dqnb/{run_id}"), "state dir left behind"
    assert _netns_holders(inodes) == []
    host_links, _ = _host_snapshot()
    assert not [n for n in host_links if n.startswith("dqnb")], "a netbed device appeared in the host namespace"


def _wait_for(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


# ------------------------------------------------------------------------------------------ anywhere
def test_parse_rate():
    assert parse_rate("1gbit") == 10**9
    assert parse_rate("100mbit") == 10**8
    assert parse_rate("10Gbit/s") == 10**10
    assert parse_rate("2.5g") == 2_500_000_000
    assert parse_rate(1e9) == 10**9
    assert parse_rate("none") is None and parse_rate(None) is None
    for bad in ("fast", "1 gigabit", "-1gbit", "5"):
        with pytest.raises(NetbedError):
            parse_rate(bad)


def test_refuses_without_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(NetbedError, match=r"needs root.*--loopback"):
        with Netbed(2, "1gbit"):
            pass


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to an unprivileged user")
def test_script_refuses_without_root():
    cp = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "bash", str(NETBED_SH),
                         "up", "--id", "nonroot", "--world", "2"], capture_output=True, text=True)
    assert cp.returncode != 0
    assert "needs root" in cp.stderr and "--loopback" in cp.stderr


def test_loopback_env_and_failed_rank(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent("""
        import json, os, sys
        keys = ["MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "GLOO_SOCKET_IFNAME", "NETBED_ADDRS"]
        print("ENV " + json.dumps({k: os.environ.get(k) for k in keys}))
        print("ARGS " + json.dumps(sys.argv[1:]))
        sys.exit(3 if os.environ["RANK"] == "2" else 0)
    """))
    res = run(script, ["--a", "b c"], world=3, loopback=True, timeout=30, logdir=tmp_path / "logs", grace=5)
    assert not res.ok and res.first_failure == 2
    assert [r.status for r in res.ranks] == ["ok", "ok", "failed"]
    assert res.ranks[2].returncode == 3 and "exit code 3" in res.summary()
    ports = set()
    for k in range(3):
        lines = res.ranks[k].log.read_text().splitlines()
        env = json.loads(next(s for s in lines if s.startswith("ENV "))[4:])
        assert json.loads(next(s for s in lines if s.startswith("ARGS "))[5:]) == ["--a", "b c"]
        assert env["RANK"] == env["LOCAL_RANK"] == str(k) and env["WORLD_SIZE"] == "3"
        assert env["MASTER_ADDR"] == "127.0.0.1" and env["GLOO_SOCKET_IFNAME"] == "lo"
        ports.add(env["MASTER_PORT"])
    assert len(ports) == 1


def test_loopback_hung_rank_is_stopped(tmp_path):
    """A rank that ignores SIGTERM and never exits is killed once its peer has failed."""
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent("""
        import os, signal, sys, time
        if os.environ["RANK"] == "1":
            sys.exit(5)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(300)
    """))
    t0 = time.monotonic()
    with Netbed(2, loopback=True, kill_wait=1) as nb:
        res = nb.launch([sys.executable, str(script)], timeout=60, grace=1, logdir=tmp_path / "logs")
    assert time.monotonic() - t0 < 15
    assert res.first_failure == 1 and res.ranks[1].status == "failed"
    assert res.ranks[0].status == "killed" and "rank 1 failed" in res.ranks[0].detail


# ------------------------------------------------------------------------------------------ netbed
@needs_netbed
@pytest.mark.parametrize("rate,nbytes", [("1gbit", 50 * 2**20), ("200mbit", 10 * 2**20)])
def test_transfer_takes_the_time_the_rate_allows(tmp_path, rate, nbytes):
    """rank 1 sends nbytes to rank 0 over TCP. Lower bound: only tbf's bucket (TBF_BURST bytes) may pass
    without waiting for tokens, so t >= (nbytes - burst) x 8 / rate, whatever the TCP overhead. Upper bound:
    1.3x the goodput bound nbytes x 8 / (rate x 1448/1514) (payload per tbf-counted frame at MTU 1500)."""
    before = _host_snapshot()
    with Netbed(2, rate) as nb:
        inodes = set(nb.netns_inodes.values())
        res = nb.launch([sys.executable, str(PROBE_TCP), "--bytes", str(nbytes), "--out-dir", str(tmp_path)],
                        timeout=60, logdir=tmp_path / "logs")
        assert res.ok, res.summary()
        rid = nb.run_id
    bps = parse_rate(rate)
    t = json.loads((tmp_path / "rank1.json").read_text())["seconds"]
    assert t >= (nbytes - TBF_BURST) * 8 / bps, f"{nbytes} B in {t:.3f} s is faster than {rate}"
    goodput_bound = nbytes * 8 / (bps * GOODPUT_MTU1500)
    assert t <= 1.3 * goodput_bound, f"{t:.3f} s > 1.3 x goodput bound {goodput_bound:.3f} s"
    _assert_gone(rid, inodes)
    assert _host_snapshot() == before


@needs_netbed
@pytest.mark.parametrize("ingress", [False, True])
def test_ingress_shaping_limits_incast(tmp_path, ingress):
    """ranks 1 and 2 each send nbytes to rank 0 at once. Egress shaping alone lets rank 0 receive at 2x the
    rate, so both finish in about nbytes x 8 / (rate x goodput); with ingress shaping rank 0's port passes
    at most the rate, so the span from the first sender's first byte to the last sender's acknowledgement
    is at least (2 nbytes - burst) x 8 / rate. (Not one sender's own time: the senders start apart, and
    the early one may finish before the late one's bytes have passed; CI once saw 0.79 s against 0.83.)"""
    nbytes, rate = 10 * 2**20, "200mbit"
    bps = parse_rate(rate)
    with Netbed(3, rate, ingress=ingress) as nb:
        res = nb.launch([sys.executable, str(PROBE_TCP), "--pattern", "incast", "--bytes", str(nbytes),
                         "--out-dir", str(tmp_path)], timeout=60, logdir=tmp_path / "logs")
    assert res.ok, res.summary()
    senders = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in (1, 2)]
    t = max(r["seconds"] for r in senders)
    span = max(r["end"] for r in senders) - min(r["start"] for r in senders)
    one_link = nbytes * 8 / (bps * GOODPUT_MTU1500)
    if ingress:
        assert span >= (2 * nbytes - TBF_BURST) * 8 / bps, f"2 x {nbytes} B in {span:.3f} s: faster than {rate}"
        assert t <= 1.3 * 2 * one_link
    else:
        assert t <= 1.3 * one_link


@needs_netbed
def test_gloo_runs_on_the_veth(tmp_path):
    """torch.distributed with the launcher's environment: Gloo binds to the rank's veth address."""
    pytest.importorskip("torch")
    script = tmp_path / "gloo_rank.py"
    script.write_text(textwrap.dedent("""
        import os, socket, fcntl, struct, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        r, n = dist.get_rank(), dist.get_world_size()
        ifname = os.environ["GLOO_SOCKET_IFNAME"]
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        addr = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname.encode()))[20:24])
        assert addr == os.environ["NETBED_ADDRS"].split(",")[r], (addr, os.environ["NETBED_ADDRS"])
        x = torch.full((1000,), float(r + 1))
        dist.all_reduce(x)
        assert bool((x == n * (n + 1) / 2).all())
        print("OK", r, ifname, addr)
        dist.destroy_process_group()
    """))
    with Netbed(2, "1gbit") as nb:
        inodes = set(nb.netns_inodes.values())
        res = nb.launch([sys.executable, str(script)], timeout=120, logdir=tmp_path / "logs")
        rid = nb.run_id
    assert res.ok, res.summary()
    for k in range(2):
        assert f"OK {k} dqnb{k} 198.18.0.{k + 1}" in res.ranks[k].log.read_text()
    _assert_gone(rid, inodes)


CRASH_SCRIPT = """
import os, signal, socket, sys, threading, time
rank, base = int(os.environ["RANK"]), int(os.environ["MASTER_PORT"]) + 1
addrs = os.environ["NETBED_ADDRS"].split(",")
if rank == 0:
    # A rank that hangs: ignores SIGTERM, and stays after its peer dies.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    srv = socket.create_server((addrs[0], base))
    conn, _ = srv.accept()
    while conn.recv(1 << 20):
        pass
    print("peer gone; hanging", flush=True)
    time.sleep(300)
else:
    # A daemon that escapes the rank's process group and session: only the namespace knows it.
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execvp("sleep", ["sleep", "300"])
        os._exit(0)
    os.wait()
    while True:
        try:
            s = socket.create_connection((addrs[0], base), timeout=5)
            break
        except OSError:
            time.sleep(0.05)
    threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    print("sending", flush=True)
    while True:
        s.sendall(b"x" * (1 << 16))
"""


@needs_netbed
def test_crashed_rank_and_hung_peer_leave_nothing(tmp_path):
    """rank 1 is SIGKILLed mid-transfer and leaves a setsid'd daemon; rank 0 hangs and ignores SIGTERM."""
    script = tmp_path / "crash_rank.py"
    script.write_text(CRASH_SCRIPT)
    before = _host_snapshot()
    t0 = time.monotonic()
    with Netbed(2, "100mbit", kill_wait=1) as nb:
        inodes = set(nb.netns_inodes.values())
        res = nb.launch([sys.executable, str(script)], timeout=60, grace=1, logdir=tmp_path / "logs")
        rid = nb.run_id
        # The daemon outlived both ranks' process groups: it is still inside rank 1's namespace here.
        assert any("process" in h for h in _netns_holders({nb.netns_inodes[nb.ranks[1].netns]}))
    assert time.monotonic() - t0 < 20
    assert res.first_failure == 1
    assert res.ranks[1].status == "signal" and "SIGKILL" in res.ranks[1].detail, res.summary()
    assert res.ranks[0].status == "killed", res.summary()
    assert "peer gone" in res.ranks[0].log.read_text()
    _assert_gone(rid, inodes)
    assert _host_snapshot() == before


READY_SCRIPT = """
import os, time
print("ready", flush=True)
time.sleep(300)
"""


def _signals_as_a_terminal_would(ignored=()):
    """preexec_fn: SIGINT and SIGHUP at their defaults (then `ignored` ignored) in the launcher. A
    test run started in the background by a shell without job control (`cmd &`, nohup) inherits
    SIGINT ignored, and Python then never raises KeyboardInterrupt: the launcher would be tested
    with Ctrl-C switched off."""
    def fn():
        for sig in (signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN if sig in ignored else signal.SIG_DFL)
    return fn


def _start_cli(tmp_path, run_id, ignored=()):
    script = tmp_path / "ready.py"
    script.write_text(READY_SCRIPT)
    logdir = tmp_path / "logs"
    proc = subprocess.Popen([sys.executable, "-m", "experiments.netbed", "-n", "2", "--rate", "1gbit", "--id", run_id,
                             "--logdir", str(logdir), "--tee", "none", "--timeout", "120", str(script)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_signals_as_a_terminal_would(ignored))
    ready = lambda: all((logdir / f"rank{k}.log").exists() and "ready" in (logdir / f"rank{k}.log").read_text()
                        for k in range(2))
    try:
        _wait_for(ready, 30, "both ranks to start")
    except AssertionError:
        proc.kill()
        raise AssertionError(proc.communicate()[0])
    inodes = {os.stat(f"/run/netns/dqnb-{run_id}-{n}").st_ino for n in ("r0", "r1", "br")}
    return proc, inodes


def _communicate_or_dump(proc, timeout):
    """The launcher's output; if it has not exited within `timeout` s, fail with where it was stuck
    (its Python stacks, printed on SIGUSR1) and the processes still running."""
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1)
        ps = subprocess.run(["ps", "-eo", "pid,pgid,sid,stat,etime,args"], capture_output=True, text=True).stdout
        proc.kill()  # its reaper then removes the netbed
        out = proc.communicate()[0]
        raise AssertionError(f"launcher still running after {timeout} s; its output and stacks:\n{out}\n"
                             f"processes:\n{ps}")


@needs_netbed
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupted_launcher_tears_down(tmp_path, sig, code):
    run_id = f"t{os.getpid()}s{int(sig)}"
    proc, inodes = _start_cli(tmp_path, run_id)
    proc.send_signal(sig)
    out = _communicate_or_dump(proc, 30)
    assert proc.returncode == code, out
    assert "everything removed" in out
    _assert_gone(run_id, inodes)


@needs_netbed
def test_launcher_started_under_nohup_keeps_ignoring_sighup(tmp_path):
    """nohup ignores SIGHUP so that a run survives its terminal: the launcher must not undo that."""
    run_id = f"t{os.getpid()}h"
    proc, inodes = _start_cli(tmp_path, run_id, ignored=(signal.SIGHUP,))
    proc.send_signal(signal.SIGHUP)
    time.sleep(1)
    assert proc.poll() is None, proc.communicate()[0]
    assert all(os.path.exists(f"/run/netns/dqnb-{run_id}-{n}") for n in ("r0", "r1", "br"))
    proc.send_signal(signal.SIGTERM)
    out = _communicate_or_dump(proc, 30)
    assert proc.returncode == 143, out
    _assert_gone(run_id, inodes)


@needs_netbed
def test_killed_launcher_is_reaped(tmp_path):
    """SIGKILL gives the launcher no chance; its reaper sees its pipe close and removes the netbed."""
    run_id = f"t{os.getpid()}k"
    proc, inodes = _start_cli(tmp_path, run_id)
    proc.kill()
    proc.communicate(timeout=10)
    _wait_for(lambda: not _netns_holders(inodes) and not os.path.exists(f"/run/dqnb/{run_id}"), 20,
              "the reaper to remove the netbed")
    _assert_gone(run_id, inodes)


@needs_netbed
def test_down_removes_only_its_own_netbed():
    before = _host_snapshot()
    with Netbed(2, "1gbit") as a, Netbed(2, "1gbit") as b:
        a_inodes = set(a.netns_inodes.values())
        subprocess.run(["bash", str(NETBED_SH), "down", "--id", a.run_id], check=True, capture_output=True)
        _assert_gone(a.run_id, a_inodes)
        assert all(os.path.exists(f"/run/netns/{n}") for n in b.netns_inodes)
        assert _host_snapshot()[0] == before[0]
    assert _host_snapshot() == before


@needs_netbed
def test_subnet_overlapping_the_host_is_refused():
    # The host always routes 127.0.0.0/8 (table local).
    with pytest.raises(NetbedError, match="overlaps"):
        with Netbed(2, "1gbit", subnet="127.0.0.0/24"):
            pass


@needs_netbed
def test_delay(tmp_path):
    """Without netem the request is refused clearly and nothing is left; with netem, connect() takes >= 2 x delay."""
    check = subprocess.run(["bash", str(NETBED_SH), "check"], capture_output=True, text=True).stdout
    if "netem delay: yes" not in check:
        with pytest.raises(NetbedError, match=r"netem.*run without --delay"):
            with Netbed(2, "1gbit", delay="5ms", run_id=f"t{os.getpid()}d"):
                pass
        assert not any(n.startswith(f"dqnb-t{os.getpid()}d-") for n in os.listdir("/run/netns"))
        return
    script = tmp_path / "rtt.py"
    script.write_text(textwrap.dedent("""
        import os, socket, time
        addrs, port = os.environ["NETBED_ADDRS"].split(","), int(os.environ["MASTER_PORT"]) + 1
        if os.environ["RANK"] == "0":
            srv = socket.create_server((addrs[0], port)); c, _ = srv.accept(); c.recv(1)
        else:
            while True:
                try:
                    t = time.perf_counter(); s = socket.create_connection((addrs[0], port)); break
                except OSError:
                    time.sleep(0.05)
            print("RTT", time.perf_counter() - t); s.sendall(b"x")
    """))
    with Netbed(2, "1gbit", delay="20ms") as nb:
        res = nb.launch([sys.executable, str(script)], timeout=30, logdir=tmp_path / "logs")
    assert res.ok, res.summary()
    rtt = float(res.ranks[1].log.read_text().split("RTT")[1].split()[0])
    assert rtt >= 0.040
