"""The error messages of lessons/errors.md, each made on purpose, in seconds, on the CPU.

    python scripts/experiments/error_index.py --list         # the entries, what each does
    python scripts/experiments/error_index.py no-group       # one entry: its error, in one line
    python scripts/experiments/error_index.py all            # every entry, one line each

Each entry plants one mistake and ends with the error it causes, printed in one line:

    NAME: what was done -> the error (Class: message) (how long it took)

An entry that needs several processes starts its own job: 2 processes of this machine
(torch.multiprocessing, forked on Linux), a gloo process group on a free port of 127.0.0.1
with a timeout of 2 s, and a wall-clock limit of 30 s on the whole job. The entries that need
a launcher run torchrun or torch.distributed.launch on a tiny script written to a temporary
folder. The two shared-memory entries run in a mount namespace of their own (Linux: as root,
or else inside a user namespace) whose /dev/shm is a 1 MiB tmpfs; where neither can be made
they are skipped, saying why. The exit status is 0 when every entry ended with its error (or
was skipped), 1 otherwise. tests/project/test_error_index.py runs them all and checks each
line against the page.
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

# The entries run on the CPU, one thread per process, whatever the machine has.
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  before any group exists (appendix: a clean exit)
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpcourse.cli import ArgumentParser
from ddpcourse.cluster.launch import default_torchrun
from ddpcourse.ports import free_port

GROUP_TIMEOUT_S = 2.0   # every process group's timeout
JOB_LIMIT_S = 30.0      # every job's wall-clock limit
START = "fork" if sys.platform == "linux" else "spawn"
SKIPPED = "SKIPPED: "


def one_line(error: BaseException, expect: str) -> str:
    """`Class: message` on one line: of the exception in the chain (its causes) whose message
    holds `expect`, and of that message the line that holds it; C++ source paths left out."""
    chain, seen = [], error
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    chosen = next((e for e in chain if re.search(expect, str(e))), error)
    lines = [line.strip() for line in str(chosen).splitlines() if line.strip()] or [""]
    line = next((x for x in lines if re.search(expect, x)), lines[0])
    line = re.sub(r"\[(enforce fail at )?/[^\]]*\.(cc|cpp|h|hpp):\d+\] ", "", line)
    line = re.sub(r"^(\w+(\.\w+)*Error|Exception): ", "", line)  # a worker's re-raised line
    return f"{type(chosen).__name__}: {line if len(line) <= 300 else line[:297] + '...'}"


# --- jobs of several processes ------------------------------------------------------------

def _rank_main(rank: int, world: int, port: int, body: Callable, expect: str, reports,
               debug: str) -> None:
    """One process of a job: join the group, run `body(rank, world)`, report how it ended."""
    torch.set_num_threads(1)
    if debug:
        # torch reads TORCH_DISTRIBUTED_DEBUG when torch.distributed is imported; this process
        # was forked after that, so it reads it again (a new process reads it by itself).
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = debug
        dist.set_debug_level_from_env()
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=GROUP_TIMEOUT_S))
        body(rank, world)
        reports.put((rank, ""))
    except Exception as error:  # the error the entry is about, or one that follows from it
        reports.put((rank, one_line(error, expect)))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def job(body: Callable, expect: str, world: int = 2, debug: str = "") -> str:
    """Run `body(rank, world)` (a module-level function) on `world` processes; the error that
    the entry is about: the first rank's error that matches `expect`, else the first rank's
    error, else "". A rank that dies is left to die: the others report what they saw."""
    reports = mp.get_context(START).SimpleQueue()
    context = mp.start_processes(_rank_main, nprocs=world, join=False, start_method=START,
                                 args=(world, free_port(), body, expect, reports, debug))
    deadline = time.monotonic() + JOB_LIMIT_S
    for process in context.processes:
        process.join(timeout=max(0.0, deadline - time.monotonic()))
    late = [rank for rank, process in enumerate(context.processes) if process.is_alive()]
    for process in context.processes:
        if process.is_alive():
            process.kill()
            process.join()
    found = []
    while not reports.empty():
        found.append(reports.get())
    errors = sorted((rank, text) for rank, text in found if text)
    chosen = next(((r, t) for r, t in errors if re.search(expect, t)),
                  errors[0] if errors else None)
    if chosen:
        return f"rank {chosen[0]}: {chosen[1]}"
    return f"TIMEOUT: rank(s) {late} still running after {JOB_LIMIT_S:g} s" if late else ""


def needs_dynamo() -> None:
    """DDP's constructor imports torch's compiler, dynamo (about 3 s of CPU): have it imported
    once, here, before the processes are forked, instead of once in each of them (its public
    reset imports it, and has nothing to clear yet)."""
    torch.compiler.reset()


class Net(torch.nn.Module):
    """A tiny model: `body`, and an extra head, `aux`, used only where `use_aux` says."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(8, 8)
        self.aux = torch.nn.Linear(8, 8)
        self.num_classes = 8  # an attribute of the model, not of DDP

    def forward(self, x, use_aux=False):
        h = self.body(x)
        return h + self.aux(h) if use_aux else h


