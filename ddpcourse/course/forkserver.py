"""A fork server for the Python processes the course's own tests start.

Why: almost all of the test suite's time is Python processes importing torch (about 3 s of
CPU each, timm 4 s more), and a job starts one per torchrun agent and one per rank. This
server imports them once; each later process is a fork of it that starts in milliseconds.

How: `start(folder)` runs this file as a server and writes two stand-ins into `folder`:
`python` and `torchrun`. A stand-in is a small stdlib-only script. It sends the server its
arguments, environment, working folder and open file descriptors; the server forks a
manager, the manager forks the worker that runs the program (a script, `-m module` or `-c
code`) exactly as the interpreter would. The stand-in stays as the process its parent knows:
it forwards signals to the worker and exits with the worker's status (killed by signal N:
it kills itself with N). If the stand-in dies, even by SIGKILL, the manager kills the worker.

Inside a worker sys.executable is the stand-in, so torchrun's workers, multiprocessing's
children and nested pytest runs are forks too. Where a fork would not be the same process, the
stand-in runs the real interpreter instead: another network namespace (lesson 5's hosts),
options it does not know, no server (yet), or COURSE_FORKSERVER_OFF=1.

The project's tests use it (tests/project/conftest.py), and so does a grading sandbox for
its torchrun jobs (ddpcourse/course/sandbox_child.py: a server of its own, inside the sandbox,
started before any of the submission's code could touch it). The lessons always start real
interpreters.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys

# Not matplotlib: it reads MPLBACKEND when imported (a notebook kernel sets it). Not pytest or
# ipykernel: a nested pytest could not rewrite the asserts of plugins already imported (anyio).
PRELOAD = ("torch", "torch.distributed", "torch.distributed.run", "torch.nn.parallel",
           "torch.utils.data", "torch.distributed.optim", "torchvision", "timm", "numpy")
MAX_FDS = 64

# The stand-in. Placeholders in braces are filled by start(). Runs with -IS: nothing but the
# standard library, in about 15 ms.
STAND_IN = r'''#!{real} -IS
import os, socket, struct, sys, json, signal
REAL, SOCKET, NETNS, PREFIX = {real!r}, {socket!r}, {netns!r}, {prefix!r}
argv = PREFIX + sys.argv[1:]

def real_python():
    os.execv(REAL, [REAL] + argv)

def parse(args):
    """The interpreter options the server reproduces, else None (run the real one)."""
    opts = {{"u": False, "E": False, "I": False, "B": False, "W": [], "X": []}}
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-c", "-m"):
            return (opts, a[1], args[i + 1], args[i + 2:]) if i + 1 < len(args) else None
        if a in ("-W", "-X"):
            if i + 1 == len(args):
                return None
            opts[a[1]].append(args[i + 1]); i += 2; continue
        if a.startswith(("-W", "-X")) and len(a) > 2:
            opts[a[1]].append(a[2:]); i += 1; continue
        if a.startswith("-") and len(a) > 1 and a != "--" and set(a[1:]) <= set("uEIBsSq"):
            for flag in a[1:]:
                opts[flag] = True
            i += 1; continue
        if a == "--":
            i += 1
        if i < len(args) and not args[i].startswith("-"):
            return (opts, "script", os.path.abspath(args[i]), args[i + 1:])
        return None
    return None

parsed = parse(argv)
if (parsed is None or os.environ.get("COURSE_FORKSERVER_OFF")
        or os.stat("/proc/self/ns/net").st_ino != NETNS):
    real_python()
fds = []
for name in os.listdir("/proc/self/fd"):
    try:
        os.fstat(int(name)); fds.append(int(name))
    except OSError:
        pass
fds = sorted(fds)[:{max_fds}]
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    conn.connect(SOCKET)
except OSError:
    conn.close(); real_python()
opts, kind, target, rest = parsed
request = json.dumps({{"opts": opts, "kind": kind, "target": target, "args": rest,
                      "cwd": os.getcwd(), "env": dict(os.environ), "fds": fds,
                      "stand_in": os.path.abspath(sys.argv[0]), "pid": os.getpid(),
                      "ppid": os.getppid()}}).encode()
socket.send_fds(conn, [struct.pack("!Q", len(request))], fds)
conn.sendall(request)
worker = struct.unpack("!q", conn.recv(8, socket.MSG_WAITALL))[0]

def forward(sig, frame):
    try:
        os.kill(worker, sig)
    except OSError:
        pass
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
            signal.SIGUSR2, signal.SIGCONT, signal.SIGWINCH):
    signal.signal(sig, forward)
for fd in fds:
    if fd > 2:
        try: os.close(fd)
        except OSError: pass
while True:
    try:
        data = conn.recv(8, socket.MSG_WAITALL)
        break
    except InterruptedError:
        continue
if len(data) != 8:
    os._exit(1)
status = struct.unpack("!q", data)[0]
if status < 0:
    if -status not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(-status, signal.SIG_DFL)
    os.kill(os.getpid(), -status)
os._exit(status)
'''


def write_stand_ins(folder: str, real: str) -> str:
    """The stand-ins `python` and `torchrun` in `folder`; returns the server's socket path."""
    os.chmod(folder, 0o755)  # a test may run a stand-in as another user: it falls back
    os.makedirs(os.path.join(folder, "pids"), exist_ok=True)
    sock = os.path.join(folder, "server.sock")
    netns = os.stat("/proc/self/ns/net").st_ino
    # torchrun's console script is itself a Python script: run it as the real one does.
    torchrun = os.path.join(os.path.dirname(real), "torchrun")
    for name, prefix in (("python", []), ("torchrun", [torchrun])):
        path = os.path.join(folder, name)
        with open(path, "w") as f:
            f.write(STAND_IN.format(real=real, socket=sock, netns=netns, prefix=prefix,
                                    max_fds=MAX_FDS))
        os.chmod(path, 0o755)
    return sock


