"""The process a submission's code runs in: it decides nothing and returns only data.

Started by ddpcourse/course/sandbox.py, never by hand. It reads requests on one pipe and
answers on another: call a function of the submission, run one of the grader's probes
(ddpcourse/course/probes.py) beside it, or launch a grading job. Every answer is data
(numbers, strings, lists, dicts, plain tensors) written with torch.save, which the judge
reads with torch.load(weights_only=True): no object of the submission's can come back. An
object that is not data stays here as a numbered handle the judge may pass back.

Started as root (in new mount, network and PID namespaces, see sandbox.py), it first brings
the loopback interface up, moves into a file system of its own that holds only what it needs
(none of the grader's files), and drops to an unprivileged user before
it imports anything of the submission's.
"""

from __future__ import annotations

import argparse
import builtins
import ctypes
import dataclasses
import fcntl
import importlib
import os
import socket
import struct
import sys
import time
import traceback
import types
from contextlib import ExitStack, contextmanager
from datetime import timedelta

from ddpcourse.course import frames

# What a grading worker prints when the job's own process group for a check could not form
# in FORM_TRIES tries (ddpcourse/course/workers/common.py): the job says nothing about the
# submission, and is launched again from that check (ddpcourse/course/job_checks.py).
FORM_TRIES = 3
HARNESS_FAILED = "### harness failed"


