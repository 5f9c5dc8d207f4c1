"""Lesson 5 experiment: the ways a multi-node launch goes wrong, each ended in seconds.

    make lesson5-drills                                              # every drill, one line each
    python scripts/experiments/lesson5_drills.py --only port-in-use  # its commands and output
    python scripts/experiments/lesson5_drills.py --list              # the drills, what each does

Each drill starts real torchrun agents (simulated nodes on 127.0.0.1, or hosts that are
really separate: network namespaces, ddpcourse.cluster.hosts), with one mistake planted, and
short timeouts so that nothing waits for long:

    --rdzv-conf timeout=T        static launch: how long an agent waits for the store and its
                                 peers (torchrun's default: 900 s)
    --rdzv-conf join_timeout=T   c10d rendezvous: how long it waits for the nodes to join (600 s)
    --timeout T (the script's)   init_process_group and collectives (gloo's default: 30 min)

The drills: wrong-port, wrong-addr (separate hosts), never-joins, nnodes-mismatch,
ifname-missing, ifname-lo (separate hosts), port-in-use, failing-rank (per-rank logs and the
error file of @record; see lesson5_failing_rank.py). A port in use under c10d rendezvous is
no drill: the agent then connects to whatever holds the port and waits, with no error.

Then it prints what was done, the line of the output that tells a student what went wrong,
how long it took, and what to do about it. The drills run on the CPU with gloo whatever the
machine has: they are about the network. Those that need separate hosts are skipped, saying
why, where namespaces cannot be made (not root, not Linux). The exit status is 0 when every
drill ended as it should (with its error), 1 otherwise.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ddpcourse.cli import ArgumentParser
from ddpcourse.cluster import hosts as H
from ddpcourse.cluster.launch import default_torchrun, run_commands
from ddpcourse.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
ENV_SCRIPT = "scripts/experiments/lesson5_env.py"
FAILING_SCRIPT = "scripts/experiments/lesson5_failing_rank.py"
# The drills use gloo on the CPU, one thread per process (and no torchrun warning about it).
DRILL_ENV = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}


@dataclass
class Outcome:
    """What one drill did and what came of it."""

    did: str = ""
    commands: list[str] = field(default_factory=list)  # as a student would type them
    output: str = ""
    returncode: int | None = None
    seconds: float = 0.0
    details: list[str] = field(default_factory=list)  # extra lines under the drill's line
    skipped: str = ""


@dataclass
class Drill:
    name: str
    summary: str                      # for --list
    expect: str                       # a regex: the line the student must see
    fix: str                          # what to do about it
    run: Callable[[Settings], Outcome]
    hosts: bool = False               # needs separate hosts (network namespaces)


@dataclass
class Settings:
    torchrun: str
    timeout: int                      # the torch-side timeouts, seconds
    limit: float                      # wall-clock limit of each drill, seconds
    log_dir: str


# --- running agents ---------------------------------------------------------------------------

def shown(command: list[str], env: dict[str, str]) -> str:
    """The command as a student would type it, with the settings it runs under in front."""
    return "".join(f"{k}={v} " for k, v in env.items()) + " ".join(command)


def agents(outcome: Outcome, commands: list[list[str]], settings: Settings,
           envs: list[dict[str, str]] | None = None) -> Outcome:
    """Run the agents together (ddpcourse.cluster.launch.run_commands: the first to fail, or
    the wall-clock limit, stops them all) and record what they printed."""
    envs = envs or [{} for _ in commands]
    outcome.commands += [shown(cmd, dict(DRILL_ENV, **env))
                         for cmd, env in zip(commands, envs, strict=True)]
    full = [dict(os.environ, **DRILL_ENV, **env) for env in envs]
    started = time.monotonic()
    result = run_commands(commands, timeout=settings.limit, envs=full, cwd=str(ROOT),
                          capture=True)
    outcome.seconds = time.monotonic() - started
    outcome.returncode = result.returncode
    outcome.output = result.stdout + result.stderr
    return outcome


def static_agent(settings: Settings, nnodes: int, node_rank: int, addr: str, port: int,
                 timeout: int, nproc: int = 1) -> list[str]:
    return [settings.torchrun, f"--nnodes={nnodes}", f"--node-rank={node_rank}",
            f"--nproc-per-node={nproc}", f"--master-addr={addr}", f"--master-port={port}",
            f"--rdzv-conf=timeout={timeout}", ENV_SCRIPT, "--timeout", str(settings.timeout)]


def c10d_agent(settings: Settings, nnodes: int, endpoint: str, run_id: str,
               nproc: int = 1) -> list[str]:
    return [settings.torchrun, f"--nnodes={nnodes}", f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}",
            f"--rdzv-conf=join_timeout={settings.timeout}", ENV_SCRIPT,
            "--timeout", str(settings.timeout)]


# --- the drills ------------------------------------------------------------------------------
# Where two agents wait for each other, the one whose message the drill is about gets the
# short timeout and the other a long one, so it is the first to fail, however slowly the
# machine starts them; the launcher then stops the other.

def wrong_port(s: Settings) -> Outcome:
    port, typo = free_port(), free_port()
    o = Outcome(did=f"static launch, 2 nodes; node 0 hosts the store on port {port}, node 1 "
                    f"was given --master-port={typo}")
    return agents(o, [static_agent(s, 2, 0, "127.0.0.1", port, 6 * s.timeout),
                      static_agent(s, 2, 1, "127.0.0.1", typo, s.timeout)], s)


def wrong_addr(s: Settings) -> Outcome:
    o = Outcome(did="static launch on 2 separate hosts, both with --master-addr=127.0.0.1 "
                    "(the command that worked on one machine)")
    with H.Hosts(2) as net:
        commands = [net.command(k, static_agent(s, 2, k, "127.0.0.1", 29500,
                                                s.timeout if k else 6 * s.timeout))
                    for k in range(2)]
        return agents(o, commands, s, [dict(H.HOST_ENV)] * 2)


def never_joins(s: Settings) -> Outcome:
    port = free_port()
    o = Outcome(did=f"c10d rendezvous with --nnodes=2, and only one node started "
                    f"(join_timeout={s.timeout})")
    return agents(o, [c10d_agent(s, 2, f"127.0.0.1:{port}", f"drill{port}")], s)


def nnodes_mismatch(s: Settings) -> Outcome:
    port = free_port()
    o = Outcome(did="static launch; node 0 was given --nnodes=3, node 1 --nnodes=2")
    return agents(o, [static_agent(s, 3, 0, "127.0.0.1", port, s.timeout),
                      static_agent(s, 2, 1, "127.0.0.1", port, 6 * s.timeout)], s)


def ifname_missing(s: Settings) -> Outcome:
    port = free_port()
    o = Outcome(did="a process with GLOO_SOCKET_IFNAME=eth9, an interface this machine "
                    "does not have")
    return agents(o, [static_agent(s, 1, 0, "127.0.0.1", port, s.timeout)], s,
                  [{"GLOO_SOCKET_IFNAME": "eth9"}])


def ifname_lo(s: Settings) -> Outcome:
    o = Outcome(did="2 separate hosts (peers on eth0) with GLOO_SOCKET_IFNAME=lo")
    with H.Hosts(2) as net:
        agent = c10d_agent(s, 2, f"{net.addresses[0]}:{H.RDZV_PORT}", net.run_id)
        return agents(o, [net.command(k, agent) for k in range(2)], s,
                      [dict(H.HOST_ENV, GLOO_SOCKET_IFNAME="lo")] * 2)


def port_in_use(s: Settings) -> Outcome:
    with socket.socket() as busy:  # another program that already listens on the port
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        o = Outcome(did=f"static launch whose --master-port={port} another program already "
                        "listens on")
        return agents(o, [static_agent(s, 1, 0, "127.0.0.1", port, s.timeout)], s)


def failing_rank(s: Settings) -> Outcome:
    port = free_port()
    log_dir = s.log_dir
    before = set(os.listdir(log_dir)) if os.path.isdir(log_dir) else set()
    o = Outcome(did="2 processes, rank 1 raises at step 2; torchrun --log-dir "
                    f"{log_dir} --redirects 3 --tee 3 --local-ranks-filter 0")
    agents(o, [[s.torchrun, "--nnodes=1", "--nproc-per-node=2", "--master-addr=127.0.0.1",
                f"--master-port={port}", f"--log-dir={log_dir}", "--redirects=3", "--tee=3",
                "--local-ranks-filter=0", FAILING_SCRIPT, "--fail-rank", "1",
                "--timeout", str(s.timeout)]], s)
    new = sorted(set(os.listdir(log_dir)) - before) if os.path.isdir(log_dir) else []
    root = re.search(r"\(error file: (\S+)\)$", o.output, re.M)  # the launcher's line
    o.details = describe_logs(os.path.join(log_dir, new[-1]), root and root.group(1)) if new else [
        f"no log folder appeared in {log_dir}"]
    shown_ranks = sorted(set(re.findall(r"^\[default(\d+)\]:", o.output, re.M)))
    o.details.append("console: local rank(s) " + (", ".join(shown_ranks) or "none") +
                     " only (--local-ranks-filter 0), each line prefixed [default<local "
                     "rank>]:; the files keep every rank's output")
    return o


def describe_logs(run_dir: str, root_cause: str | None) -> list[str]:
    """What torchrun wrote under --log-dir for one run, and what the error files hold."""
    lines = []
    attempts = sorted(p for p in Path(run_dir).glob("attempt_*"))
    for attempt in attempts:
        ranks = sorted((p for p in attempt.iterdir() if p.is_dir()), key=lambda p: int(p.name))
        files = sorted({f.name for rank in ranks for f in rank.iterdir()})
        lines.append(f"logs: {attempt}/<local rank>/{{{','.join(files)}}}, local ranks "
                     f"{', '.join(r.name for r in ranks)}")
        for rank in ranks:
            error = rank / "error.json"
            if not error.exists():
                continue
            data = json.loads(error.read_text())["message"]
            stack = data["extraInfo"]["py_callstack"]
            frames = re.findall(r'File "([^"]+)", line (\d+), in (\w+)', stack)
            where = (f"{os.path.relpath(frames[-1][0], ROOT)} line {frames[-1][1]} in "
                     f"{frames[-1][2]}") if frames else "?"
            message = " ".join(data["message"].split())
            message = message if len(message) <= 150 else message[:147] + "..."
            why = ("the root cause" if root_cause and os.path.samefile(error, root_cause)
                   else "a consequence")
            lines.append(f"error file of local rank {rank.name} ({why}): {message} (raised at "
                         f"{where})")
    return lines or [f"no attempt folder in {run_dir}"]


DRILLS = [
    Drill("wrong-port", "static launch, node 1 given the wrong --master-port",
          r"client socket has timed out after \d+ms while trying to connect to",
          "every node must be given node 0's --master-addr and --master-port", wrong_port),
    Drill("wrong-addr", "static launch on 2 hosts, --master-addr=127.0.0.1 on both",
          r"client socket has timed out after \d+ms while trying to connect to "
          r"\(127\.0\.0\.1",
          "on host 1, 127.0.0.1 is host 1 itself: give every node node 0's address "
          "(10.213.0.1 here; `hostname -I` on a real node)", wrong_addr, hosts=True),
    Drill("never-joins", "c10d rendezvous for 2 nodes, only one started",
          r"rendezvous\.api\.RendezvousTimeoutError",  # the error, not the traceback's raise
          "start the agent on every node (the same command), or lower --nnodes; "
          "--nnodes=1:2 would start without it", never_joins),
    Drill("nnodes-mismatch", "static launch, node 0 says --nnodes=3 and node 1 --nnodes=2",
          r"waiting for clients\. \d/3 clients joined",
          "give every agent the same --nnodes (the other way round, 2 on node 0 and 3 on "
          "node 1, the job even runs, with GROUP_WORLD_SIZE differing between nodes)",
          nnodes_mismatch),
    Drill("ifname-missing", "GLOO_SOCKET_IFNAME names an interface that does not exist",
          r"Unable to find address for: eth9",
          "name an interface the machine has (`ip -br addr` lists them), or unset "
          "GLOO_SOCKET_IFNAME to let gloo use the address of the hostname", ifname_missing),
    Drill("ifname-lo", "GLOO_SOCKET_IFNAME=lo on separate hosts",
          r"connectFullMesh failed .*remote=\[127\.0\.0\.1\]",
          "gloo told the other host to reach it at lo's 127.0.0.1, which there is that host "
          "itself: use the interface the hosts share (GLOO_SOCKET_IFNAME=eth0 here)",
          ifname_lo, hosts=True),
    Drill("port-in-use", "the master port is taken on the rendezvous host",
          r"EADDRINUSE",
          "pick a free --master-port (`ss -ltn` lists the ports in use), or stop the "
          "program holding it", port_in_use),
    Drill("failing-rank", "one rank raises; per-rank logs and @record's error file",
          r"error: the job failed: rank 1 exited with code 1 first, on host",
          "read the root cause's error file or its stderr.log; the other ranks' errors "
          "(connection closed, SIGTERM) follow from it", failing_rank),
]


# --- reporting ---------------------------------------------------------------------------------

def key_line(drill: Drill, output: str) -> str | None:
    """The line of the output the drill is about, shortened for one line."""
    for line in output.splitlines():
        if re.search(drill.expect, line):
            line = re.sub(r"^(error: torchrun: )?(\[rank\d+\]: )?", "", line.strip())
            line = re.sub(r"^\[[EWI]\d{4} [^\]]*\] (\[c10d\] )?", "", line)  # C++ log prefix
            line = re.sub(r"^torch\.distributed\.(elastic\.rendezvous\.api\.)?", "", line)
            line = re.sub(r"\[(enforce fail at )?/[^\]]*\.(cc|cpp|h|hpp):\d+\] ", "", line)
            return line if len(line) <= 400 else line[:397] + "..."
    return None


def last_error(output: str) -> str:
    lines = [line.strip() for line in output.splitlines()
             if re.search(r"(Error|error|Exception)\b", line)]
    return lines[-1][:200] if lines else "(no error line)"


def report(drill: Drill, o: Outcome) -> tuple[str, bool]:
    """(the drill's line, whether it ended as it should)."""
    if o.skipped:
        return f"{drill.name}: skipped: {o.skipped}", True
    seen = key_line(drill, o.output)
    took = f"exit {o.returncode} after {o.seconds:.1f} s"
    if seen and o.returncode not in (0, 124):
        return f'{drill.name}: {o.did} -> "{seen}" ({took}). Fix: {drill.fix}', True
    if o.returncode == 124:
        return (f"{drill.name}: {o.did} -> UNEXPECTED: still running at the drill's limit "
                f"(stopped after {o.seconds:.1f} s); last error: {last_error(o.output)}"), False
    return (f"{drill.name}: {o.did} -> UNEXPECTED ({took}): {last_error(o.output)}"), False


def run_drill(drill: Drill, settings: Settings) -> Outcome:
    if drill.hosts:
        reason = H.unavailable_reason()
        if reason:
            return Outcome(skipped=reason.split(";")[0] + " (this drill needs separate hosts)")
    try:
        return drill.run(settings)
    except H.HostsError as error:
        return Outcome(skipped=str(error))


def main() -> int:
    names = [d.name for d in DRILLS]
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=names, metavar="NAME",
                        help=f"run this drill only, showing its commands and output (repeat "
                             f"for several): {', '.join(names)}")
    parser.add_argument("--list", action="store_true", help="list the drills and stop")
    parser.add_argument("--timeout", type=int, default=5,
                        help="torch's timeouts in the drills, seconds (default 5)")
    parser.add_argument("--limit", type=float, default=90,
                        help="wall-clock limit of each drill, seconds (default 90)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="drills at once (default 1; they mostly wait for timeouts)")
    parser.add_argument("--log-dir", default="runs/lesson5_logs",
                        help="torchrun --log-dir of the failing-rank drill")
    args = parser.parse_args()
    if args.timeout < 1 or args.limit < 1 or args.jobs < 1:
        parser.error("--timeout, --limit and --jobs must be at least 1")
    if args.list:
        for d in DRILLS:
            print(f"{d.name:16} {d.summary}" + ("  (separate hosts)" if d.hosts else ""))
        return 0

    settings = Settings(default_torchrun(), args.timeout, args.limit,
                        os.path.abspath(args.log_dir))
    chosen = [d for d in DRILLS if not args.only or d.name in args.only]
    print(f"{len(chosen)} drill(s), torch timeouts {args.timeout} s, at most {args.limit:g} s "
          f"each, {args.jobs} at a time", flush=True)
    lock, good = threading.Lock(), []
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_drill, d, settings) for d in chosen]
        for drill, future in zip(chosen, futures, strict=True):  # printed in order
            outcome = future.result()
            line, ok = report(drill, outcome)
            with lock:
                if args.only:
                    for command in outcome.commands:
                        print(f"$ {command}")
                    for text in outcome.output.splitlines():
                        print(f"  | {text}")
                print(line)
                for detail in outcome.details:
                    print(f"  {detail}")
                sys.stdout.flush()
            good.append(ok)
    print(f"summary: drills={len(chosen)} as_expected={sum(good)} "
          f"unexpected={len(good) - sum(good)}")
    return 0 if all(good) else 1


if __name__ == "__main__":
    sys.exit(main())