def start(folder: str, real: str = sys.executable) -> subprocess.Popen:
    """Start a server and write its stand-ins into `folder`; returns the server process."""
    sock = write_stand_ins(folder, real)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return subprocess.Popen([real, os.path.abspath(__file__), sock, str(os.getpid())],
                            env=env, stdin=subprocess.DEVNULL, start_new_session=True)


def start_forked(folder: str, close_fds: tuple[int, ...] = ()) -> int:
    """A server that is a fork of this process (which has imported torch already): its
    stand-ins in `folder`; returns the server's pid. For a grading sandbox, before any of the
    submission's code has run in this process. It closes close_fds (the caller's channels)."""
    global BASE_PATH
    sock = write_stand_ins(folder, sys.executable)
    owner = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    try:
        for fd in close_fds:
            os.close(fd)
        extra = set(os.environ.get("PYTHONPATH", "").split(":"))
        BASE_PATH = [p for p in sys.path if p and p not in extra]
        request = serve(sock, owner, SANDBOX_PRELOAD)
        finish(run(request))
    finally:
        os._exit(1)


# What a grading sandbox's server imports on top of what the sandbox has (torch): what every
# rank of a grading job imports, and not timm or torchvision, which no grading job needs.
SANDBOX_PRELOAD = ("torch.distributed.run", "torch.nn.parallel", "torch.utils.data")