def loopback_up() -> None:
    """`ip link set lo up` without iproute2: SIOCSIFFLAGS on an AF_INET socket."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(s, siocgifflags, request))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH14s", b"lo", flags | iff_up, b""))


MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = \
    0x1, 0x2, 0x4, 0x8, 0x20, 0x1000, 0x4000, 0x40000
_libc = ctypes.CDLL(None, use_errno=True)


def mount(source: str, target: str, fstype: str = "", flags: int = 0, data: str = "") -> None:
    """mount(2) itself: a sandbox makes a dozen mounts, and a `mount` program for each was a
    fork of this process (which holds torch) every time."""
    if _libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None,
                   flags, data.encode() if data else None):
        raise OSError(ctypes.get_errno(), f"mount {source} on {target}")


def read_only(target: str) -> None:
    """Remount a bind mount read-only, keeping the flags it already has (nosuid, nodev,
    noexec: in a user namespace they cannot be dropped)."""
    kept = os.statvfs(target).f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC)
    mount("none", target, "", MS_REMOUNT | MS_BIND | MS_RDONLY | kept)


SYSTEM = ("/usr", "/bin", "/lib", "/lib64", "/lib32", "/libx32", "/sbin", "/etc", "/sys")


def bind(source: str, root: str, writable: bool = False) -> None:
    """`source` at the same path inside `root` (read-only unless writable)."""
    target = root + os.path.abspath(source)
    if os.path.islink(source):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.symlink(os.readlink(source), target)
        return
    os.makedirs(target, exist_ok=True)
    mount(source, target, "", MS_BIND | MS_REC)
    if not writable:
        read_only(target)


# What a sandbox may hold outside its processes' memory, each a tmpfs of its own (counted in
# its memory by the judge, and gone with its mount namespace): /tmp, /dev/shm, its home.
TMP_BYTES = 512 << 20
SHM_BYTES = 512 << 20
HOME_BYTES = 1 << 30
# Its IPC namespace's own limits: System V shared memory, message queues, POSIX queues.
IPC_LIMITS = {"kernel/shmmax": 256 << 20, "kernel/shmall": (256 << 20) // 4096,
              "kernel/shmmni": 64, "kernel/msgmni": 16, "fs/mqueue/queues_max": 8}
# Processes and threads of its user, all namespaces together: a fork bomb stops here (lesson
# 4's grading, jobs of 4 ranks, held at most 68 at once, measured).
MAX_TASKS = 1024


def enter_minimal_root(root: str, readable: list[str], writable: list[str], uid: int) -> None:
    """As root inside the new namespaces: a file system that holds the system's programs and
    libraries, the interpreter, the course's copy, the submission and its own writable home,
    and nothing else (no checkout of the course anywhere on the machine, no other student, no
    results); then chroot into it. /tmp, /dev/shm and each writable folder are bounded tmpfs
    of its own, /proc that of the new PID namespace. TMPDIR is a folder of its home."""
    mount("none", "/", "", MS_REC | MS_PRIVATE)
    mount("sandbox-root", root, "tmpfs", 0, "size=1m,mode=0755")
    for path in SYSTEM:
        if os.path.lexists(path):
            bind(path, root)
    os.makedirs(root + "/dev")
    mount("/dev", root + "/dev", "", MS_BIND | MS_REC)
    mount("shm", root + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={SHM_BYTES},mode=1777")
    os.makedirs(root + "/proc")
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV)
    for name, value in IPC_LIMITS.items():
        with open(f"{root}/proc/sys/{name}", "w") as f:
            f.write(str(value))
    os.makedirs(root + "/tmp")
    mount("tmp", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={TMP_BYTES},mode=1777")
    for path in readable:
        bind(path, root)
    for path in writable:
        target = root + os.path.abspath(path)
        os.makedirs(target, exist_ok=True)
        mount("home", target, "tmpfs", MS_NOSUID | MS_NODEV,
              f"size={HOME_BYTES},mode=0700,uid={uid},gid={uid}")
        os.makedirs(target + "/tmp")
        os.chown(target + "/tmp", uid, uid)
    os.chroot(root)
    os.chdir("/")


def drop_to(uid: int) -> None:
    """Become `uid` for good: no groups, no capabilities, no way back (no_new_privs), at most
    MAX_TASKS processes and threads."""
    import resource

    resource.setrlimit(resource.RLIMIT_NPROC, (MAX_TASKS, MAX_TASKS))
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    pr_set_no_new_privs = 38
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_no_new_privs, 1, 0, 0, 0)


def isolate(root: str, readable: list[str], writable: list[str], uid: int) -> None:
    """Loopback up, the minimal file system, then the unprivileged user."""
    loopback_up()
    enter_minimal_root(root, readable, writable, uid)
    drop_to(uid)


# --- data out --------------------------------------------------------------------------------

class Handles:
    def __init__(self):
        self.objects: dict[int, object] = {}

    def keep(self, obj) -> dict:
        key = len(self.objects) + 1
        self.objects[key] = obj
        return {"__handle__": key, "type": type(obj).__name__}


def to_data(obj, handles: Handles, depth: int = 0):
    """The submission's value as data; anything else becomes a handle."""
    import numpy as np
    import torch

    if depth > 50:
        raise ValueError("the value is nested more than 50 levels deep")
    if obj is None or type(obj) in (bool, int, float, str, bytes, complex):
        return obj
    for plain in (bool, int, float, str, bytes):
        if isinstance(obj, plain):
            return plain(obj)
    if isinstance(obj, torch.Tensor):
        tensor = obj.detach()
        if type(tensor) is not torch.Tensor:
            tensor = tensor.as_subclass(torch.Tensor)
        return tensor.clone().contiguous()
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": torch.from_numpy(np.ascontiguousarray(obj).copy())}
    if isinstance(obj, np.generic):
        return to_data(obj.item(), handles, depth + 1)
    if isinstance(obj, (list, tuple)):
        items = [to_data(v, handles, depth + 1) for v in obj]
        return items if isinstance(obj, list) else tuple(items)
    if isinstance(obj, dict):
        return {to_data(k, handles, depth + 1): to_data(v, handles, depth + 1)
                for k, v in obj.items()}
    if isinstance(obj, (set, frozenset)):
        return {"__set__": [to_data(v, handles, depth + 1) for v in obj]}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {"__object__": type(obj).__name__, "fields": {
            f.name: to_data(getattr(obj, f.name), handles, depth + 1)
            for f in dataclasses.fields(obj)}}
    if isinstance(obj, (torch.dtype, torch.device)):
        return {"__repr__": str(obj)}
    return handles.keep(obj)


def from_judge(obj, handles: Handles):
    """Arguments from the judge: handles turned back into the objects they stand for."""
    if isinstance(obj, dict) and set(obj) == {"__handle__", "type"}:
        return handles.objects[obj["__handle__"]]
    if isinstance(obj, list):
        return [from_judge(v, handles) for v in obj]
    if isinstance(obj, tuple):
        return tuple(from_judge(v, handles) for v in obj)
    if isinstance(obj, dict):
        return {k: from_judge(v, handles) for k, v in obj.items()}
    return obj