def train(model, steps: int, use_aux=lambda step: False) -> None:
    for step in range(steps):
        model(torch.randn(4, 8), use_aux=use_aux(step)).sum().backward()


# --- starting a job -------------------------------------------------------------------------

def no_group() -> str:
    try:
        dist.all_reduce(torch.ones(1))
    except ValueError as error:
        return one_line(error, "Default process group")
    return ""


def no_launcher() -> str:
    saved = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
             if k in os.environ}
    try:
        dist.init_process_group("gloo", timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    except ValueError as error:
        return one_line(error, "RANK expected")
    finally:
        os.environ.update(saved)
    return ""


def launched(folder: str, script: str, launcher: list[str]) -> str:
    """Write `script` as folder/train.py, run `launcher` on it (at most JOB_LIMIT_S) on 2
    processes; all it printed."""
    path = os.path.join(folder, "train.py")
    with open(path, "w") as f:
        f.write(textwrap.dedent(script))
    command = [*launcher, "--nnodes=1", "--nproc-per-node=2", "--master-addr=127.0.0.1",
               f"--master-port={free_port()}", path]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=JOB_LIMIT_S)
    except subprocess.TimeoutExpired:
        return f"TIMEOUT: still running after {JOB_LIMIT_S:g} s"
    return done.stdout + done.stderr


def local_rank() -> str:
    with tempfile.TemporaryDirectory() as folder:
        output = launched(folder, """\
            import argparse
            parser = argparse.ArgumentParser()
            parser.add_argument("--epochs", type=int, default=1)
            args = parser.parse_args()
            """, [sys.executable, "-m", "torch.distributed.launch"])
    line = next((x.strip() for x in output.splitlines()
                 if "unrecognized arguments: --local-rank" in x), "")
    if line and "ChildFailedError" in output:
        return f"{line} (then the launcher: ChildFailedError)"
    return line


def child_failed() -> str:
    with tempfile.TemporaryDirectory() as folder:
        output = launched(folder, """\
            import os, time
            if os.environ["RANK"] == "1":
                raise RuntimeError("rank 1 met a batch it cannot handle")
            time.sleep(20)  # rank 0 waits for rank 1, as in a collective
            """, [default_torchrun()])
    if "ChildFailedError" not in output or "Root Cause" not in output:
        return ""
    root = output.split("Root Cause")[-1]  # torchrun's report of the first rank to fail

    def field(name: str) -> str:
        found = re.search(rf"^\s*{name}\s*: (.*)$", root, re.M)
        return " ".join(found.group(1).split()) if found else "?"

    return (f"ChildFailedError: root cause: rank {field('rank')}, exitcode {field('exitcode')}, "
            f"error_file: {field('error_file')}, traceback: {field('traceback')}")


