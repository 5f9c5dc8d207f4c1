"""Lesson 5 experiment: what torchrun hands every process, and three ways to join one world.

    make lesson5 NNODES=2 NPROC=2     # static launch: each agent is told its --node-rank
    torchrun --nnodes=2 --node-rank=0 --nproc-per-node=2 --master-addr=127.0.0.1 \
        --master-port=29500 scripts/experiments/lesson5_env.py   # and again with --node-rank=1
    torchrun --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:29400 \
        --rdzv-id=job1 scripts/experiments/lesson5_env.py                       # on each node
    ... scripts/experiments/lesson5_env.py --init tcp   # or --init file: joined another way

A probe, like lesson1_whoami.py: every process reports every variable the launcher set, rank 0
says how the agents were started (static or c10d rendezvous), and the world is joined with a
choice of init_method:

    env://                 reads MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE (the default)
    tcp://ADDR:PORT        rank 0 hosts a store at ADDR:PORT; rank and world_size passed in
    file:///PATH           a file every process can open (a shared file system across nodes)
"""

import gc
import os
import socket
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ddpcourse.cli import ArgumentParser
from ddpcourse.report import format_table, summary_line
from ddpcourse.runtime import pick_device, world_of_one_unless_launched

# What torchrun's agent puts in a worker's environment (torch 2.14,
# torch/distributed/elastic/agent/server/local_elastic_agent.py, _start_workers). It also
# sets ROLE_NAME ("default"), TORCHELASTIC_ERROR_FILE (see lesson5_failing_rank.py),
# TORCH_NCCL_ASYNC_ERROR_HANDLING=1, and OMP_NUM_THREADS when it starts several processes.
PER_PROCESS = ["RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK"]
SHARED = {  # name: what it means
    "WORLD_SIZE": "processes in the job",
    "LOCAL_WORLD_SIZE": "processes on this node (--nproc-per-node)",
    "GROUP_WORLD_SIZE": "nodes, i.e. agents (--nnodes)",
    "ROLE_WORLD_SIZE": "processes of this role (one role: the world size)",
    "MASTER_ADDR": "host of the store the workers meet at (env:// reads it)",
    "MASTER_PORT": "its port",
    "TORCHELASTIC_RUN_ID": "--rdzv-id (a static launch without one: none)",
    "TORCHELASTIC_RESTART_COUNT": "restarts so far (lesson 6)",
    "TORCHELASTIC_MAX_RESTARTS": "--max-restarts",
    "TORCHELASTIC_USE_AGENT_STORE": "True: the agent already serves MASTER_ADDR:MASTER_PORT",
}


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--init", default="env",
                        help="how init_process_group finds the others: env, tcp or file, or "
                             "several in turn, e.g. env,tcp,file (default env)")
    parser.add_argument("--init-port", type=int, default=None,
                        help="--init tcp: the port rank 0 listens on (default MASTER_PORT + 1; "
                             "MASTER_PORT itself is the launcher's store)")
    parser.add_argument("--init-file", default=None,
                        help="--init file: a path every process can reach and that does not "
                             "exist yet (default runs/lesson5_init_<MASTER_PORT>)")
    parser.add_argument("--timeout", type=float, default=60,
                        help="seconds init_process_group and collectives may wait")
    args = parser.parse_args()
    args.init = [word.strip() for word in args.init.split(",")]
    if not args.init or set(args.init) - {"env", "tcp", "file"}:
        parser.error(f"--init takes env, tcp or file (or a comma-separated list of them), "
                     f"not {','.join(args.init)!r}")
    if args.timeout <= 0:
        parser.error("--timeout must be a positive number of seconds")
    if args.init_port is not None and not 1 <= args.init_port <= 65535:
        parser.error("--init-port must be between 1 and 65535")
    return args


def host_address() -> str:
    """The address this machine's name resolves to here (on separate hosts: each its own)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "?"


def agent_command() -> list[str]:
    """The command line of this process's parent: the torchrun agent that started it."""
    try:
        import psutil

        return psutil.Process(os.getppid()).cmdline()
    except Exception:  # no psutil, or not allowed to look: the report says "unknown"
        return []


def option(argv: list[str], name: str) -> str | None:
    """The value of torchrun option --name in argv (either spelling, = or a separate word)."""
    spellings = {f"--{name}", f"--{name.replace('-', '_')}"}
    for i, word in enumerate(argv):
        key, _, value = word.partition("=")
        if key in spellings:
            return value if value else (argv[i + 1] if i + 1 < len(argv) else "")
        if not word.startswith("-") and i > 0 and word.endswith(".py"):
            break  # the script's own arguments follow
    return None