def describe_error(error: BaseException) -> dict:
    """What the judge needs to raise the same kind of error: the class names down to the
    first built-in one, the message, and where (the last lines of the traceback)."""
    names = [cls.__name__ for cls in type(error).__mro__]
    builtin = next((cls.__name__ for cls in type(error).__mro__
                    if getattr(builtins, cls.__name__, None) is cls), "BaseException")
    try:
        message = str(error)
    except Exception:  # a __str__ that raises
        message = "(the error's message could not be read)"
    where = "".join(traceback.format_exception(type(error), error, error.__traceback__)[-3:])
    return {"mro": names[:20], "builtin": builtin, "message": message[:4000],
            "where": where[-4000:]}


# --- what a request does -----------------------------------------------------------------------

def swap(stack: ExitStack, owner, name: str, new, module) -> None:
    """owner.name is `new` until `stack` closes, and so is every name the submission's module
    holds the same object under."""
    original = getattr(owner, name)
    setattr(owner, name, new)
    stack.callback(setattr, owner, name, original)
    for held_as, value in list(vars(module).items()) if module else []:
        if value is original:
            setattr(module, held_as, new)
            stack.callback(setattr, module, held_as, original)


def refuse_everywhere(stack: ExitStack, original, refuse) -> None:
    """A Python function refused is refused under every name that holds it, not only the ones
    swap() finds: its own code becomes refuse's until `stack` closes, so a default argument, a
    closure or an alias the submission kept calls the refusal too."""
    if not isinstance(original, types.FunctionType) or original.__code__.co_freevars:
        return  # a class, a builtin, or a closure whose cells the refusal's code cannot take
    saved = (original.__code__, original.__defaults__, original.__kwdefaults__)
    original.__code__ = refuse.__code__
    original.__defaults__, original.__kwdefaults__ = refuse.__defaults__, refuse.__kwdefaults__

    def restore():
        original.__code__, original.__defaults__, original.__kwdefaults__ = saved
    stack.callback(restore)


@contextmanager
def refusing(targets: list[tuple[str, str, str]], module, replace: dict | None = None):
    """Each (module, attribute path, message): that attribute raises AssertionError(message)
    while the submission runs, and so does the submission's own name for it. Each
    {name: probe} of `replace`: the submission's own function `name` is, meanwhile,
    ddpcourse/course/probes.py's function `probe`, which takes the same arguments (an exercise
    graded with the grader's version of another one it builds on)."""
    with ExitStack() as stack:
        for module_name, path, message in targets:
            owner = importlib.import_module(module_name)
            *parents, name = path.split(".")
            for parent in parents:
                owner = getattr(owner, parent)

            def refuse(*args, _message=message, **kwargs):
                raise AssertionError(_message)
            original = getattr(owner, name)
            swap(stack, owner, name, refuse, module)
            refuse_everywhere(stack, original, refuse)
        for name, probe in (replace or {}).items():
            if module is not None and hasattr(module, name):  # none: nothing can call it
                probes = importlib.import_module("ddpcourse.course.probes")
                swap(stack, module, name, getattr(probes, probe), module)
        yield


