"""Start a lesson script with torchrun: check the arguments, print the exact command, run it.

`make lessonN NPROC=k NNODES=n` calls this. It only uses the standard library, so bad
arguments are reported before the course environment is even built.

One node:   torchrun --nnodes=1 --nproc-per-node=k --master-addr=127.0.0.1 --master-port=P script
n nodes:    the same command n times with --node-rank=0..n-1, all on this machine, which is
            how a multi-node job is simulated: each torchrun is one "node" agent.
--rdzv c10d (or RDZV=c10d): the same command n times, --rdzv-backend=c10d
            --rdzv-endpoint=127.0.0.1:P --rdzv-id=jobP and no --node-rank: the agents meet at
            the endpoint and the rendezvous numbers them (lesson 5).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from ddpcourse.ports import free_port

MAX_NPROC = 64
MAX_NNODES = 16


class LaunchError(Exception):
    """A problem with the launch request, reported as one line."""


def positive_int(name: str, text: str, limit: int) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise LaunchError(f"{name}={text!r} is not a whole number; use e.g. {name}=2") from None
    if not 1 <= value <= limit:
        raise LaunchError(f"{name}={value} is out of range; it must be between 1 and {limit}")
    return value


def check_port_free(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise LaunchError(
                f"port {port} is already in use on 127.0.0.1; pick another PORT or leave it "
                "unset to get a free one"
            ) from None


def visible_gpu_count(environ: dict | None = None) -> int:
    """GPUs visible under `environ` (default: ours), without importing torch (nvidia-smi)."""
    visible = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return 0
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    count = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    if visible:
        count = min(count, len([d for d in visible.split(",") if d.strip()]))
    return count


def gpus_per_node(env: dict, gpus: int, nproc: int, nodes: int) -> list[str]:
    """CUDA_VISIBLE_DEVICES for each of `nodes` simulated nodes that share this machine's
    `gpus` visible GPUs, `nproc` each: its own GPUs, as a real node would have, so that
    cuda:LOCAL_RANK on node 1 is not node 0's GPU too. The caller checks there are enough."""
    ids = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    ids = ids or [str(i) for i in range(gpus)]
    return [",".join(ids[n * nproc:(n + 1) * nproc]) for n in range(nodes)]


