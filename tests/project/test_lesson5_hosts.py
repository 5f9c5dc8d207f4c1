"""Lesson 5: hosts that are really separate (network namespaces on a virtual switch).

They are made and removed without a trace, also when the code using them raises or its
process gets SIGINT or SIGTERM; a run killed with -9 is cleaned up by `cleanup-stale`; two
runs at once do not meet; 127.0.0.1 is private to each host; a shaped link slows a transfer
to its rate. Then torch across the hosts: the benchmark through the command line, and
lesson 3's training, which gives the same weights on 2 hosts x 1 process as on 1 host x 2.

The tests that make hosts need root and `ip`; elsewhere they are skipped, saying why.
Small Python programs (no torch) play the servers and clients inside the hosts.
"""

import os
import re
import signal
import socket
import subprocess
import time

import pytest
from util import PYTHON, REAL_PYTHON, ROOT, run, summary

from ddpcourse.cluster import hosts as H
from ddpcourse.cluster.hosts import Hosts, HostsError, parse_link, torchrun_command

REASON = H.unavailable_reason()
needs_hosts = pytest.mark.skipif(REASON is not None, reason=f"no separate hosts here: {REASON}")
# One test worker for the whole module (make test: --dist loadgroup): each test checks that no
# namespace of a dead owner is left, and the cleanup-stale test leaves some on purpose for a
# moment, which a test running beside it on another worker would take for its own leak.
pytestmark = pytest.mark.xdist_group("tests/project/test_lesson5_hosts.py")


def ours_or_orphans() -> set[str]:
    """ddpc* namespaces (and their /etc/netns folders) made by this process or by a dead one:
    any of them left after a test is a leak. Other live runs' are not ours to judge."""
    if REASON is not None:
        return set()
    etc = set(os.listdir(H.NETNS_ETC)) if os.path.isdir(H.NETNS_ETC) else set()
    found = set()
    for name in set(H.list_namespaces()) | etc:
        m = re.match(rf"{H.NAME_PREFIX}(\d+)-", name)
        if m and (int(m.group(1)) == os.getpid() or not H._owner_alive(int(m.group(1)))):
            found.add(name)
    return found


@pytest.fixture(autouse=True)
def nothing_left_behind():
    before = ours_or_orphans()
    yield
    assert ours_or_orphans() - before == set(), "namespaces left behind"


def gone(pid: int) -> bool:
    """True when the process has ended (a zombie waiting for its parent counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def root_namespace_network() -> tuple[str, str, str]:
    """The machine's own interfaces, addresses and routes, to check nobody touched them."""
    return tuple(subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
                 for cmd in (["ip", "-br", "link"], ["ip", "-br", "addr"], ["ip", "route"]))


# Programs run inside the hosts ------------------------------------------------------------------

SERVE = r"""
import socket, sys, threading
tag, listening = sys.argv[1], []
for spec in sys.argv[2:]:                       # ADDRESS:PORT ...
    host, port = spec.rsplit(":", 1)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, int(port)))
    s.listen()
    listening.append(s)
def serve(s):
    while True:
        c, _ = s.accept()
        c.sendall(tag.encode())
        c.close()
for s in listening[1:]:
    threading.Thread(target=serve, args=(s,), daemon=True).start()
print("ready", flush=True)
serve(listening[0])
"""

CONNECT = r"""
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3) as c:
        print("reached", c.recv(100).decode())
except OSError as e:
    print("failed", type(e).__name__)
"""

RECEIVE = r"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen()
print("ready", flush=True)
c, _ = s.accept()
left = int(sys.argv[3])
while left > 0:
    chunk = c.recv(1 << 20)
    if not chunk:
        break
    left -= len(chunk)