@contextmanager
def environment(overrides: dict):
    saved = {k: os.environ.get(k) for k in overrides}
    os.environ.update({k: v for k, v in overrides.items() if v is not None})
    for k, v in overrides.items():
        if v is None:
            os.environ.pop(k, None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Child:
    def __init__(self, lesson: int, channels: tuple[int, ...] = ()):
        self.lesson = lesson
        self.channels = channels
        self.handles = Handles()
        self.module = None
        self.import_error: BaseException | None = None
        self.world = False
        self.forks: str | None = None
        self.server = None

    def exercises(self):
        if self.module is None and self.import_error is None:
            from ddpcourse.exercises import load_exercises
            try:
                self.module = load_exercises(self.lesson)
            except BaseException as error:  # the submission's code: anything can come out
                self.import_error = error
        if self.import_error is not None:
            raise RuntimeError("could not import the exercises: " + " ".join(
                f"{type(self.import_error).__name__}: {self.import_error}".split())[:500])
        return self.module

    def set_world(self, one: bool) -> None:
        import torch.distributed as dist

        if one and not dist.is_initialized():
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                                    timeout=timedelta(seconds=10))
        elif not one and dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass
        self.world = one

    def start_fork_server(self) -> str:
        """Start it now (at the child's start, before any of the submission's code runs): a
        fork of this process, which has imported torch, so the jobs' processes start in
        milliseconds."""
        from ddpcourse.course import forkserver

        folder = os.path.join(os.environ["HOME"], "forkserver")
        if self.server is None:
            os.makedirs(folder, exist_ok=True)
            self.server = forkserver.start_forked(folder, close_fds=self.channels)
        return folder

    def fork_server(self) -> str | None:
        """The torchrun stand-in of this sandbox's fork server (started now if it was not);
        None: the real one."""
        if self.forks is None:
            folder = self.start_fork_server()
            for _ in range(300):
                if os.path.exists(os.path.join(folder, "server.sock")):
                    break
                time.sleep(0.1)
            ready = os.path.exists(os.path.join(folder, "server.sock"))
            self.forks = os.path.join(folder, "torchrun") if ready else ""
        return self.forks or None

    def handle(self, request: dict):
        op = request["op"]
        if op == "world":
            self.set_world(request["one"])
            return None
        if op == "job":
            import tempfile

            from ddpcourse.cluster.launch import launch

            options = dict(request["launch"])
            request["script_args"] = [tempfile.mkdtemp() if a == "@workdir" else a
                                      for a in request.get("script_args") or []]
            observations = tempfile.mkdtemp(prefix="observations-")
            options["env"] = dict(os.environ, **options.get("env", {}),
                                  COURSE_OBSERVATIONS=observations)
            result = launch(os.path.join(os.environ["PYTHONPATH"], request["worker"]),
                            request.get("script_args") or [], capture=True, echo=False,
                            cwd=os.environ["HOME"], torchrun=self.fork_server(), **options)
            import torch

            path = os.path.join(observations, "0.pt")
            observed = torch.load(path, weights_only=True) if os.path.exists(path) else None
            return {"returncode": result.returncode, "stdout": result.stdout[-2_000_000:],
                    "stderr": result.stderr[-200_000:], "observations": observed}
        module = self.exercises()
        args = from_judge(request.get("args", ()), self.handles)
        kwargs = from_judge(request.get("kwargs", {}), self.handles)
        with environment(request.get("env") or {}), \
                refusing(request.get("refuse") or [], module, request.get("replace")):
            if op == "call":
                value = getattr(module, request["name"])(*args, **kwargs)
            elif op == "probe":
                probes = importlib.import_module("ddpcourse.course.probes")
                value = getattr(probes, request["name"])(module, *args, **kwargs)
            elif op == "has":
                value = hasattr(module, request["name"])
            else:
                raise ValueError(f"unknown request {op!r}")
        return to_data(value, self.handles)


def serve(requests: int, replies: int, lesson: int, fork_server: bool = True) -> None:

    child = Child(lesson, channels=(requests, replies))
    if fork_server:
        child.start_fork_server()
    reader = os.fdopen(requests, "rb", buffering=0)
    writer = os.fdopen(replies, "wb", buffering=0)
    while True:
        try:
            request = frames.read_frame(lambda n: read_exactly(reader, n), trusted=True)
        except EOFError:  # the judge closed the channel
            return
        try:
            reply = {"seq": request["seq"], "value": child.handle(request)}
        except BaseException as error:  # SystemExit and pytest.exit included: data, no exit
            reply = {"seq": request["seq"], "raised": describe_error(error)}
        try:
            data = frames.encode(reply)
        except Exception as error:
            data = frames.encode({"seq": request["seq"], "raised": describe_error(
                TypeError(f"the value returned is not data the grader can read: {error}"))})
        if len(data) - frames.HEADER.size > frames.LIMIT:
            data = frames.encode({"seq": request["seq"], "raised": describe_error(ValueError(
                f"the value returned is {len(data)} bytes, more than {frames.LIMIT}"))})
        writer.write(data)