def serve(sock_path: str, owner: int, preload: tuple[str, ...] = PRELOAD):
    """Accept stand-ins forever; returns only in a worker, with the request it must run."""
    for module in preload:
        try:
            __import__(module)
        except Exception:  # noqa: S110 (a module that fails here is imported by the worker)
            pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path + ".tmp")
    os.rename(sock_path + ".tmp", sock_path)  # stand-ins see the socket only when it is ready
    listener.listen(128)
    listener.settimeout(1.0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # managers are reaped by the kernel
    while True:
        if os.getppid() != owner:  # the test session is gone
            os._exit(0)
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            return manage(conn)
        conn.close()


def manage(conn: socket.socket):
    """The manager: fork the worker, tell the stand-in its pid, report how it ended."""
    conn.settimeout(None)
    head, fds, _, _ = socket.recv_fds(conn, 8, MAX_FDS)
    size = struct.unpack("!Q", head)[0]
    body = b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            os._exit(1)
        body += chunk
    request = json.loads(body)
    manager = os.getpid()
    worker = os.fork()
    if worker == 0:
        conn.close()
        _die_with_parent(manager)
        os.setsid()
        _install_fds(fds, request["fds"])
        return request
    for fd in fds:
        os.close(fd)
    registry = os.path.join(os.path.dirname(request["stand_in"]), "pids", str(worker))
    with open(registry, "w") as f:  # for the worker's own children: see _pretend_to_be
        f.write(str(request["pid"]))
    try:
        conn.sendall(struct.pack("!q", worker))
        stand_in_alive = True
    except OSError:  # the stand-in was killed before it heard the worker's pid
        stand_in_alive = False
    pidfd = os.pidfd_open(worker)
    import select

    ready = select.select([conn, pidfd], [], [])[0] if stand_in_alive else []
    if pidfd not in ready:  # the stand-in is gone (killed): so is its worker
        os.kill(worker, signal.SIGKILL)
    _, status = os.waitpid(worker, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    try:
        os.unlink(registry)
    except OSError:  # the session is over and its folder gone
        pass
    try:
        conn.sendall(struct.pack("!q", code))
    except OSError:
        pass
    os._exit(0)


def _die_with_parent(parent: int) -> None:
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def _install_fds(received: list[int], numbers: list[int]) -> None:
    """Give the worker the stand-in's descriptors under the same numbers, and no others."""
    import fcntl

    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 1000) for fd in received]
    for fd in received:
        os.close(fd)
    for fd, number in zip(high, numbers, strict=True):
        os.dup2(fd, number, inheritable=True)  # it survived exec into the stand-in
        os.close(fd)
    keep = set(numbers)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _pretend_to_be(pid: int, ppid: int, folder: str) -> None:
    """os.getpid() gives the stand-in's pid, the one its parent and the tests know; so does
    os.getppid() when the parent is itself a worker (a torchrun agent, say).

    A signal sent to that pid reaches the stand-in, which forwards it (SIGKILL: the manager
    kills the worker, a few milliseconds later); one the worker sends itself goes straight to
    it. Processes the worker forks get their own pids, as usual. The replacements pickle as
    os.getpid, os.getppid and os.kill (multiprocessing sends them by name).
    """
    real_getpid, real_getppid, worker = os.getpid, os.getppid, os.getpid()
    try:  # the parent is a worker: its stand-in is the process the parent's parent knows
        with open(os.path.join(folder, "pids", str(ppid))) as f:
            ppid = int(f.read())
    except (OSError, ValueError):
        pass

    def getpid():
        return pid if real_getpid() == worker else real_getpid()

    def getppid():
        return ppid if real_getpid() == worker else real_getppid()

    real_kill = os.kill

    def kill(target, sig):  # a signal to "itself" must stop it at once, as it would
        return real_kill(real_getpid() if target == pid and real_getpid() == worker
                         else target, sig)

    for function, real in ((getpid, real_getpid), (getppid, real_getppid), (kill, real_kill)):
        function.__module__, function.__qualname__ = "os", real.__name__
        function.__doc__ = real.__doc__
        setattr(os, real.__name__, function)