c.sendall(b"k")                                  # all arrived
"""

SEND = r"""
import socket, sys, time
data = bytes(int(sys.argv[3]))
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
start = time.perf_counter()
c.sendall(data)
c.recv(1)                                        # until the receiver has it all
print(time.perf_counter() - start)
"""


def start_server(hosts: Hosts, k: int, tag: str, *specs: str) -> subprocess.Popen:
    server = hosts.popen(k, [PYTHON, "-c", SERVE, tag, *specs], stdout=subprocess.PIPE,
                         text=True)
    assert server.stdout.readline().strip() == "ready"
    return server


def connect(hosts: Hosts, k: int, host: str, port: int) -> str:
    return hosts.run(k, [PYTHON, "-c", CONNECT, host, str(port)], capture_output=True,
                     text=True, timeout=20).stdout.strip()


def transfer_seconds(hosts: Hosts, src: int, dst: int, nbytes: int, port: int = 5001) -> float:
    receiver = hosts.popen(dst, [PYTHON, "-c", RECEIVE, hosts.addresses[dst], str(port),
                                 str(nbytes)], stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout.readline().strip() == "ready"
        sent = hosts.run(src, [PYTHON, "-c", SEND, hosts.addresses[dst], str(port), str(nbytes)],
                         capture_output=True, text=True, timeout=60)
        assert sent.returncode == 0, sent.stderr
        return float(sent.stdout)
    finally:
        receiver.wait(timeout=30)


# Without root: the link, the command, the errors -----------------------------------------------

def test_a_link_is_a_rate_and_an_optional_delay():
    assert parse_link("1gbit") == H.Link("1gbit", "1gbit", 1e9)
    assert parse_link(" 200Mbit  0.5ms ") == H.Link("200mbit 0.5ms", "200mbit", 200e6,
                                                    "0.5ms", 0.5)
    assert parse_link("1.5gbit 200us").delay_ms == pytest.approx(0.2)
    for bad in ["", "fast", "1gb", "100 mbit", "1gbit 5", "0.5ms", "1gbit 1ms 2ms", "5kbit"]:
        with pytest.raises(HostsError) as error:
            parse_link(bad)
        assert "\n" not in str(error.value) and str(error.value).startswith(f"LINK={bad!r}")


def test_every_host_runs_the_same_torchrun_command():
    hosts = Hosts(3)  # not entered: nothing is made
    agent = torchrun_command(hosts, "s.py", ["--x"], nproc=2, port=29400, torchrun="torchrun")
    assert agent == ["torchrun", "--nnodes=3", "--nproc-per-node=2", "--rdzv-backend=c10d",
                     "--rdzv-endpoint=10.213.0.1:29400", f"--rdzv-id={hosts.run_id}",
                     "--max-restarts=0", "s.py", "--x"]
    assert hosts.command(2, agent)[:4] == ["ip", "netns", "exec", f"{hosts.run_id}-h2"]
    assert Hosts(1).run_id != hosts.run_id  # the next run in this process gets its own names


@pytest.mark.parametrize("args, message", [
    (["--hosts", "0"], "error: HOSTS=0 is out of range; it must be between 1 and 16"),
    (["--link", "fast"], "error: LINK='fast' is not a link: give a rate"),
    (["--nproc", "x"], "error: NPROC='x' is not a whole number"),
    ([], "error: script missing.py does not exist"),
])
def test_bad_input_is_one_line_before_anything_is_made(args, message):
    result = run([PYTHON, "-m", "ddpcourse.cluster.hosts", "run", *args, "missing.py"], timeout=30)
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(message)


def test_the_environment_gives_hosts_nproc_and_link():  # what make passes on
    result = run([PYTHON, "-m", "ddpcourse.cluster.hosts", "run", "missing.py"], timeout=30,
                 env={"HOSTS": "17", "NPROC": "2", "LINK": "1gbit"})
    assert result.stderr.startswith("error: HOSTS=17 is out of range")
    result = run([PYTHON, "-m", "ddpcourse.cluster.hosts", "run", "missing.py"], timeout=30,
                 env={"LINK": "1 gbit"})
    assert result.stderr.startswith("error: LINK='1 gbit' is not a link")


def test_without_ip_or_root_it_says_so_and_points_to_the_simulation(monkeypatch):
    monkeypatch.setattr(H.shutil, "which", lambda name: None)
    assert "need the `ip` command" in H.unavailable_reason()
    monkeypatch.undo()
    monkeypatch.setattr(H, "_has_cap_sys_admin", lambda: False)
    reason = H.unavailable_reason()
    assert "needs root (CAP_SYS_ADMIN)" in reason
    assert reason.endswith("make lesson3 NNODES=2 NPROC=2")
    with pytest.raises(HostsError, match="CAP_SYS_ADMIN"):
        Hosts(2).__enter__()
    result = run([PYTHON, "-m", "ddpcourse.cluster.hosts", "run", "scripts/lesson1_whoami.py"],
                 timeout=30, env={"PATH": "/nonexistent"})  # no `ip` on this PATH
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "error: separate hosts need the `ip` command (iproute2), which is not installed; "
        f"{H.FALLBACK}"]
    if os.geteuid() == 0 and H.shutil.which("setpriv"):  # really without the capability
        # Root without CAP_SYS_ADMIN (a container's root, often): every capability dropped but
        # reading files, so that the course can be imported wherever the clone sits (user
        # nobody could not read it in a private folder). The real interpreter: a fork
        # server's stand-in would carry our capabilities.
        result = run(["setpriv", "--bounding-set=-all,+dac_override,+dac_read_search",
                      "--inh-caps=-all", REAL_PYTHON,
                      "-m", "ddpcourse.cluster.hosts", "run", "scripts/lesson1_whoami.py"],
                     timeout=30)
        assert result.returncode == 2
        assert result.stderr.splitlines() == [
            "error: separate hosts are Linux network namespaces, and creating them needs root "
            f"(CAP_SYS_ADMIN), which this process does not have; {H.FALLBACK}"]


# Making and removing hosts ---------------------------------------------------------------------

@needs_hosts
def test_hosts_are_made_on_a_switch_and_removed_leaving_the_machine_alone():
    machine = root_namespace_network()
    with Hosts(3) as hosts:
        assert set(hosts.names + [hosts.switch]) <= set(H.list_namespaces())
        for k, name in enumerate(hosts.names):
            shown = subprocess.run(["ip", "-n", name, "-o", "-4", "addr"], capture_output=True,
                                   text=True, timeout=10).stdout
            assert re.findall(r"\d+: (\w+)\s+inet (\S+)", shown) == [
                ("lo", "127.0.0.1/8"), ("eth0", f"10.213.0.{k + 1}/24")]
        ports = subprocess.run(["ip", "-n", hosts.switch, "-o", "link", "show", "master", "br0"],
                               capture_output=True, text=True, timeout=10).stdout
        assert sorted(re.findall(r"\d+: (h\d)@", ports)) == ["h0", "h1", "h2"]
        # each host knows the others by name, and the machine's hostname as itself
        names = ("import socket as s; "
                 "print(s.gethostbyname('host0'), s.gethostbyname(s.gethostname()))")
        lookup = hosts.run(2, [PYTHON, "-c", names], capture_output=True, text=True,
                           timeout=20).stdout.split()
        assert lookup == ["10.213.0.1", "10.213.0.3"]
        assert root_namespace_network() == machine
    assert not set(hosts.names + [hosts.switch]) & set(H.list_namespaces())
    assert not any(os.path.exists(f"{H.NETNS_ETC}/{n}") for n in hosts.names)
    assert root_namespace_network() == machine


@needs_hosts
def test_hosts_are_removed_when_the_body_raises_and_their_processes_stopped():
    with pytest.raises(RuntimeError, match="the body failed"):
        with Hosts(2) as hosts:
            sleeper = hosts.popen(1, ["sleep", "60"])
            raise RuntimeError("the body failed")
    assert sleeper.wait(timeout=10) != 0  # killed, not finished
    assert not set(hosts.names + [hosts.switch]) & set(H.list_namespaces())


# A job started in the background by a shell inherits SIGINT ignored (so does this child,
# when the tests run that way); a student's Ctrl-C reaches a foreground run. Restore it.
CHILD = r"""
import signal, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from ddpcourse.cluster.hosts import Hosts
with Hosts(2) as hosts:
    sleeper = hosts.popen(1, ["sleep", "60"])
    print(sleeper.pid, hosts.switch, *hosts.names, flush=True)
    time.sleep(60)