def read_exactly(reader, n: int) -> bytes:
    chunks = []
    while n:
        chunk = reader.read(n)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


# --- the warm template ----------------------------------------------------------------------

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWUSER = \
    0x00020000, 0x08000000, 0x20000000, 0x40000000, 0x10000000
ZYGOTE_PRELOAD = ("torch.distributed", "torch.distributed.run", "torch.distributed.optim",
                  "torch.distributed.pipelining", "torch.nn.parallel", "torch.utils.data")
PR_SET_PDEATHSIG = 1


def zygote(sock_path: str) -> None:
    """A server (root, or the grader's own user) that has imported torch and nothing of any
    submission: each request forks a sandbox from it (namespaces, hidden files, its own user),
    which saves every sandbox the seconds of importing torch. Its socket is the grader's alone
    (mode 0600 in a 0700 folder). Ends when the process that started it does (its parent
    changes: read at once, not passed in, since a fork server's worker reports its stand-in's
    pid as its own)."""
    import signal

    owner = os.getppid()
    import numpy  # noqa: F401  preloaded for the sandboxes
    import torch  # noqa: F401

    for module in ZYGOTE_PRELOAD:  # what the grading jobs and the lessons' exercises import
        try:
            __import__(module)
        except Exception:  # noqa: S112 (the sandbox imports it, or fails there, itself)
            continue

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path + ".tmp")
    os.chmod(sock_path + ".tmp", 0o600)
    os.rename(sock_path + ".tmp", sock_path)
    listener.listen(64)
    listener.settimeout(1.0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the sandboxes are reaped by the kernel
    while True:
        if os.getppid() != owner:
            os._exit(0)
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        conn.settimeout(30)
        try:
            head, fds, _, _ = socket.recv_fds(conn, frames.HEADER.size, 4)
            body = read_exactly(conn.makefile("rb"), frames.body_size(head))
            request = frames.decode(body, trusted=True)
        except (OSError, ValueError, EOFError, struct.error):
            conn.close()
            continue
        pid = os.fork()
        if pid == 0:
            listener.close()
            conn.close()
            start_sandbox(request, fds)
        for fd in fds:
            os.close(fd)
        try:
            conn.sendall(struct.pack("<q", pid))
        except OSError:
            pass
        conn.close()


def start_sandbox(request: dict, fds: list[int]) -> None:
    """In a fork of the zygote: new mount, IPC, network and PID namespaces; the sandbox is PID 1
    of the new one (when it ends, the kernel ends all it started) and dies with this process,
    which reports its exit status on its own pipe and is what the judge holds.

    Two kinds: the submission's child (fds: requests, replies, output, status), which serves
    the judge's requests; and one rank of a relayed job (fds: its socket to the relay, output,
    status), which runs request["worker"] as a script (ddpcourse/course/relay.py). Without a
    user id (the judge is not root) the same process starts without namespaces or user."""
    import signal

    rank = request.get("kind") == "rank"
    channels, (out, status) = fds[:-2], fds[-2:]
    isolated = request.get("uid") is not None
    # Without root, a sandbox still gets namespaces of its own, inside a user namespace of its
    # own (its user id unchanged): no rank reaches another but through the relay, and the
    # submission's child has a network, /tmp, /dev/shm and home of its own.
    own_user = not isolated
    try:
        os.setsid()
        libc = ctypes.CDLL(None, use_errno=True)
        namespaces = CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWPID
        if isolated and libc.unshare(namespaces):
            raise OSError(ctypes.get_errno(), "unshare")
        if own_user:
            try:
                enter_own_user_namespace(libc, namespaces)
            except OSError as refused:  # a kernel that lends no user namespace: said, not fatal
                print(f"### sandbox not isolated: {refused}", file=sys.stderr, flush=True)
                own_user = False
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        child = os.fork()
        if child:
            for fd in (*channels, out):
                os.close(fd)
            _, code = os.waitpid(child, 0)
            os.write(status, struct.pack("<i", os.waitstatus_to_exitcode(code)))
            os._exit(0)
        os.close(status)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        os.environ.clear()
        os.environ.update(request["env"])
        import tempfile
        tempfile.tempdir = None  # the zygote's choice (/tmp) was cached: TMPDIR from now on
        sys.path[:] = [request["release"]] + sys.path[1:]  # not the zygote's own folder
        import_from(request["release"])
        if isolated:
            isolate(request["root"], request["readable"], request["writable"], request["uid"])
        elif own_user:
            private_mounts(request["keep"], [os.environ["HOME"]])
        os.chdir(os.environ["HOME"])
        if rank:
            run_rank(request, channels[0])
        serve(*channels, request["lesson"], request["fork_server"])
        os._exit(0)
    except BaseException:
        traceback.print_exc()
        os._exit(70)


def import_from(release: str) -> None:
    """The course's packages that this process imported before it was a sandbox find their
    modules in the release copy from now on: the checkout they came from is out of view."""
    for name, module in list(sys.modules.items()):
        if name.partition(".")[0] == "ddpcourse" and hasattr(module, "__path__"):
            module.__path__ = [os.path.join(release, *name.split("."))]


def enter_own_user_namespace(libc, namespaces: int) -> None:
    """unshare(namespaces) inside a new user namespace where this process keeps its ids."""
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | namespaces):
        raise OSError(ctypes.get_errno(), "unshare (user namespace)")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                       ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def private_mounts(readable: list[str], writable: list[str]) -> None:
    """In the new user and mount namespaces (PID 1 of the new PID one): /tmp, /dev/shm and
    each writable folder a bounded tmpfs of this process alone, `readable` kept in view
    read-only (they may lie under /tmp), /proc that of its PID namespace, loopback up; then
    every capability dropped, so none of it can be undone."""
    kept = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in readable}
    mount("none", "/", "", MS_REC | MS_PRIVATE)
    for target, size in (("/tmp", TMP_BYTES), ("/dev/shm", SHM_BYTES)):
        mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=1777")
    for path, fd in kept.items():
        os.makedirs(path, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", path, "", MS_BIND | MS_REC)
        read_only(path)
        os.close(fd)
    for path in writable:
        os.makedirs(path, exist_ok=True)
        mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={HOME_BYTES},mode=0700")
        os.makedirs(os.path.join(path, "tmp"))
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV)
    loopback_up()
    drop_capabilities(_libc)


