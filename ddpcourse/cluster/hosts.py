"""Hosts that are really separate, on one machine: network namespaces joined by a switch.

A Linux network namespace has its own interfaces, addresses, routes and ports. So a process
in host 1 that connects to 127.0.0.1 reaches host 1's own loopback, never host 0's: the hosts
can only talk over their network, as real machines do. The picture of a run with H hosts:

    host k   namespace ddpc<pid>-<n>-h<k>   lo, and eth0 with 10.213.0.(k+1)/24
               |  one veth pair per host: a virtual cable
    switch   namespace ddpc<pid>-<n>-sw     bridge br0 with one port h<k> per host

Nothing is created in the machine's own namespace: its interfaces and routes are never
touched, and its programs cannot reach the hosts' addresses. Every run has its own switch,
so two runs at once can both use 10.213.0.x without meeting, and its own name prefix (the
pid of the process that made it), so their namespaces never clash. Each host also gets its
own /etc/hosts (the file /etc/netns/<namespace>/hosts, which `ip netns exec` shows in its
place): the names host0, host1, ..., and this machine's hostname, which in host k means
host k, as a real machine's hostname means itself.

    python -m ddpcourse.cluster.hosts run --hosts 2 --nproc 1 [--link "1gbit 0.5ms"] SCRIPT ARGS...
    python -m ddpcourse.cluster.hosts cleanup-stale     # namespaces of a run that was killed -9
    python -m ddpcourse.cluster.hosts check             # can this machine make hosts? (exit 0 or 2)

`run` starts one torchrun agent in each host; they meet by c10d rendezvous on host 0's
address. --hosts, --nproc, --link and --timeout default to the environment's HOSTS, NPROC,
LINK and TIMEOUT, so `make TARGET HOSTS=3 LINK=100mbit` reaches them. A link ("1gbit", or
"1gbit 0.5ms" with a one-way delay) is shaped with `tc`: tbf for the rate, netem for the
delay where the kernel has it. The hosts share the machine's memory and GPUs: gloo's traffic
crosses the shaped links, but nccl between GPUs of one machine uses shared memory or NVLink.

Needs Linux, root (CAP_SYS_ADMIN) and the `ip` command (`tc` too for a link). Like
ddpcourse.cluster.launch it uses only the standard library, so it runs before .venv exists.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from ddpcourse.cluster.launch import (
    LaunchError,
    check_backend,
    default_torchrun,
    gpus_per_node,
    positive_int,
    run_commands,
    visible_gpu_count,
)

# The one address range every run uses: host k is 10.213.0.(k+1). Private (RFC 1918) and
# only ever assigned inside a run's own namespaces, so it cannot meet a real network.
SUBNET, PREFIX_LENGTH = "10.213.0", 24
NAME_PREFIX = "ddpc"              # every namespace this module makes: ddpc<pid>-<n>-...
BRIDGE, HOST_IFACE = "br0", "eth0"
NETNS_ETC = "/etc/netns"          # ip netns exec NAME shows NETNS_ETC/NAME/hosts as /etc/hosts
MAX_HOSTS = 16
RDZV_PORT = 29400                 # torchrun's usual c10d port: free in a fresh namespace
# Tell gloo (and nccl) which interface to use. Without it they look up this machine's
# hostname, whose address belongs to the machine's own namespace, not to the host.
HOST_ENV = {"GLOO_SOCKET_IFNAME": HOST_IFACE, "NCCL_SOCKET_IFNAME": HOST_IFACE}
LINK_ENV = "COURSE_LINK"          # the link a job runs over, for scripts that report it
FALLBACK = "simulate the nodes on 127.0.0.1 instead: make lesson3 NNODES=2 NPROC=2"


class HostsError(Exception):
    """A problem making or using hosts, reported as one line."""


def address(k: int) -> str:
    return f"{SUBNET}.{k + 1}"


# --- the link: "1gbit" or "1gbit 0.5ms" -------------------------------------------------------

RATE_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}
DELAY_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


@dataclass(frozen=True)
class Link:
    text: str                # as given, tidied: "1gbit 0.5ms"
    rate: str                # for tc: "1gbit"
    bits_per_s: float
    delay: str = ""          # for tc: "0.5ms", or "" for none
    delay_ms: float = 0.0


def parse_link(text: str) -> Link:
    """A link from 'RATE [DELAY]': RATE like 100mbit or 1gbit, DELAY like 0.5ms or 200us."""
    usage = (f"LINK={text!r} is not a link: give a rate and optionally a one-way delay, "
             'e.g. LINK="1gbit" or LINK="1gbit 0.5ms" (rates in kbit, mbit, gbit; '
             "delays in us, ms, s)")
    words = str(text).lower().split()
    if not 1 <= len(words) <= 2:
        raise HostsError(usage)
    rate = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", words[0])
    delay = re.fullmatch(r"(\d+(?:\.\d+)?)(us|ms|s)", words[1]) if len(words) == 2 else None
    if not rate or (len(words) == 2 and not delay):
        raise HostsError(usage)
    bits_per_s = float(rate.group(1)) * RATE_UNITS[rate.group(2)]
    if bits_per_s < 10e3:  # tbf works below that, but nothing would finish
        raise HostsError(f"LINK={text!r}: the rate must be at least 10kbit")
    delay_ms = float(delay.group(1)) * DELAY_UNITS[delay.group(2)] if delay else 0.0
    if delay_ms > 10_000:
        raise HostsError(f"LINK={text!r}: the delay must be at most 10s")
    return Link(" ".join(words), words[0], bits_per_s, words[1] if delay else "", delay_ms)


# --- what the machine must offer ----------------------------------------------------------------

def _has_cap_sys_admin() -> bool:
    """Whether this process may create namespaces (root has the capability, unless a
    container took it away)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> 21 & 1)  # bit 21: CAP_SYS_ADMIN
    except OSError:
        pass
    return os.geteuid() == 0


