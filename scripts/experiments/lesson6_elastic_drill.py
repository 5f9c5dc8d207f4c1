"""Lesson 6 experiment: an elastic job loses a node, goes on smaller, and grows when it returns.

    make lesson6-elastic NPROC=1     # prints, then runs, the commands below

Two simulated nodes, A and B, each a torchrun agent with NPROC workers, start the same
command with --nnodes=1:2 (at least one node, at most two) and a c10d rendezvous:

    torchrun --nnodes=1:2 --nproc-per-node=NPROC --max-restarts=3 \\
        --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT --rdzv-id=elastic \\
        --rdzv-conf=last_call_timeout=5 \\
        scripts/lesson6_resumable.py ...

1. Both train together (world size 2 x NPROC).
2. Node B is lost: its agent and workers get SIGKILL, as when a machine dies. A's workers
   fail at their next collective; A's agent restarts them (one of its --max-restarts); the
   rendezvous closes with A alone (world size NPROC); they resume from the last snapshot.
3. Node B comes back (the same command again). A's agent sees a node waiting, stops its
   workers (this does not count as a restart) and both resume at world size 2 x NPROC.

Node A hosts the rendezvous store (it started first), so B is the one lost: a production job
keeps the endpoint on a machine that outlives the workers (or uses etcd).

On GPUs each node gets NPROC GPUs of its own, as separate machines would have; a machine with
fewer than 2 x NPROC runs both nodes on the CPU (gloo), and says so. A worker that fails where
none should (the agents report it) stops the drill at once, as does an agent that ends early.
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ddpcourse.cli import ArgumentParser
from ddpcourse.cluster.launch import default_torchrun, gpus_per_node, visible_gpu_count
from ddpcourse.events import read_events
from ddpcourse.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
# The agents log at INFO (LOGLEVEL below) so that the drill hears of a failed worker group the
# moment the agent does; their other INFO lines are not shown.
AGENT_INFO = re.compile(r"^I\d{4} ")
GROUP_FAILED = re.compile(r"Worker group (FAILED|UNHEALTHY)\. (\d+)/(\d+) attempts left")


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=1, help="workers per node")
    parser.add_argument("--epochs", type=int, default=30,
                        help="enough for node B to come back before the job ends")
    parser.add_argument("--out", default="runs/lesson6_elastic", help="folder for the run's files")
    parser.add_argument("--timeout", type=float, default=300, help="seconds for the whole drill")
    args = parser.parse_args()
    if not 1 <= args.nproc <= 4 or args.epochs < 4:
        parser.error("--nproc must be 1-4 and --epochs at least 4")
    return args


class Node:
    """One torchrun agent, its output printed line by line with the node's name."""

    def __init__(self, name, command, env):
        print(f"[node {name}] $ {' '.join(command)}", flush=True)
        self.name = name
        self.failures = []  # when the agent reported its worker group failed
        self.process = subprocess.Popen(command, cwd=ROOT, env=env, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.process.stdout:
            if "Warning: find_unused_parameters" in line:
                continue  # the step's choice (see its comment), noted by every worker it starts
            if failed := GROUP_FAILED.search(line):
                self.failures.append(time.time())
                line = (f"torchrun: a worker failed; the agent restarts the group "
                        f"({failed[2]} of {failed[3]} restarts left)\n")
            elif AGENT_INFO.match(line):
                continue
            print(f"[node {self.name}] {line}", end="", flush=True)

    def lose(self, events_path):
        """SIGKILL to the agent and every worker it started, as when the machine dies.

        The workers are the agent's children, and the event log names them too (each step
        logs the worker's pid and its agent's): a worker is killed even where the process
        tree hides it (the course's test suite starts processes from a fork server).
        """
        import psutil

        family = {e["pid"] for e in read_events(events_path)
                  if e.get("agent") == self.process.pid}
        try:
            agent = psutil.Process(self.process.pid)
            family |= {p.pid for p in agent.children(recursive=True)} | {agent.pid}
        except psutil.Error:
            pass
        for pid in family:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.process.wait()


def wait_for_store(port, deadline):
    """Until node A's agent listens at the rendezvous endpoint. B then has last_call_timeout
    (5 s) to join the first round, or A would start alone."""
    import socket

    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError("node A's agent never opened the rendezvous endpoint")


class DrillError(Exception):
    pass


def wait_for(path, deadline, test, what, alive=(), healthy=(), since=0.0):
    """The first event that passes `test`. Meanwhile the agent of each node in `alive` must
    keep running, and each node in `healthy` must also report no failed worker after `since`:
    else the drill ends at once."""
    while time.monotonic() < deadline:
        for event in read_events(path):
            if test(event):
                return event
        for node in {*alive, *healthy}:
            if node.process.poll() is not None:
                raise DrillError(f"node {node.name}'s agent ended (exit code "
                                 f"{node.process.returncode}) before {what}")
        for node in healthy:
            if any(t > since for t in node.failures):
                raise DrillError(f"a worker of node {node.name} failed before {what}, where "
                                 "none should")
        time.sleep(0.05)
    raise TimeoutError(f"the drill waited in vain for {what}")


def main():
    args = parse_args()
    out = Path(ROOT, args.out)
    out.mkdir(parents=True, exist_ok=True)
    events = out / "events.jsonl"
    for old in (events, out / "snapshot.pt", out / "snapshot.pt.prev"):
        old.unlink(missing_ok=True)
    port, big, small = free_port(), 2 * args.nproc, args.nproc
    command = [default_torchrun(), "--nnodes=1:2", f"--nproc-per-node={args.nproc}",
               "--max-restarts=3", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
               f"--rdzv-id=elastic{port}",
               "--rdzv-conf=last_call_timeout=5",
               "scripts/lesson6_resumable.py", "--epochs", str(args.epochs),
               "--snapshot-every", "3", "--snapshot", str(out / "snapshot.pt"),
               "--checkpoint", str(out / "final.pt"), "--events", str(events)]
    # OMP: the cores shared out; TORCH_DISABLE_SHARE_RDZV_TCP_STORE: see the kill drill.
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
               LOGLEVEL="INFO")
    gpus = visible_gpu_count(env)
    devices = ["", ""]  # CUDA_VISIBLE_DEVICES of nodes A and B: none, the CPU with gloo
    if gpus >= big:
        devices = gpus_per_node(env, gpus, args.nproc, 2)
    elif gpus:
        print(f"note: nodes A and B need {big} GPUs ({args.nproc} each, one per worker) and "
              f"this machine has {gpus}: both run on the CPU with gloo instead", flush=True)
    env_a, env_b = (dict(env, CUDA_VISIBLE_DEVICES=d) for d in devices)
    deadline = time.monotonic() + args.timeout
    nodes = []
    try:
        print(f"== 1. nodes A and B start: world size {big}", flush=True)
        nodes.append(Node("A", command, env_a))
        wait_for_store(port, deadline)  # A first: its agent hosts the rendezvous store
        nodes.append(Node("B", command, env_b))
        wait_for(events, deadline, lambda e: e["world_size"] == big and e["step"] >= 5,
                 f"step 5 at world size {big}", healthy=nodes)

        print("\n== 2. node B is lost (SIGKILL to its agent and workers); A goes on alone",
              flush=True)
        lost_at = time.time()
        nodes[1].lose(events)
        # A's workers fail at their next collective, as they should: its agent must live on.
        shrunk = wait_for(events, deadline, lambda e: e["world_size"] == small
                          and e["time"] > lost_at and e["rank"] == 0,
                          f"a step at world size {small}", alive=nodes[:1])

        print("\n== 3. node B comes back: the same command", flush=True)
        back_at = time.time()
        nodes.append(Node("B", command, env_b))
        grown = wait_for(events, deadline, lambda e: e["world_size"] == big
                         and e["time"] > back_at and e["rank"] == 0,
                         f"a step at world size {big} after node B's return",
                         healthy=[nodes[0], nodes[2]], since=back_at)
        for node in (nodes[0], nodes[2]):
            node.process.wait(timeout=max(1.0, deadline - time.monotonic()))
    except (DrillError, TimeoutError, subprocess.TimeoutExpired) as error:
        sys.exit(f"error: {error}; the output above shows where the job stopped")
    finally:
        for node in nodes:
            if node.process.poll() is None:
                node.lose(events)
    codes = [nodes[0].process.returncode, nodes[2].process.returncode]
    if codes != [0, 0]:
        sys.exit(f"error: the nodes' agents ended with exit codes {codes}")

    log = [e for e in read_events(events) if e["rank"] == 0]
    sizes = []
    for e in log:
        if not sizes or sizes[-1][0] != e["world_size"]:
            sizes.append([e["world_size"], e["step"], e["step"]])
        else:
            sizes[-1][2] = e["step"]
    print("\n== what happened, from the run's event log")
    print("world size by step: " + ", then ".join(
        f"{w} for steps {a}-{b}" for w, a, b in sizes))
    print(f"shrink: {shrunk['time'] - lost_at:.1f} s from the lost node to a step at world "
          f"size {small}, resumed from step {shrunk['step'] - 1}")
    print(f"grow:   {grown['time'] - back_at:.1f} s from the returning node to a step at world "
          f"size {big}, resumed from step {grown['step'] - 1}")
    print(f"done: both agents finished; final weights in {out / 'final.pt'}")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stopped: clean up the nodes
    main()