def address_in_use() -> str:
    port = free_port()
    first = dist.TCPStore("127.0.0.1", port, 1, True, timedelta(seconds=GROUP_TIMEOUT_S))
    try:
        dist.TCPStore("127.0.0.1", port, 1, True, timedelta(seconds=GROUP_TIMEOUT_S))
    except RuntimeError as error:
        return one_line(error, "EADDRINUSE")
    finally:
        del first
    return ""


def wrong_port() -> str:
    try:  # 1 s: the client tries twice before it gives up
        dist.TCPStore("127.0.0.1", free_port(), 2, False, timedelta(seconds=1))
    except RuntimeError as error:
        return one_line(error, "client socket has timed out")
    return ""


# --- DDP ----------------------------------------------------------------------------------

def ddp_attribute_body(rank, world):
    model = DDP(Net())
    print(f"rank {rank}: {model.num_classes} classes")  # the model's attribute, not DDP's


def ddp_attribute() -> str:
    needs_dynamo()
    return job(ddp_attribute_body, "object has no attribute")


def unused_parameter_body(rank, world):
    train(DDP(Net()), steps=3)  # aux is never used


def unused_parameter() -> str:
    needs_dynamo()
    return job(unused_parameter_body, "Expected to have finished reduction")


def graph_changed_body(rank, world):
    train(DDP(Net(), static_graph=True), steps=3, use_aux=lambda step: step % 2 == 1)


def graph_changed() -> str:
    needs_dynamo()
    return job(graph_changed_body, "training graph has changed")