def unavailable_reason(link: Link | None = None) -> str | None:
    """Why hosts cannot be made here (one line, ending in what to do instead), or None."""
    if not sys.platform.startswith("linux"):
        why = f"separate hosts need Linux network namespaces, and this is {sys.platform}"
    elif not _has_cap_sys_admin():
        why = ("separate hosts are Linux network namespaces, and creating them needs root "
               "(CAP_SYS_ADMIN), which this process does not have")
    elif shutil.which("ip") is None:
        why = "separate hosts need the `ip` command (iproute2), which is not installed"
    elif link is not None and shutil.which("tc") is None:
        why = "LINK needs the `tc` command (iproute2), which is not installed"
    else:
        return None
    return f"{why}; {FALLBACK}"


def _tool(*words: str) -> subprocess.CompletedProcess:
    """Run `ip` or `tc`; a failure becomes a HostsError naming the command."""
    result = subprocess.run(words, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        said = " ".join(result.stderr.split()) or f"exit status {result.returncode}"
        raise HostsError(f"`{' '.join(words)}` failed: {said}")
    return result


def list_namespaces() -> list[str]:
    """The names `ip netns list` shows (lines like 'ddpc12-0-h0 (id: 3)')."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                         timeout=30).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def pids_in(namespace: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True,
                         timeout=30).stdout
    return [int(word) for word in out.split() if word.isdigit()]


def remove_namespaces(names: list[str], grace: float = 2.0) -> None:
    """Stop every process inside the namespaces (TERM, then KILL), then delete them.

    A namespace lives on while a process is inside it, so its processes go first.
    """
    all_names, existing = names, set(list_namespaces())
    names = [name for name in names if name in existing]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [pid for name in names for pid in pids_in(name)]
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            time.sleep(0.05)
            pids = [pid for name in names for pid in pids_in(name)]
        if not pids:
            break
    for name in names:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30)
    for name in all_names:
        shutil.rmtree(os.path.join(NETNS_ETC, name), ignore_errors=True)


def _owner_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale() -> list[str]:
    """Remove the namespaces of runs whose process is gone (killed with -9, say).

    A namespace's name carries the pid of the process that made it; one whose process still
    runs belongs to a run in progress and is left alone.
    """
    stale = []
    etc = os.listdir(NETNS_ETC) if os.path.isdir(NETNS_ETC) else []
    for name in sorted(set(list_namespaces()) | set(etc)):
        m = re.match(rf"{NAME_PREFIX}(\d+)-", name)
        if m and not _owner_alive(int(m.group(1))):
            stale.append(name)
    remove_namespaces(stale)
    return stale


# --- the hosts ------------------------------------------------------------------------------------

_run_numbers = itertools.count()  # several runs in one process get different names


class _Stop(SystemExit):
    """Raised in the main thread by SIGTERM or SIGHUP, so `with Hosts(...)` cleans up."""


def _stop(signum, frame):
    raise _Stop(128 + signum)


class Hosts:
    """H hosts on a switch, for the duration of a `with` block.

        with Hosts(2, link="1gbit") as hosts:
            hosts.run(1, ["python", "-c", "..."])     # runs inside host 1

    Everything is removed when the block ends: after an exception, Ctrl-C (SIGINT) or SIGTERM
    too. Only kill -9 leaves namespaces behind; `python -m ddpcourse.cluster.hosts cleanup-stale`
    removes them, and so does the next run.
    """

    def __init__(self, count: int, link: str | Link | None = None):
        if not 1 <= count <= MAX_HOSTS:
            raise HostsError(f"HOSTS={count} is out of range; it must be between 1 and "
                             f"{MAX_HOSTS}")
        self.link = parse_link(link) if isinstance(link, str) and link.strip() else (
            link or None)
        self.run_id = f"{NAME_PREFIX}{os.getpid()}-{next(_run_numbers)}"
        self.switch = f"{self.run_id}-sw"
        self.names = [f"{self.run_id}-h{k}" for k in range(count)]
        self.addresses = [address(k) for k in range(count)]
        self.notes: list[str] = []   # what a caller should tell the user (delay not available)
        self._saved_handlers: dict = {}

    # Making and removing ------------------------------------------------------------------

    def __enter__(self) -> Hosts:
        reason = unavailable_reason(self.link)
        if reason:
            raise HostsError(reason)
        removed = cleanup_stale()  # an earlier run killed with -9, and its processes
        if removed:
            self.notes.append(f"note: removed {len(removed)} namespace(s) left by a killed "
                              f"run: {' '.join(removed)}")
        self._trap_signals()
        try:
            self._create()
        except BaseException:
            self._remove()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._remove()

    def _trap_signals(self) -> None:
        # SIGINT already raises KeyboardInterrupt; SIGTERM and SIGHUP would end Python at
        # once, leaving the namespaces and the processes inside. Only the main thread may
        # set handlers.
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                self._saved_handlers[sig] = signal.signal(sig, _stop)

    def _remove(self) -> None:
        # A second Ctrl-C must not cut the cleanup short: hold the signals until it is done.
        # They are delivered afterwards (with the previous handlers back in place).
        main = threading.current_thread() is threading.main_thread()
        held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
        if main:
            signal.pthread_sigmask(signal.SIG_BLOCK, held)
        try:
            remove_namespaces([*self.names, self.switch])
        finally:
            for sig, handler in self._saved_handlers.items():
                signal.signal(sig, handler)
            self._saved_handlers = {}
            if main:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, held)

    def _create(self) -> None:
        sw = self.switch
        try:
            _tool("ip", "netns", "add", sw)
        except HostsError as error:
            raise HostsError(f"cannot create a network namespace ({error}); {FALLBACK}") from None
        _tool("ip", "-n", sw, "link", "add", BRIDGE, "type", "bridge")
        _tool("ip", "-n", sw, "link", "set", BRIDGE, "up")
        for k, (name, addr) in enumerate(zip(self.names, self.addresses, strict=True)):
            port = f"h{k}"
            _tool("ip", "netns", "add", name)
            self._write_etc_hosts(k)
            _tool("ip", "-n", name, "link", "set", "lo", "up")
            # Made inside the host, its other end moved straight into the switch: neither
            # end ever exists in the machine's own namespace.
            _tool("ip", "-n", name, "link", "add", HOST_IFACE, "type", "veth",
                  "peer", "name", port, "netns", sw)
            # No IPv6 link-local address: eth0 has exactly one address for gloo to find.
            _tool("ip", "-n", name, "link", "set", HOST_IFACE, "addrgenmode", "none")
            _tool("ip", "-n", name, "addr", "add", f"{addr}/{PREFIX_LENGTH}", "dev", HOST_IFACE)
            _tool("ip", "-n", name, "link", "set", HOST_IFACE, "up")
            _tool("ip", "-n", sw, "link", "set", port, "master", BRIDGE, "up")
        if self.link:
            self._shape(self.link)

    def _write_etc_hosts(self, k: int) -> None:
        """Host k's /etc/hosts: every host by name, and the machine's hostname as host k.

        The hostname matters to torchrun: the agent whose hostname resolves to the rendezvous
        endpoint's address hosts the rendezvous store, and the agent of node rank 0 tells the
        workers its own name (socket.getfqdn()) as MASTER_ADDR. So in host 0 the hostname must
        mean 10.213.0.1, and "host0" must mean it everywhere. Names also let the store look
        up who connected without a warning (no DNS server is reachable from a host).
        """
        lines = [f"# host {k} of run {self.run_id}, written by ddpcourse.cluster.hosts",
                 "127.0.0.1 localhost", "::1 localhost"]
        for j, addr in enumerate(self.addresses):
            lines.append(f"{addr} host{j}" + (f" {socket.gethostname()}" if j == k else ""))
        # The store listens on IPv6 too and sees IPv4 peers as ::ffff:a.b.c.d.
        lines += [f"::ffff:{addr} host{j}" for j, addr in enumerate(self.addresses)]
        folder = os.path.join(NETNS_ETC, self.names[k])
        try:
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "hosts"), "w") as f:
                f.write("\n".join(lines) + "\n")
        except OSError as error:
            raise HostsError(f"cannot write {folder}/hosts: {error.strerror}") from None

    def _shape(self, link: Link) -> None:
        """Limit each host's link to link.rate in both directions; delay where possible.

        tbf on the host's eth0 limits what it sends. tbf on its switch port limits what it
        receives: with three or more hosts, two senders then share one receiver's rate, as
        they would share its cable. The burst (bytes sent at once before the rate applies)
        is 2 ms of traffic, at least 64 KB so that a whole veth packet (up to 64 KB with
        segmentation offload) fits.
        """
        burst = max(64 * 1024, int(link.bits_per_s / 8 * 0.002))
        tbf = ["tbf", "rate", link.rate, "burst", str(burst), "latency", "50ms"]
        delay_here = bool(link.delay)
        for k, name in enumerate(self.names):
            parent = ["root"]
            if delay_here:
                # The delay on what a host sends: host to host, one way, it is link.delay.
                netem = subprocess.run(
                    ["tc", "-n", name, "qdisc", "add", "dev", HOST_IFACE, "root", "handle",
                     "1:", "netem", "delay", link.delay, "limit", "100000"],
                    capture_output=True, text=True, timeout=30)
                if netem.returncode == 0:
                    parent = ["parent", "1:1", "handle", "10:"]
                elif k == 0 and "unknown" in netem.stderr.lower():
                    delay_here = False
                    self.notes.append(
                        f"note: LINK delay {link.delay} is not available on this machine (its "
                        f"kernel has no netem qdisc); applying the rate {link.rate} alone")
                else:
                    raise HostsError(f"`tc ... netem delay {link.delay}` failed in {name}: "
                                     f"{' '.join(netem.stderr.split())}")
            _tool("tc", "-n", name, "qdisc", "add", "dev", HOST_IFACE, *parent, *tbf)
            _tool("tc", "-n", self.switch, "qdisc", "add", "dev", f"h{k}", "root", *tbf)

    # Running inside a host ------------------------------------------------------------------

    def command(self, k: int, argv: list[str], hostname: bool = False) -> list[str]:
        """argv as run inside host k.

        hostname=True also gives it a UTS namespace of its own whose hostname is host<k>, so
        that there `hostname` names the host, as on a real machine; the processes it starts
        (a daemon's jobs) inherit that. Needs `unshare` and `hostname`.
        """
        if hostname:
            argv = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', f"host{k}",
                    *argv]
        return ["ip", "netns", "exec", self.names[k], *argv]

    def env(self, base: dict | None = None) -> dict:
        """The environment for a process inside a host: gloo and nccl use eth0."""
        return dict(os.environ if base is None else base, **HOST_ENV)

    def run(self, k: int, argv: list[str], env: dict | None = None, hostname: bool = False,
            **kwargs):
        """subprocess.run inside host k."""
        return subprocess.run(self.command(k, argv, hostname), env=self.env(env), **kwargs)

    def popen(self, k: int, argv: list[str], env: dict | None = None, hostname: bool = False,
              **kwargs):
        """subprocess.Popen inside host k; the process is killed when the hosts go."""
        return subprocess.Popen(self.command(k, argv, hostname), env=self.env(env), **kwargs)

    def describe(self) -> str:
        link = f"link {self.link.text} each way" if self.link else "unshaped links"
        lines = [f"{len(self.names)} host(s) on switch {self.switch} ({link}):"]
        lines += [f"  {name}  {HOST_IFACE} {addr}"
                  for name, addr in zip(self.names, self.addresses, strict=True)]
        return "\n".join(lines)


# --- a torchrun job across the hosts --------------------------------------------------------------

def torchrun_command(hosts: Hosts, script: str, script_args: list[str], nproc: int,
                     port: int, torchrun: str) -> list[str]:
    """The torchrun agent of every host: the same command on each, as on a real cluster.

    No --node-rank: the rendezvous hands out node ranks, in the order of the hosts' names.
    The agent in the host whose address is the endpoint's (host 0) runs the rendezvous
    store; each host's /etc/hosts lets torchrun see which one that is (Hosts._write_etc_hosts).
    """
    return [torchrun, f"--nnodes={len(hosts.names)}", f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={hosts.addresses[0]}:{port}",
            f"--rdzv-id={hosts.run_id}", "--max-restarts=0", script, *script_args]


def launch_hosts(
    script: str,
    script_args: list[str] | None = None,
    hosts: int = 2,
    nproc: int = 1,
    link: str | None = None,
    timeout: float = 600,
    env: dict | None = None,
    cwd: str | None = None,
    capture: bool = False,
    echo: bool = True,
    port: int = RDZV_PORT,
    torchrun: str | None = None,
    backend: str = "",
) -> subprocess.CompletedProcess:
    """Make the hosts, run one torchrun agent in each, remove the hosts. Raises HostsError or
    LaunchError for a bad request; returns the job's CompletedProcess (returncode 124 when it
    ran out of time)."""
    env = dict(os.environ if env is None else env)
    check_backend(backend, env)
    parsed = parse_link(link) if link and link.strip() else None
    gpus = 0 if backend == "gloo" else visible_gpu_count(env)
    if gpus and hosts * nproc > gpus:
        raise LaunchError(f"HOSTS={hosts} x NPROC={nproc} processes but this machine has {gpus} "
                          f"GPU(s): one process per GPU, so use at most {gpus} (or "
                          "BACKEND=gloo to run on the CPU)")
    settings: dict[str, str] = {"CUDA_VISIBLE_DEVICES": ""} if backend == "gloo" else {}
    # the hosts share this machine's cores (as in ddpcourse.cluster.launch)
    if "OMP_NUM_THREADS" not in env:
        settings["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // (nproc * hosts)))
    if parsed:
        settings[LINK_ENV] = parsed.text
    host_settings = [dict(HOST_ENV, **settings) for _ in range(hosts)]
    if gpus:  # each host its own GPUs, as separate machines would have
        for host, devices in zip(host_settings, gpus_per_node(env, gpus, nproc, hosts),
                                 strict=True):
            host["CUDA_VISIBLE_DEVICES"] = devices
    torchrun = torchrun or default_torchrun()

    with Hosts(hosts, parsed) as net:
        agent = torchrun_command(net, script, script_args or [], nproc, port, torchrun)
        commands = [net.command(k, agent) for k in range(hosts)]
        envs = [dict(env, **host) for host in host_settings]
        notes = "".join(note + "\n" for note in net.notes)
        if echo:
            print(net.describe(), flush=True)
            print(notes, end="", file=sys.stderr, flush=True)
            for cmd, host in zip(commands, host_settings, strict=True):
                prefix = "".join(f"{key}={value} " for key, value in host.items())
                print("$ " + prefix + " ".join(cmd), flush=True)
        result = run_commands(commands, timeout=timeout, envs=envs, cwd=cwd, capture=capture)
    if capture:
        result.stderr = notes + result.stderr
    if result.returncode == 124:
        message = f"error: the job did not finish within {timeout:g} s and was stopped"
        print(message, file=sys.stderr, flush=True)
        if capture:
            result.stderr += message + "\n"
    return result


# --- the command line --------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run SCRIPT with torchrun on every host")
    env = os.environ
    run.add_argument("--hosts", default=env.get("HOSTS", "2"), help="hosts (HOSTS, default 2)")
    run.add_argument("--nproc", default=env.get("NPROC", "1"),
                     help="processes per host (NPROC, default 1)")
    run.add_argument("--link", default=env.get("LINK", ""),
                     help='each host\'s link: "1gbit" or "1gbit 0.5ms" (LINK; default unshaped)')
    run.add_argument("--timeout", default=env.get("TIMEOUT", "600"),
                     help="wall-clock limit of the job in seconds (TIMEOUT)")
    run.add_argument("--port", default=str(RDZV_PORT), help="rendezvous port on host 0")
    run.add_argument("--backend", default=env.get("BACKEND", ""),
                     help="gloo, nccl, or empty (BACKEND)")
    run.add_argument("script")
    run.add_argument("script_args", nargs=argparse.REMAINDER)
    sub.add_parser("cleanup-stale", help="remove namespaces left by runs that were killed")
    sub.add_parser("check", help="say whether hosts can be made here")
    args = parser.parse_args(argv)
    try:
        if args.command == "check":
            reason = unavailable_reason()
            if reason:
                raise HostsError(reason)
            print("ok: this machine can make separate hosts (network namespaces)")
            return 0
        if args.command == "cleanup-stale":
            reason = unavailable_reason()
            if reason:
                raise HostsError(reason)
            removed = cleanup_stale()
            print(f"removed {len(removed)} stale namespace(s)" +
                  (f": {' '.join(removed)}" if removed else ""))
            return 0
        hosts = positive_int("HOSTS", args.hosts, MAX_HOSTS)
        nproc = positive_int("NPROC", args.nproc, 64)
        timeout = positive_int("TIMEOUT", args.timeout, 24 * 3600)
        port = positive_int("PORT", args.port, 65535)
        if args.link.strip():
            parse_link(args.link)  # a bad LINK is reported before anything is made
        if not os.path.exists(args.script):
            raise HostsError(f"script {args.script} does not exist")
        result = launch_hosts(args.script, args.script_args, hosts, nproc, args.link, timeout,
                              port=port, backend=args.backend.strip())
    except (HostsError, LaunchError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C while the hosts were being made: they are gone again
        return 130
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