def drop_capabilities(libc) -> None:
    """No capability left in any set (capset), and no way to gain one (no_new_privs)."""
    pr_capbset_drop, pr_set_no_new_privs = 24, 38
    for cap in range(64):
        libc.prctl(pr_capbset_drop, cap, 0, 0, 0)  # past the last one: EINVAL, harmless
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()
    if libc.capset(header, data):
        raise OSError(ctypes.get_errno(), "capset")
    libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0)


def run_rank(request: dict, relay_fd: int) -> None:
    """One rank of a relayed job: the worker script, as `python worker args` would run it,
    with RANK, WORLD_SIZE, ... in its environment and its relay socket's number in
    COURSE_RELAY_FD."""
    import runpy

    os.environ["COURSE_RELAY_FD"] = str(relay_fd)
    worker = request["worker"]
    sys.argv = [worker, *request.get("args", [])]
    code = 0
    try:
        runpy.run_path(worker, run_name="__main__")
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--zygote", default=None, help="serve sandboxes on this socket")
    parser.add_argument("--requests", type=int)
    parser.add_argument("--replies", type=int)
    parser.add_argument("--lesson", type=int)
    parser.add_argument("--uid", type=int, default=-1)
    parser.add_argument("--root", default="", help="an empty folder for the sandbox's root")
    parser.add_argument("--readable", action="append", default=[])
    parser.add_argument("--writable", action="append", default=[])
    parser.add_argument("--no-fork-server", action="store_true",
                        help="start the jobs' fork server only if a job comes")
    args = parser.parse_args()
    if args.zygote:
        zygote(args.zygote)
        return
    import_from(os.environ["PYTHONPATH"])
    if args.uid >= 0:
        isolate(args.root, args.readable, args.writable, args.uid)
        os.chdir(os.environ["HOME"])
    serve(args.requests, args.replies, args.lesson, not args.no_fork_server)


if __name__ == "__main__":
    main()