"""


def start_child() -> tuple[subprocess.Popen, int, list[str]]:
    child = subprocess.Popen([PYTHON, "-c", CHILD], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    line = child.stdout.readline()
    assert line, child.stderr.read()
    pid, *names = line.split()
    assert set(names) <= set(H.list_namespaces())
    return child, int(pid), names


@pytest.mark.slow
@needs_hosts
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_hosts_are_removed_when_their_process_is_interrupted_or_terminated(sig):
    child, sleeper, names = start_child()
    child.send_signal(sig)
    status = child.wait(timeout=20)
    assert status in (-sig, 128 + sig), child.stderr.read()  # ended by the signal
    assert not set(names) & set(H.list_namespaces())
    assert gone(sleeper)


@needs_hosts
def test_cleanup_stale_removes_what_a_run_killed_with_9_left_and_nothing_else():
    with Hosts(1) as mine:  # a live run: not stale
        child, sleeper, names = start_child()
        child.kill()
        child.wait(timeout=10)
        assert set(names) <= set(H.list_namespaces()) and not gone(sleeper)  # kill -9 leaks
        result = run([PYTHON, "-m", "ddpcourse.cluster.hosts", "cleanup-stale"], timeout=60)
        assert result.returncode == 0, result.stderr
        assert f"removed {len(names)} stale namespace(s)" in result.stdout
        assert not set(names) & set(H.list_namespaces())
        assert set(mine.names) <= set(H.list_namespaces())
        deadline = time.monotonic() + 5
        while not gone(sleeper) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(sleeper)


# What separate hosts mean ----------------------------------------------------------------------

@needs_hosts
def test_127_0_0_1_is_private_to_each_host():
    with socket.socket() as s:  # a port nothing on the machine's own loopback listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Hosts(2) as hosts:
        server = start_server(hosts, 0, "host0", f"127.0.0.1:{port}", f"10.213.0.1:{port}")
        try:
            assert connect(hosts, 0, "127.0.0.1", port) == "reached host0"  # its own loopback
            assert connect(hosts, 1, "127.0.0.1", port) == "failed ConnectionRefusedError"
            assert connect(hosts, 1, "10.213.0.1", port) == "reached host0"  # over the switch
            assert connect(hosts, 1, "host0", port) == "reached host0"
            with pytest.raises(OSError):  # nor does the machine itself reach it
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
        finally:
            server.kill()
            server.wait()


@needs_hosts
def test_two_runs_at_once_use_the_same_addresses_without_meeting():
    with Hosts(2) as a, Hosts(2) as b:
        assert not set(a.names + [a.switch]) & set(b.names + [b.switch])
        assert a.addresses == b.addresses
        servers = [start_server(a, 0, "run a", "10.213.0.1:7000"),
                   start_server(b, 0, "run b", "10.213.0.1:7000")]
        try:
            assert connect(a, 1, "10.213.0.1", 7000) == "reached run a"
            assert connect(b, 1, "10.213.0.1", 7000) == "reached run b"
        finally:
            for server in servers:
                server.kill()
                server.wait()


@pytest.mark.slow
@needs_hosts
def test_a_shaped_link_slows_a_transfer_to_its_rate_both_ways():
    nbytes = 8 << 20  # 8 MB: 0.67 s at 100 Mbit/s
    with Hosts(2) as fast:
        unshaped = transfer_seconds(fast, 1, 0, nbytes)
    with Hosts(2, "100mbit") as slow:
        shaped = [transfer_seconds(slow, 1, 0, nbytes), transfer_seconds(slow, 0, 1, nbytes)]
    nominal = nbytes * 8 / 100e6
    for seconds in shaped:
        assert seconds >= 3 * unshaped, (unshaped, shaped)
        assert 0.9 * nominal <= seconds <= 3 * nominal, (nominal, shaped)


@needs_hosts
def test_a_delay_is_applied_where_the_kernel_has_netem_and_said_otherwise():
    with Hosts(2, "100mbit 3ms") as hosts:
        qdiscs = subprocess.run(["tc", "-n", hosts.names[0], "qdisc"], capture_output=True,
                                text=True, timeout=10).stdout
        assert "tbf" in qdiscs and "rate 100Mbit" in qdiscs  # the rate, in any case
        if "netem" not in qdiscs:
            assert hosts.notes == [
                "note: LINK delay 3ms is not available on this machine (its kernel has no "
                "netem qdisc); applying the rate 100mbit alone"]
            return
        server = start_server(hosts, 0, "host0", "10.213.0.1:7000")
        try:  # a TCP handshake crosses twice: host 1 to 0, 0 to 1, each delayed 3 ms
            timed = hosts.run(1, [PYTHON, "-c", "import socket, time; t = time.perf_counter();"
                                  "socket.create_connection(('10.213.0.1', 7000)).close();"
                                  "print(time.perf_counter() - t)"],
                              capture_output=True, text=True, timeout=20)
            assert float(timed.stdout) >= 0.0055
        finally:
            server.kill()
            server.wait()


# The launcher, with a stand-in for torchrun (no torch: quick) --------------------------------

FAKE_TORCHRUN = """#!/bin/sh
# says where it runs and with what, then behaves as its script argument asks
echo "agent $$ $(ip -o -4 addr show dev eth0 | awk '{print $4}') $GLOO_SOCKET_IFNAME \
$NCCL_SOCKET_IFNAME $COURSE_LINK $*"
case "$*" in *hang*) exec sleep 60;; *fail*) exit 3;; esac
"""


@pytest.mark.slow
@needs_hosts
@pytest.mark.parametrize("script, status", [("ok.py", 0), ("fail.py", 3), ("hang.py", 124)])
def test_the_launcher_runs_one_agent_per_host_and_stops_them_all(tmp_path, script, status):
    fake = tmp_path / "torchrun"
    fake.write_text(FAKE_TORCHRUN)
    fake.chmod(0o755)
    started = time.monotonic()
    result = H.launch_hosts(script, ["--x"], hosts=3, nproc=2, link="1gbit", timeout=2,
                            capture=True, echo=False, torchrun=str(fake))
    assert result.returncode == status, result.stdout + result.stderr
    assert time.monotonic() - started < 20
    agents = sorted(line.split(" ", 6) for line in result.stdout.splitlines())
    assert len(agents) == 3 and all(gone(int(agent[1])) for agent in agents)
    if status == 0:
        assert [agent[:1] + agent[2:] for agent in agents] == [
            ["agent", f"10.213.0.{k + 1}/24", "eth0", "eth0", "1gbit",
             f"--nnodes=3 --nproc-per-node=2 --rdzv-backend=c10d "
             f"--rdzv-endpoint=10.213.0.1:29400 --rdzv-id={result.args[0][3][:-3]} "
             "--max-restarts=0 ok.py --x"] for k in range(3)]
    if status == 124:
        assert "error: the job did not finish within 2 s and was stopped" in result.stderr


# torch across the hosts ------------------------------------------------------------------------

@needs_hosts
@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_benchmark_runs_across_two_hosts_from_the_command_line():
    result = run([PYTHON, "-m", "ddpcourse.cluster.hosts", "run", "--hosts", "2", "--link",
                  "100mbit", "--timeout", "180", "scripts/experiments/lesson5_allreduce_hosts.py",
                  "--max-bytes", "1M"], timeout=220, env={"CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    commands = [line for line in out.splitlines() if line.startswith("$ ")]
    assert len(commands) == 2
    for k, line in enumerate(commands):  # what make shows: the env, the host, torchrun
        assert re.fullmatch(
            r"\$ GLOO_SOCKET_IFNAME=eth0 NCCL_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 "
            rf"COURSE_LINK=100mbit ip netns exec ddpc\d+-\d+-h{k} \S*torchrun --nnodes=2 "
            r"--nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=10.213.0.1:29400 "
            r"--rdzv-id=ddpc\d+-\d+ --max-restarts=0 "
            r"scripts/experiments/lesson5_allreduce_hosts.py --max-bytes 1M", line), line
    assert "W=2 processes on 2 address(es): rank 0 10.213.0.1, rank 1 10.213.0.2" in out
    s = summary(out)
    assert (s["world_size"], s["hosts"], s["link"], s["at"]) == ("2", "2", "100mbit", "1MB")
    assert float(s["nominal_GBps"]) == 0.0125
    assert 0.3 < float(s["of_nominal"]) <= 1.02  # never faster than the link


@needs_hosts
@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lesson3_trains_the_same_on_two_hosts_as_on_one(tmp_path):
    import torch

    from ddpcourse.cluster.launch import launch

    args = ["--epochs", "1"]
    across = launch_hosts_or_fail(args + ["--checkpoint", str(tmp_path / "hosts.pt")])
    one = launch("scripts/lesson3_ddp.py", args + ["--checkpoint", str(tmp_path / "one.pt")],
                 nproc=2, timeout=150, cwd=str(ROOT), capture=True, echo=False, backend="gloo")
    assert one.returncode == 0, one.stdout + one.stderr
    a, b = summary(across.stdout), summary(one.stdout)
    assert a["world_size"] == b["world_size"] == "2"
    assert float(a["train_loss"]) == pytest.approx(float(b["train_loss"]), abs=1e-4)
    assert float(a["val_acc"]) == pytest.approx(float(b["val_acc"]), abs=1e-4)
    weights = [torch.load(tmp_path / f, weights_only=True)["model"] for f in ("hosts.pt", "one.pt")]
    assert weights[0].keys() == weights[1].keys()
    for name, tensor in weights[0].items():
        assert torch.allclose(tensor.double(), weights[1][name].double(), rtol=1e-5,
                              atol=1e-6), name


def launch_hosts_or_fail(script_args: list[str]):
    result = H.launch_hosts("scripts/lesson3_ddp.py", script_args, hosts=2, nproc=1,
                            timeout=150, cwd=str(ROOT), capture=True, echo=False,
                            backend="gloo")
    assert result.returncode == 0, result.stdout + result.stderr
    return result