class Checkpointed(torch.nn.Module):
    """Two layers, the second under reentrant activation checkpointing."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(8, 8)
        self.second = torch.nn.Linear(8, 8)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.second, self.first(x), use_reentrant=True)


def ready_twice_body(rank, world):
    model = DDP(Checkpointed(), find_unused_parameters=True)
    for _ in range(2):
        model(torch.randn(4, 8)).sum().backward()


def ready_twice() -> str:
    needs_dynamo()
    return job(ready_twice_body, "mark a variable ready only once")


def first_bucket_body(rank, world):
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    # backend="eager": dynamo's DDP optimizer raises before any backend compiles, so inductor's
    # C++ compiler is not needed to see the error (the default backend fails the same way).
    compiled = torch.compile(DDP(model, bucket_cap_mb=0.1), backend="eager")
    compiled(torch.randn(4, 64)).sum().backward()


def first_bucket() -> str:
    needs_dynamo()
    return job(first_bucket_body, "First bucket should be", world=1)


# --- collectives --------------------------------------------------------------------------

def timeout_body(rank, world):
    if rank == 0:
        dist.all_reduce(torch.ones(1))
    else:
        time.sleep(GROUP_TIMEOUT_S + 1)  # never calls the all_reduce


def timeout() -> str:
    return job(timeout_body, "Timed out")


def peer_died_body(rank, world):
    if rank == 1:
        os._exit(1)  # a crash: no exception, no goodbye
    time.sleep(0.5)
    dist.all_reduce(torch.ones(1))


def peer_died() -> str:
    return job(peer_died_body, "Connection closed by peer")


def mismatch_body(rank, world):
    if rank == 0:
        dist.all_reduce(torch.ones(1))
    else:
        dist.barrier()


def mismatch() -> str:
    return job(mismatch_body, "Detected mismatch between collectives", debug="DETAIL")


def all_gather_shapes_body(rank, world):
    mine = torch.ones(2 + rank)  # rank 0: 2 values, rank 1: 3
    gathered = [torch.zeros(2 + r) for r in range(world)]  # even with the right shapes
    dist.all_gather(gathered, mine)


def all_gather_shapes() -> str:
    return job(all_gather_shapes_body, "invalid tensor size")


# --- a small /dev/shm ---------------------------------------------------------------------

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_REC, MS_PRIVATE = 0x4000, 0x40000


def private_small_shm() -> str:
    """In this (forked, single-threaded) process: a mount namespace of its own, nothing in it
    shared with the machine's, and a 1 MiB tmpfs on /dev/shm. "" when made, else why not."""
    libc = ctypes.CDLL(None, use_errno=True)

    def failed(what: str) -> str:
        return f"{what}: {os.strerror(ctypes.get_errno())}"

    if libc.unshare(CLONE_NEWNS) != 0:  # as root (CAP_SYS_ADMIN)
        uid, gid = os.getuid(), os.getgid()
        if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:  # without root: a user namespace
            return failed("unshare(CLONE_NEWNS), then with CLONE_NEWUSER")
        for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"),
                           ("gid_map", f"0 {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return failed("making / private")
    if libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", 0, b"size=1m") != 0:
        return failed("mounting a 1 MiB tmpfs on /dev/shm")
    return ""


def small_shm_loader(dataset, expect: str) -> str:
    """Iterate a DataLoader with one worker, in a child process whose /dev/shm is 1 MiB:
    the error (one line), or SKIPPED and why where the namespace cannot be made."""
    if sys.platform != "linux":
        return SKIPPED + "mount namespaces are Linux's"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own /dev/shm, then the loader
        os.close(read)
        why = private_small_shm()
        text = SKIPPED + why if why else ""
        if not why:
            batches = iter(torch.utils.data.DataLoader(dataset, batch_size=2, num_workers=1,
                                                       multiprocessing_context="fork"))
            try:
                for _ in batches:
                    pass
            except Exception as error:
                text = one_line(error, expect)
            del batches  # stops the worker now (it holds the pipe too), not at its next check
        os.write(write, text.encode() + b"\n")
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        text = pipe.readline().decode().strip()
    os.waitpid(pid, 0)
    return text


class BigSamples(torch.utils.data.Dataset):
    """4 samples of 4 MiB each: a batch of 2 does not fit a 1 MiB /dev/shm."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.ones(1024, 1024)


class CacheInShm(torch.utils.data.Dataset):
    """Each sample is first written to a 4 MiB file in /dev/shm (a cache that processes
    share, as lesson 7's shared dataset keeps one there), then read back."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        cache = torch.from_file(f"/dev/shm/error_index_{os.getpid()}_{i}", shared=True,
                                size=1024 * 1024)
        cache.fill_(1.0)  # writing past what the tmpfs holds
        return cache[:4].clone()


def shm_full() -> str:
    return small_shm_loader(BigSamples(), "unable to allocate shared memory")


def bus_error() -> str:
    return small_shm_loader(CacheInShm(), "Bus error")


# --- running them -------------------------------------------------------------------------

@dataclass
class Entry:
    name: str
    does: str                 # the mistake, for the entry's line and --list
    run: Callable[[], str]    # the error, one line ("" for none; SKIPPED + why)
    expect: str               # a regex the error must match for the entry to end as it should


ENTRIES = [
    Entry("no-group", "dist.all_reduce in a process that never called init_process_group",
          no_group, r"ValueError: Default process group has not been initialized"),
    Entry("no-launcher", 'init_process_group("gloo") in a script started by plain python',
          no_launcher, r"ValueError: .*environment variable RANK expected"),
    Entry("local-rank", "python -m torch.distributed.launch --nproc-per-node=2 train.py; "
          "train.py parses its options with argparse and has no --local-rank",
          local_rank, r"unrecognized arguments: --local-rank"),
    Entry("child-failed", "torchrun --nproc-per-node=2 train.py; rank 1 raises, and train.py "
          "has no @record", child_failed, r"ChildFailedError: .*error_file: <N/A>"),
    Entry("address-in-use", "a second store server on the port the first one listens on "
          "(two jobs given the same MASTER_PORT)", address_in_use,
          r"DistNetworkError: .*EADDRINUSE"),
    Entry("wrong-port", "a store client for a port that nothing listens on (a wrong "
          "MASTER_PORT), timeout 1 s", wrong_port,
          r"DistNetworkError: .*client socket has timed out"),
    Entry("ddp-attribute", "model = DDP(Net()), then model.num_classes (an attribute of Net)",
          ddp_attribute, r"AttributeError: 'DistributedDataParallel' object has no attribute"),
    Entry("unused-parameter", "DDP(Net()), 3 steps; Net's aux head is never used",
          unused_parameter,
          r"RuntimeError: Expected to have finished reduction in the prior iteration"),
    Entry("graph-changed", "DDP(Net(), static_graph=True), 3 steps; aux used on odd steps only",
          graph_changed, r"RuntimeError: Your training graph has changed"),
    Entry("ready-twice", "DDP(model, find_unused_parameters=True); a layer of the model under "
          "checkpoint(use_reentrant=True)", ready_twice,
          r"RuntimeError: Expected to mark a variable ready only once"),
    Entry("first-bucket", "torch.compile(DDP(model, bucket_cap_mb=0.1)), one process",
          first_bucket, r"AssertionError: First bucket should be"),
    Entry("timeout", "rank 0 calls all_reduce, rank 1 never does; group timeout 2 s",
          timeout, r"RuntimeError: .*Timed out waiting \d+ms"),
    Entry("peer-died", "rank 1 dies (os._exit) while rank 0 calls all_reduce",
          peer_died, r"RuntimeError: .*Connection closed by peer"),
    Entry("mismatch", "TORCH_DISTRIBUTED_DEBUG=DETAIL; rank 0 calls all_reduce, rank 1 barrier",
          mismatch, r"RuntimeError: Detected mismatch between collectives"),
    Entry("all-gather-shapes", "all_gather of 2 values on rank 0 and 3 on rank 1",
          all_gather_shapes, r"RuntimeError: .*invalid tensor size"),
    Entry("shm-full", "a DataLoader worker's batch of 8 MiB, /dev/shm of 1 MiB",
          shm_full, r"RuntimeError: .*unable to allocate shared memory"),
    Entry("bus-error", "a DataLoader worker writes a 4 MiB file in a /dev/shm of 1 MiB",
          bus_error, r"RuntimeError: .*killed by signal: Bus error"),
]


def run_entry(entry: Entry) -> bool:
    """Run one entry and print its line; whether it ended as it should."""
    started = time.monotonic()
    try:
        error = entry.run()
    except Exception as broke:  # the entry itself broke: say so, and go on with the others
        error = f"the entry itself raised {one_line(broke, '')}"
    if error.startswith(SKIPPED):
        print(f"{entry.name}: skipped: {error.removeprefix(SKIPPED)}", flush=True)
        return True
    ok = bool(re.search(entry.expect, error))
    print(f"{entry.name}: {entry.does} -> {'' if ok else 'UNEXPECTED: '}"
          f"{error or 'no error at all'} ({time.monotonic() - started:.1f} s)", flush=True)
    return ok


def main() -> int:
    names = [e.name for e in ENTRIES]
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("entries", nargs="*", metavar="ENTRY",
                        help=f"the entries to run, or all: {', '.join(names)}")
    parser.add_argument("--list", action="store_true", help="list the entries and stop")
    args = parser.parse_args()
    if args.list:
        for entry in ENTRIES:
            print(f"{entry.name:18} {entry.does}")
        return 0
    wanted = names if "all" in args.entries else args.entries
    unknown = sorted(set(wanted) - set(names))
    if not wanted or unknown:
        parser.error(f"name the entries to run, or all ({', '.join(names)}); "
                     f"{'unknown: ' + ', '.join(unknown) if unknown else 'none given'}")
    return 0 if all([run_entry(e) for e in ENTRIES if e.name in wanted]) else 1


if __name__ == "__main__":
    sys.exit(main())