def run(request: dict) -> int:
    """Run the program as `python [opts] script|-m module|-c code args` would."""
    import io
    import runpy

    opts, env = request["opts"], request["env"]
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(env)
    unbuffered = opts["u"] or bool(env.get("PYTHONUNBUFFERED")) and not (opts["E"] or opts["I"])
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            setattr(sys, name, None)
            continue
        mode = "r" if fd == 0 else "w"
        raw = open(fd, mode + "b", buffering=0, closefd=False)
        buffered = raw if unbuffered and fd else (io.BufferedReader(raw) if fd == 0
                                                  else io.BufferedWriter(raw))
        stream = io.TextIOWrapper(buffered, encoding=env.get("PYTHONIOENCODING") or "utf-8",
                                  errors="backslashreplace" if fd == 2 else "strict",
                                  line_buffering=fd == 2 or raw.isatty(),
                                  write_through=unbuffered)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    if env.get("PYTHONFAULTHANDLER") or any(x.startswith("faulthandler") for x in opts["X"]):
        import faulthandler

        faulthandler.enable()
    if opts["W"] or env.get("PYTHONWARNINGS"):
        import warnings

        for spec in (env.get("PYTHONWARNINGS", "").split(",") if not opts["E"] else []) + \
                opts["W"]:
            if spec:
                warnings._setoption(spec)  # what the interpreter does with -W
    sys.dont_write_bytecode = opts["B"] or bool(env.get("PYTHONDONTWRITEBYTECODE"))
    if env.get("COURSE_JOB_CACHE"):  # the test session's job cache
        from ddpcourse.cluster import jobcache

        jobcache.install()
    threads = env.get("OMP_NUM_THREADS")
    if threads and threads.isdigit():  # torch read it when the server imported it
        import torch

        torch.set_num_threads(int(threads))
    _pretend_to_be(request["pid"], request["ppid"], os.path.dirname(request["stand_in"]))
    sys.executable = os.path.join(os.path.dirname(request["stand_in"]), "python")
    try:
        import multiprocessing

        multiprocessing.set_executable(sys.executable)
    except Exception:  # noqa: S110
        pass

    kind, target = request["kind"], request["target"]
    extra = [] if opts["E"] or opts["I"] else [p for p in env.get("PYTHONPATH", "").split(":")
                                               if p]
    first = {"script": os.path.dirname(target), "m": os.getcwd(), "c": ""}[kind]
    sys.path[:] = ([] if opts["I"] else [first]) + extra + BASE_PATH
    try:
        if kind == "script":
            sys.argv = [target, *request["args"]]
            runpy.run_path(target, run_name="__main__")
        elif kind == "m":
            sys.argv = ["-m", *request["args"]]
            sys.modules.pop(target, None)  # preloaded, but __main__ is a fresh run of it
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = ["-c", *request["args"]]
            main = type(sys)("__main__")
            sys.modules["__main__"] = main
            exec(compile(target, "<string>", "exec"), main.__dict__)
    except SystemExit as stop:
        code = stop.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except BaseException as error:  # print it as the interpreter would, without our frames
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__,
                                                                    "<frozen runpy>"):
            tb = tb.tb_next
        sys.excepthook(type(error), error.with_traceback(tb), tb)
        return -signal.SIGINT if isinstance(error, KeyboardInterrupt) else 1
    return 0


def finish(code: int) -> None:
    """End the worker as the interpreter would, less the teardown of every module.

    That teardown would touch every object the server imported and so copy its memory: 1.3 s
    of CPU per process, against 0.06 s for the rest. What it would still do for a program is
    here: wait for threads, run atexit functions (logging flushes there), flush the streams.
    """
    import atexit
    import threading

    try:
        threading._shutdown()
    except Exception:  # noqa: S110
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream and stream.flush()
        except Exception:  # noqa: S110
            pass
    if code == -signal.SIGINT:  # as the interpreter ends on an uncaught KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.raise_signal(signal.SIGINT)
    os._exit(code & 0xFF)


if __name__ == "__main__":
    BASE_PATH = [p for p in sys.path[1:]]  # the interpreter's own, without this file's folder
    request = serve(sys.argv[1], int(sys.argv[2]))
    finish(run(request))