def torchrun_commands(
    script: str,
    script_args: list[str],
    nproc: int,
    nnodes: int,
    port: int,
    torchrun: str = "torchrun",
    rdzv: str = "static",
    torchrun_args: list[str] | None = None,
) -> list[list[str]]:
    """One torchrun command per simulated node.

    static: node 0 (--node-rank=0) hosts the store at --master-addr:--master-port.
    c10d: every node runs the same command; they meet at --rdzv-endpoint, whose store one of
    them hosts, and the rendezvous gives out the node ranks.
    """
    commands = []
    for node_rank in range(nnodes):
        cmd = [torchrun, f"--nnodes={nnodes}"]
        if rdzv == "c10d":
            cmd += [f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
                    f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=job{port}"]
        else:
            if nnodes > 1:
                cmd.append(f"--node-rank={node_rank}")
            cmd += [f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1",
                    f"--master-port={port}"]
        cmd += [*(torchrun_args or []), script, *script_args]
        commands.append(cmd)
    return commands


RDZV_BACKENDS = ("static", "c10d")


def check_rdzv(rdzv: str) -> None:
    if rdzv not in RDZV_BACKENDS:
        raise LaunchError(f"RDZV={rdzv!r} is not a rendezvous the course launches; use static "
                          "(--node-rank, --master-addr, --master-port) or c10d")


def default_torchrun() -> str:
    """The torchrun next to this Python (the course's .venv), else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "torchrun")
    return beside if os.path.exists(beside) else "torchrun"


def _kill(procs: list[subprocess.Popen], grace: float = 5.0) -> None:
    """Stop torchrun agents and their workers.

    torchrun starts each worker in a session of its own, so killing an agent's process group
    does not reach them. We ask the agents first (SIGTERM: they stop their workers), then
    kill whatever is left, workers included.
    """
    alive = [p for p in procs if p.poll() is None]
    if not alive:
        return
    try:
        import psutil

        workers = [c for p in alive for c in _children(psutil, p.pid)]
    except ImportError:  # psutil is in requirements.txt; without it we rely on the agents
        workers = []
    for p in alive:
        _signal_group(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in alive:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(p.pid, signal.SIGKILL)
            p.wait()
    for w in workers:
        try:
            w.kill()
        except Exception:  # already gone
            pass


def _children(psutil, pid: int) -> list:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class AgentFailureSummary:
    """Passes torchrun's output on unchanged, and adds one line after its failure report.

    torchrun ends a failed job with a 'ChildFailedError' traceback and a report of the
    failures: read it, it is what torchrun prints everywhere. After the report this adds one
    line naming the first rank that failed with its exit code and, when the worker recorded
    its exception in an error file (@record), the host and the exception, which matter when
    --redirects kept the worker's own message off the console. It reads the report's text
    (torchrun has no machine-readable form of it): if a torch release words it differently,
    the summary is left out and nothing else changes. COURSE_RAW_TORCHRUN=1 leaves it out too.

    One traceback is shortened to a line: torchrun's own when it was sent a signal (SIGTERM
    from a scheduler or a drill, Ctrl-C): it passed the signal on to its workers, as it
    should, and the 25 lines of its stack say nothing more. Call close() at the end.
    """

    def __init__(self, emit):
        self.emit = emit
        self.in_report = False
        self.failure: dict[str, str] = {}
        self.after_exit_barrier = False
        self.held: list[str] = []  # a traceback, until its last line says whose it is

    def feed(self, line: str) -> None:
        if self.held:
            self.held.append(line)
            if line[:1] in (" ", "\t"):  # still in the traceback's stack
                return
            held, self.held = self.held, []
            signalled = re.search(r"SignalException: Process (\d+) got signal: (\d+)", line)
            if signalled:
                number = int(signalled[2])
                try:
                    name = signal.Signals(number).name
                except ValueError:
                    name = f"signal {number}"
                self.emit(f"note: torchrun (pid {signalled[1]}) got {name} and stopped its "
                          "workers, passing the signal on: that is how a stopped job ends "
                          "(its traceback left out; COURSE_RAW_TORCHRUN=1 shows it)\n")
                return
            for line in held:
                self.read(line)
        elif line.startswith("Traceback (most recent call last):"):
            self.held = [line]
        else:
            self.read(line)

    def close(self) -> None:
        """The end of the output: a traceback still held is shown as it was."""
        held, self.held = self.held, []
        for line in held:
            self.read(line)

    def read(self, line: str) -> None:
        self.emit(line)
        if "Error waiting on exit barrier" in line:
            self.after_exit_barrier = True
        elif self.after_exit_barrier and re.match(r"[\w.]*(Error|Exception)\b", line):
            self.after_exit_barrier = False
            self.emit("note: the traceback above comes after the job finished: a simulated "
                      "node's agent found that node 0's agent, which hosts the store, had "
                      "already left. Harmless.\n")
        elif "ChildFailedError" in line:
            self.in_report, self.failure = True, {}
        elif self.in_report:
            self.read_report(line)

    def read_report(self, line: str) -> None:
        if line.startswith("Root Cause"):
            self.failure["_root"] = "yes"
        for key in ("rank", "exitcode", "host", "error_file"):
            m = re.match(rf"\s*{key}\s*:\s*(\S+)", line)
            if m and self.failure.get("_root") and key not in self.failure:
                self.failure[key] = m.group(1)
        if self.failure.get("_root") and "error_file" in self.failure and (
                line.strip() and not line.startswith("=====")):
            self.failure["_last"] = line.strip()  # the traceback's last line, in the end
        if line.startswith("=====") and self.failure.get("_opened"):
            self.emit(self.one_line(self.failure))
            self.in_report = False
        elif line.startswith("====="):
            self.failure["_opened"] = "yes"

    @staticmethod
    def one_line(failure: dict[str, str]) -> str:
        """The report in one line; with the root cause's error file (a worker whose main is
        wrapped in @record wrote it), also its host and its exception."""
        first = (f"error: the job failed: rank {failure.get('rank', '?')} exited with code "
                 f"{failure.get('exitcode', '?')} first")
        error_file = failure.get("error_file", "<N/A>")
        if error_file.startswith("<"):
            return f"{first} (the workers' own messages are above torchrun's report)\n"
        try:  # torch/distributed/elastic/multiprocessing/errors/error_handler.py writes it
            with open(error_file) as f:
                message = json.load(f)["message"]["message"]
        except (OSError, ValueError, KeyError, TypeError):
            message = failure.get("_last", "")
        message = " ".join(str(message).split())
        return (f"{first}, on host {failure.get('host', '?')}: {message} (error file: "
                f"{error_file})\n")


def _pump(stream, emit, filtered: bool, stopping: threading.Event) -> None:
    summary = AgentFailureSummary(emit) if filtered else None
    for line in iter(stream.readline, ""):
        if stopping.is_set() and filtered:
            continue  # what agents say while we stop them is about being stopped
        if summary:
            summary.feed(line)
        else:
            emit(line)
    if summary:
        summary.close()
    stream.close()


def run_commands(
    commands: list[list[str]],
    timeout: float,
    envs: list[dict] | None = None,
    cwd: str | None = None,
    capture: bool = False,
    progress: tuple[str, float] | None = None,
) -> subprocess.CompletedProcess:
    """Run the node agents together; kill them all if one fails or the time runs out.

    Each agent starts in a session of its own, so stopping one never touches this process.
    Returns a CompletedProcess whose returncode is the first non-zero one (124 on timeout),
    with the output of all agents collected in stdout/stderr when capture=True.
    progress=(prefix, seconds) also stops the job (124) when that long passes without a
    captured stdout line that starts with prefix: a job that grades many submissions in turn
    gives each one the time a job of its own would have, and a hang no more than that.
    """
    filtered = os.environ.get("COURSE_RAW_TORCHRUN", "") in ("", "0")
    procs, pumps, stopping = [], [], []
    captured: dict[str, list[str]] = {"out": [], "err": []}

    last_progress = time.monotonic()

    def note_progress(text: str) -> None:
        nonlocal last_progress
        captured["out"].append(text)
        if text.startswith(progress[0]):
            last_progress = time.monotonic()

    def sink(name: str, stream):
        if capture:
            return note_progress if name == "out" and progress else captured[name].append
        return lambda text: (stream.write(text), stream.flush())

    for i, cmd in enumerate(commands):
        p = subprocess.Popen(cmd, env=envs[i] if envs else None, cwd=cwd, text=True, bufsize=1,
                             stdout=subprocess.PIPE if capture else None,
                             stderr=subprocess.PIPE, start_new_session=True)
        procs.append(p)
        stopping.append(threading.Event())
        streams = [(p.stderr, sink("err", sys.stderr), filtered)]
        if capture:
            streams.append((p.stdout, sink("out", sys.stdout), False))
        for stream, emit, flt in streams:
            t = threading.Thread(target=_pump, args=(stream, emit, flt, stopping[-1]),
                                 daemon=True)
            t.start()
            pumps.append(t)

    deadline = time.monotonic() + timeout
    returncode = 0
    pending = list(procs)
    try:
        while pending:
            if time.monotonic() > deadline or (
                    progress and time.monotonic() - last_progress > progress[1]):
                returncode = 124
                break
            for p in list(pending):
                rc = p.poll()
                if rc is None:
                    continue
                pending.remove(p)
                if rc != 0:
                    returncode = rc
                    pending = []  # the other nodes would only wait for the dead one
                    break
            time.sleep(0.05)
    except KeyboardInterrupt:
        returncode = 130
    finally:
        for p, event in zip(procs, stopping, strict=True):
            if p.poll() is None:
                event.set()
        _kill(procs)  # whatever stopped us (a test timeout, Ctrl-C), leave no workers behind
    for t in pumps:
        t.join(timeout=5)
    return subprocess.CompletedProcess(commands, returncode, "".join(captured["out"]),
                                       "".join(captured["err"]))


def launch(
    script: str,
    script_args: list[str] | None = None,
    nproc: int = 2,
    nnodes: int = 1,
    port: int | None = None,
    timeout: float = 600,
    env: dict | None = None,
    cwd: str | None = None,
    capture: bool = False,
    echo: bool = True,
    torchrun: str | None = None,
    backend: str = "",
    rdzv: str = "static",
    torchrun_args: list[str] | None = None,
    progress: tuple[str, float] | None = None,
) -> subprocess.CompletedProcess:
    """Check, print and run a torchrun job on this machine. Used by make and by the tests.

    backend: "" lets the scripts pick from the hardware (nccl on GPUs, else gloo); "gloo"
    hides the GPUs, so they run on the CPU; "nccl" insists on GPUs.
    rdzv: "static" (--node-rank per node) or "c10d" (the agents meet at a rendezvous).
    torchrun_args: more torchrun options, e.g. ["--max-restarts=3"].
    progress: (prefix, seconds) with capture=True: stop the job when it prints no stdout line
    starting with prefix for that long (see run_commands).
    """
    env = dict(os.environ if env is None else env)
    check_backend(backend, env)
    check_rdzv(rdzv)
    if port is None:
        port = free_port()
    else:
        check_port_free(port)
    gpus = 0 if backend == "gloo" else visible_gpu_count(env)
    if gpus and nproc * nnodes > gpus:
        where = f"NPROC={nproc}" + (f" x NNODES={nnodes}" if nnodes > 1 else "")
        raise LaunchError(
            f"{where} processes but this machine has {gpus} GPU(s): one process per GPU, so "
            f"use at most {gpus} (or BACKEND=gloo to run on the CPU)"
        )
    commands = torchrun_commands(
        script, script_args or [], nproc, nnodes, port, torchrun or default_torchrun(), rdzv,
        torchrun_args)
    settings: dict[str, str] = {"CUDA_VISIBLE_DEVICES": ""} if backend == "gloo" else {}
    if "OMP_NUM_THREADS" not in env:
        # torchrun would pick 1 and print a warning; we share the cores out and say so.
        settings["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // (nproc * nnodes)))
    node_settings = [dict(settings) for _ in commands]
    if gpus and nnodes > 1:
        for node, devices in zip(node_settings, gpus_per_node(env, gpus, nproc, nnodes),
                                 strict=True):
            node["CUDA_VISIBLE_DEVICES"] = devices
    envs = [dict(env, **node) for node in node_settings]
    if echo:
        for cmd, node in zip(commands, node_settings, strict=True):
            prefix = "".join(f"{k}={v} " for k, v in node.items())
            print("$ " + prefix + " ".join(cmd), flush=True)
    result = run_commands(commands, timeout=timeout, envs=envs, cwd=cwd, capture=capture,
                          progress=progress if capture else None)
    if result.returncode == 124:
        message = f"error: the job did not finish within {timeout:g} s and was stopped"
        if progress and capture:
            message = (f"error: the job printed no {progress[0].strip()!r} line for "
                       f"{progress[1]:g} s, or did not finish within {timeout:g} s, and was "
                       "stopped")
        print(message, file=sys.stderr, flush=True)
        if capture:
            result.stderr += message + "\n"
    return result


def check_backend(backend: str, environ: dict | None = None) -> None:
    """BACKEND is empty (from the hardware), gloo, or nccl where GPUs are visible."""
    if backend not in ("", "gloo", "nccl"):
        raise LaunchError(f"BACKEND={backend!r} is not a backend; use gloo or nccl, or leave it "
                          "empty to pick from the hardware")
    if backend == "nccl" and visible_gpu_count(environ) == 0:
        raise LaunchError("BACKEND=nccl needs NVIDIA GPUs and none is visible here (nccl runs "
                          "on CUDA devices only); leave BACKEND empty for gloo on the CPU")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", default="2", help="processes per node (NPROC)")
    parser.add_argument("--nnodes", default="1", help="simulated nodes on this machine (NNODES)")
    parser.add_argument("--port", default="", help="rendezvous port (PORT); free one if empty")
    parser.add_argument("--timeout", default="600", help="wall-clock limit in seconds")
    parser.add_argument("--backend", default="", help="gloo, nccl, or empty (BACKEND)")
    parser.add_argument("--rdzv", default=os.environ.get("RDZV", "static"),
                        help="static (--node-rank per node) or c10d (RDZV, default static)")
    parser.add_argument("--check", action="store_true", help="only check the arguments")
    parser.add_argument("script", nargs="?")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    try:
        nproc = positive_int("NPROC", args.nproc, MAX_NPROC)
        nnodes = positive_int("NNODES", args.nnodes, MAX_NNODES)
        timeout = positive_int("TIMEOUT", args.timeout, 24 * 3600)
        port = positive_int("PORT", args.port, 65535) if args.port.strip() else None
        backend = args.backend.strip()
        rdzv = args.rdzv.strip() or "static"
        check_rdzv(rdzv)
        if args.check:
            check_backend(backend)  # launch() checks it otherwise
            return 0
        if not args.script:
            raise LaunchError("no script given")
        if not os.path.exists(args.script):
            raise LaunchError(f"script {args.script} does not exist")
        result = launch(args.script, args.script_args, nproc, nnodes, port, timeout,
                        backend=backend, rdzv=rdzv)
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