def describe_launch(argv: list[str], master: str) -> str:
    """Two lines: how the agents met, and where the workers' store (MASTER_ADDR:PORT) is."""
    if not argv:
        return "launch: unknown (cannot read the agent's command line)"
    if "--standalone" in argv:
        return ("launch: --standalone: a c10d rendezvous on this machine at a free port\n"
                f"store: the agent's, at {master}")
    backend = option(argv, "rdzv-backend") or "static"
    if backend == "static":
        return ("launch: static rendezvous: each agent was told its node rank (--node-rank)\n"
                f"store: node 0's agent hosts it at {master} (--master-addr:--master-port); "
                "the workers use that same store")
    endpoint = option(argv, "rdzv-endpoint") or "?"
    run_id = option(argv, "rdzv-id") or "none"
    return (f"launch: {backend} rendezvous at {endpoint}, run id {run_id}, no --node-rank: the "
            "rendezvous numbered the agents, sorted by host name, then pid\n"
            f"store: node 0's agent opened a new one for the workers at {master}, not at the "
            f"rendezvous endpoint {endpoint}")


def join(method: str, args, rank: int, world_size: int, backend: str,
         timeout: timedelta) -> str:
    """init_process_group with one of the three init methods; returns the URL it used."""
    if method == "env":
        # Reads MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE from the environment.
        init_method = "env://"
        dist.init_process_group(backend, init_method=init_method, timeout=timeout)
    elif method == "tcp":
        # Rank 0 opens a store at ADDR:PORT and the others connect to it. Nothing is read
        # from the environment, so rank and world size are passed in. ADDR must be rank 0's
        # machine: node 0's, which MASTER_ADDR names.
        port = args.init_port or int(os.environ["MASTER_PORT"]) + 1
        # older torch (2.11 was seen to) took any tcp:// address for the agent's store
        os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        init_method = f"tcp://{os.environ['MASTER_ADDR']}:{port}"
        dist.init_process_group(backend, init_method=init_method, rank=rank,
                                world_size=world_size, timeout=timeout)
    else:
        # Every process opens the same file and they meet in it: on several nodes it must be
        # on a file system they all share (NFS, say), and it must not exist yet.
        path = os.path.abspath(args.init_file or f"runs/lesson5_init_{os.environ['MASTER_PORT']}")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        init_method = f"file://{path}"
        dist.init_process_group(backend, init_method=init_method, rank=rank,
                                world_size=world_size, timeout=timeout)
    return init_method


def print_world(reports: list[dict], launched: bool) -> None:
    """Rank 0: how the job was launched, every process's variables, the shared ones once."""
    shared = reports[0]["shared"]
    master = f"{shared['MASTER_ADDR']}:{shared['MASTER_PORT']}"
    print(describe_launch(reports[0]["agent"], master) if launched else
          "launch: none (a world of one; the launcher's variables were filled in)")
    # A shared variable whose value differs between processes goes in the table too.
    differ = [name for name in SHARED if len({r["shared"][name] for r in reports}) > 1]
    rows = [{**{k: v for k, v in r.items() if k not in ("shared", "agent")},
             **{name: r["shared"][name] for name in differ}} for r in reports]
    print(format_table(rows))
    print(f"the same in all {len(reports)} process(es):")
    width = max(len(name) for name in SHARED)
    for name, meaning in SHARED.items():
        if name not in differ:
            print(f"  {name.ljust(width)}  {shared[name]:<12} {meaning}")
    agents = sorted({(int(r["GROUP_RANK"]), r["agent pid"], r["host"], r["address"])
                     for r in reports})
    if launched:
        print("nodes: " + ", ".join(f"node {n} = agent {pid} on {host} ({address})"
                                    for n, pid, host, address in agents))


def main():
    args = parse_args()
    started = time.perf_counter()
    launched = world_of_one_unless_launched()

    given = {name: os.environ.get(name, "(unset)") for name in PER_PROCESS + list(SHARED)}
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1"))

    device, backend = pick_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=args.timeout)
    first = None
    for method in args.init:  # one world after the other: joined, used, left
        init_method = join(method, args, rank, world_size, backend, timeout)
        report = {
            "rank": dist.get_rank(),
            "host": socket.gethostname(),
            "address": host_address(),
            "pid": os.getpid(),
            "agent pid": os.getppid() if launched else "-",
            **{name: given[name] for name in PER_PROCESS},
            "shared": {name: given[name] for name in SHARED},
            "agent": agent_command() if launched else [],
        }
        reports = [None] * world_size if rank == 0 else None
        dist.gather_object(report, reports, dst=0)  # every rank calls it; rank 0 gets them

        if rank == 0:
            if first is None:
                print_world(reports, launched)
                first = reports
            ranks_match = all(r["rank"] == int(r["RANK"]) for r in reports)
            same = [r["pid"] for r in reports] == [r["pid"] for r in first]
            passed = "" if method == "env" else " (rank and world_size passed in)"
            print(f"check: init_method={init_method!r}{passed} joined "
                  f"{'the same' if same else 'A DIFFERENT'} world of {dist.get_world_size()}: "
                  f"dist.get_rank() {'==' if ranks_match else '!='} RANK in every process",
                  flush=True)
        dist.destroy_process_group()
        # The file store deletes its file when the last process lets go of it: now, not when
        # the collector happens to free a store still held in a reference cycle (or never,
        # if that is at exit: the file was seen left behind once in a few full test runs).
        gc.collect()
    if rank == 0:
        print(summary_line(world_size=world_size, nodes=nodes, init=",".join(args.init),
                           backend=backend, wall_s=round(time.perf_counter() - started, 2)))


if __name__ == "__main__":
    main()
