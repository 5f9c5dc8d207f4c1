"""Where a submission's code runs while it is graded: a process that decides nothing.

The grading tests (the judge) never import a submission. `Submission(lesson)` starts a child
process (ddpcourse/course/sandbox_child.py) in a scratch tree that holds only what the
student release holds plus the submission's own files, and every `submission.f(*args)`
becomes a request to it; the answer comes back as data, read with
torch.load(weights_only=True), and is judged here. Grader-written code that must run beside
the submission (a watched dataset, a refused function, a torchrun job) runs there too and
also returns data: what such an observation says could be forged by the submission, which
tests/grading/README.md states.

Isolation, when the judge runs as root (Gradescope, CI, a container):
  - new mount, network and PID namespaces (util-linux `unshare`): loopback only; a file system
    of its own (chroot) that holds the system's programs and libraries, the interpreter, the
    scratch tree and nothing else: no checkout of the course anywhere on the machine, no
    other student, no results; when the child (PID 1 there) ends, the kernel ends everything
    it started, daemons included;
  - an unprivileged user id of its own (one per concurrent submission), no_new_privs;
  - a memory limit (the judge sums the resident memory of that user's processes) and a time
    limit per request.
Without root (your own laptop), the child is a separate process in a scratch tree, and what
it started is ended by process group and by the judge's list of descendants; it could read
your files, so grade others' code as root.
"""

from __future__ import annotations

import atexit
import builtins
import ctypes
import fcntl
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from ddpcourse.course import frames, intake
from ddpcourse.exercises import ROOT, exercise_folder

MEMORY_LIMIT = int(float(os.environ.get("COURSE_SANDBOX_MEMORY_GB", "6")) * 2**30)
CALL_TIMEOUT = float(os.environ.get("COURSE_SANDBOX_CALL_TIMEOUT", "300"))
FIRST_UID = 62000            # sandbox users: 62000..62063, one per submission graded at once
UID_SLOTS = 64
PR_SET_CHILD_SUBREAPER = 36
# What of the course the child's scratch tree holds: the student release's files it needs.
RELEASE_PARTS = ("ddpcourse", "pyproject.toml")


class SubmissionError(RuntimeError):
    """The submission's code ended, hung or broke the channel: this request fails."""


class SubmissionException(Exception):
    """Base of the judge-side classes that stand for exceptions the submission defines."""


class Handle:
    """An object of the submission's that is not data: it stays in the child."""

    def __init__(self, key: int, type_name: str):
        self.key, self.type_name = key, type_name

    def __repr__(self):
        return f"<{self.type_name} in the submission's process>"


class Returned:
    """A dataclass instance the submission returned, as its fields (read-only data)."""

    def __init__(self, type_name: str, fields: dict):
        object.__setattr__(self, "_type_name", type_name)
        object.__setattr__(self, "_fields", fields)

    def __getattr__(self, name):
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(f"the {self._type_name} returned has no field {name!r}") \
                from None

    def __setattr__(self, name, value):
        raise AttributeError("data the submission returned cannot be changed")

    def __repr__(self):
        return f"{self._type_name}({', '.join(f'{k}={v!r}' for k, v in self._fields.items())})"


def handed_in(lesson: int) -> tuple[dict[str, bytes], str]:
    """(the lesson's files, "") from the folder COURSE_SUBMISSION / COURSE_IMPL name, taken
    by ddpcourse/course/intake.py; or ({}, why none are graded) in one line."""
    folder = exercise_folder()
    try:
        return intake.take(folder, lesson), ""
    except intake.Missing as missing:
        why = str(missing)
        if not os.environ.get("COURSE_SUBMISSION", "").strip() and not folder.exists():
            why = f"{folder} does not exist (this copy of the course has no solutions)"
        return {}, f"has no lesson {lesson} to grade: {why}"
    except intake.Refused as why:
        return {}, f"was refused: {why}"


def real_python() -> str:
    """The interpreter itself, never the test suite's fork-server stand-in (whose children
    would be forks of a root process outside the sandbox)."""
    return os.environ.get("COURSE_REAL_PYTHON") or sys.executable


def kept_in_view(scratch: Path) -> list[str]:
    """What a sandbox without root must still read when /tmp and /dev/shm become its own:
    the interpreter and the course's copy and the submission (any may lie under /tmp, as a
    checkout made with mktemp does)."""
    return list(dict.fromkeys([os.path.realpath(p) for p in (sys.base_prefix, sys.prefix)]
                              + [str(scratch / "release"), str(scratch / "submission")]))


_user_namespaces: list[bool] = []


def user_namespaces() -> bool:
    """Whether this kernel lends this user a user namespace (with network, mount, IPC and PID
    namespaces in it), tried once in a child."""
    if not _user_namespaces:
        pid = os.fork()
        if pid == 0:
            libc = ctypes.CDLL(None, use_errno=True)
            os._exit(0 if libc.unshare(0x10000000 | 0x00020000 | 0x08000000 | 0x40000000
                                       | 0x20000000) == 0 else 1)
        _user_namespaces.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0)
    return _user_namespaces[0]


def isolation() -> str:
    """In one line, how a submission's code is kept apart here."""
    if is_root():
        return ("isolation: full (root): a user, a file system and network, PID and IPC "
                "namespaces of its own per sandbox and per rank")
    if user_namespaces():
        return ("isolation: user namespaces (not root): network, PID, IPC namespaces and its "
                "own /tmp, /dev/shm and home per sandbox and per rank; it runs as you and can "
                "read what you can")
    return ("isolation: none (not root, and this kernel lends no user namespace): the code "
            "runs as you, beside your files")


def is_root() -> bool:
    return os.geteuid() == 0 and shutil.which("unshare") is not None and \
        os.environ.get("COURSE_SANDBOX_NO_ROOT") != "1"


def copy_release(target: Path) -> None:
    for part in RELEASE_PARTS:
        source = ROOT / part
        if source.is_dir():  # with its bytecode (make setup wrote it): no compiling per student
            shutil.copytree(source, target / part)
        elif source.exists():
            shutil.copy2(source, target / part)


def take_uid_slot() -> tuple[int, object]:
    """A sandbox user id no other grading on this machine is using now (held by a lock that
    ends with this process)."""
    folder = Path(tempfile.gettempdir()) / "course-sandbox-uids"
    folder.mkdir(mode=0o700, exist_ok=True)
    for slot in range(UID_SLOTS):
        lock = open(folder / f"{slot}.lock", "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return FIRST_UID + slot, lock
        except OSError:
            lock.close()
    raise SubmissionError(f"all {UID_SLOTS} sandbox users are busy")


def processes_of(uid: int | None, root_pid: int | None) -> list[int]:
    """Pids of the processes of `uid`, or else of the descendants of root_pid."""
    if uid is not None:
        found = []
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and os.stat(f"/proc/{entry}").st_uid == uid:
                    found.append(int(entry))
            except OSError:
                continue
        return found
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found, frontier = [], [root_pid]
    while frontier:
        pid = frontier.pop()
        children = [c for c, p in parents.items() if p == pid]
        found += children
        frontier += children
    return found


def resident_upper_bound(pids: list[int]) -> int:
    """The sum of their resident sizes: cheap to read, and never less than the memory they
    hold (shared pages counted once per process)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            pass
    return total


def resident_bytes(pids: list[int]) -> int:
    """The memory these processes hold, each shared page counted once between them: the sum
    of their proportional set sizes (a job's ranks are forks that share torch's pages; the
    sum of their resident sizes would count those pages once per rank)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except (OSError, ValueError, IndexError):
            pass
    return total


def tmpfs_bytes(pids: list[int], paths: list[str]) -> int:
    """What a sandbox holds in its own tmpfs (/tmp, /dev/shm, its home): memory no process's
    resident size shows. Read through the root of one of its processes `pids` (as root)."""
    for pid in pids:
        try:
            total = 0
            for path in paths:
                stats = os.statvfs(f"/proc/{pid}/root{path}")
                total += (stats.f_blocks - stats.f_bfree) * stats.f_frsize
            return total
        except OSError:
            continue
    return 0


def remove_tree(path: Path) -> None:
    """Remove a scratch tree whatever its shape: folders too deep for shutil's recursion,
    or made unreadable, are left to GNU rm after their modes are opened up."""
    try:
        shutil.rmtree(path, ignore_errors=True)
    except RecursionError:  # raised despite ignore_errors
        pass
    if os.path.lexists(path):
        subprocess.run(["chmod", "-R", "u+rwx", str(path)], capture_output=True, timeout=300)
        subprocess.run(["rm", "-rf", "--one-file-system", str(path)], capture_output=True,
                       timeout=300)


class ZygoteChild:
    """A sandbox forked by the zygote (sandbox_child.zygote), held as Popen holds a child:
    pid, poll(), wait(), returncode, stdout. Its exit status comes on a pipe of its own."""

    def __init__(self, pid: int, stdout, status: int):
        self.pid, self.stdout, self._status = pid, stdout, status
        self.returncode = None

    @classmethod
    def start(cls, socket_path: str, request: dict, channels: tuple[int, int]):
        """A new sandbox from the zygote at socket_path; None if there is none (the caller
        starts one the slow way)."""
        import socket

        out_r, out_w = os.pipe()
        status_r, status_w = os.pipe()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(30)
                conn.connect(socket_path)
                frame = frames.encode(request)
                socket.send_fds(conn, [frame[:frames.HEADER.size]],
                                [*channels, out_w, status_w])
                conn.sendall(frame[frames.HEADER.size:])
                answer = conn.recv(8, socket.MSG_WAITALL)
            pid = struct.unpack("<q", answer)[0]
        except (OSError, struct.error):
            for fd in (out_r, out_w, status_r, status_w):
                os.close(fd)
            return None
        os.close(out_w)
        os.close(status_w)
        return cls(pid, os.fdopen(out_r, "rb"), status_r)

    def poll(self):
        if self.returncode is None and select.select([self._status], [], [], 0)[0]:
            data = os.read(self._status, 4)
            self.returncode = struct.unpack("<i", data)[0] if len(data) == 4 else -9
        if self.returncode is None:  # killed before it could say how it ended
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                self.returncode = -9
        return self.returncode

    def wait(self, timeout=None):
        ready = select.select([self._status], [], [], timeout)[0]
        if not ready:
            raise subprocess.TimeoutExpired("sandbox", timeout)
        return self.poll()


@contextmanager
def zygote_for_this_process():
    """While inside: sandboxes, and the ranks of relayed jobs, fork from a warm template
    (without root, the ranks alone: they start without namespaces)."""
    if os.environ.get("COURSE_SANDBOX_ZYGOTE"):
        yield
        return
    folder = tempfile.mkdtemp(prefix="course-zygote-")  # 0700: the grader's alone
    path = os.path.join(folder, "zygote.sock")
    server = subprocess.Popen(
        [real_python(), str(Path(__file__).with_name("sandbox_child.py")), "--zygote", path],
        cwd="/", stdin=subprocess.DEVNULL,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OMP_WAIT_POLICY": "PASSIVE"})
    os.environ["COURSE_SANDBOX_ZYGOTE"] = path
    try:
        yield
    finally:
        os.environ.pop("COURSE_SANDBOX_ZYGOTE", None)
        server.kill()
        server.wait()
        shutil.rmtree(folder, ignore_errors=True)


_zygote_of_this_process = ExitStack()


def zygote_socket() -> str:
    """The zygote's socket: this process's own, started now (and ended with it) if none."""
    if not os.environ.get("COURSE_SANDBOX_ZYGOTE"):
        _zygote_of_this_process.enter_context(zygote_for_this_process())
        atexit.register(_zygote_of_this_process.close)
    path = os.environ["COURSE_SANDBOX_ZYGOTE"]
    deadline = time.monotonic() + 120  # it imports torch before it listens
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.1)
    return path


@dataclass
class RelayedJob:
    """What the judge saw of one relayed job (ddpcourse/course/relay.py): per rank, what its
    harness reported (`notes`), every operation it asked the relay for (`record`), its
    secret, how it ended (`exits`: an exit status, or why it was stopped) and what it
    printed."""
    notes: list
    record: list
    secrets: list
    exits: list
    outputs: list
    retries: list


class Submission:
    """A submission's exercises of one lesson, reached only through a child process.

    `submission.name(*args)` calls the exercise in the child; `submission.probe(name, ...)`
    runs ddpcourse/course/probes.py's function beside it; `submission.job(...)` launches a
    grading job there. Values come back as data; errors come back as the same built-in
    exception types (and, for the submission's own exception classes, judge-side classes of
    the same name); a crash, hang, exit or memory overrun fails the request with
    SubmissionError, and the next request starts a fresh child.
    """

    def __init__(self, lesson: int):
        self._lesson = lesson
        self._files, self._refused = handed_in(lesson)
        self._proc = None
        self._world = 0
        self._seq = 0
        self._classes: dict[str, type] = {}
        self._ended_why = ""
        self._output: list[bytes] = []
        self.isolated = is_root()

    # --- the child's life ------------------------------------------------------------------

    def _start(self) -> None:
        if self._refused:
            raise SubmissionError(f"the submission {self._refused}")
        scratch = Path(tempfile.mkdtemp(prefix="course-sandbox-"))
        self._scratch = scratch
        os.chmod(scratch, 0o711)
        release = scratch / "release"
        copy_release(release)
        submission = scratch / "submission" / f"lesson{self._lesson}"
        submission.mkdir(parents=True)
        for name, data in self._files.items():
            (submission / name).write_bytes(data)
        home = scratch / "home"
        (home / "tmp").mkdir(parents=True)
        venv = Path(sys.prefix)
        env = {"PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home),
               "TMPDIR": str(home / "tmp"), "PYTHONPATH": str(release),
               "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1",
               "COURSE_SUBMISSION": str(scratch / "submission"), "COURSE_IMPL": "student",
               "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
               "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
        self._env = env
        requests_r, requests_w = os.pipe()
        replies_r, replies_w = os.pipe()
        python = real_python()
        cmd = [python, "-m", "ddpcourse.course.sandbox_child", f"--requests={requests_r}",
               f"--replies={replies_w}", f"--lesson={self._lesson}"]
        if os.environ.get("COURSE_GRADING_JOBS", "").strip():  # jobs replayed: none to fork
            cmd.append("--no-fork-server")
        self._uid = None
        self._output = []
        if self.isolated:
            self._uid, self._uid_lock = take_uid_slot()
            for path in [home, *home.rglob("*")]:
                os.chown(path, self._uid, self._uid)
            os.chmod(home, 0o700)
            for path in (release, submission.parent):  # readable, never writable, by it
                for p in [path, *path.rglob("*")]:
                    os.chmod(p, 0o755 if p.is_dir() else 0o644)
            (scratch / "root").mkdir()
            view = {"root": str(scratch / "root"), "writable": [str(home)],
                    "readable": list(dict.fromkeys(
                        [os.path.realpath(p) for p in (sys.base_prefix, sys.prefix)]
                        + [str(release), str(submission.parent)]))}
            self._view = view
            zygote = os.environ.get("COURSE_SANDBOX_ZYGOTE", "")
            self._proc = ZygoteChild.start(zygote, {
                "uid": self._uid, "env": env, "release": str(release), "lesson": self._lesson,
                **view, "fork_server": "--no-fork-server" not in cmd},
                (requests_r, replies_w)) if zygote else None
            cmd += [f"--uid={self._uid}", f"--root={view['root']}",
                    *[f"--readable={p}" for p in view["readable"]],
                    *[f"--writable={p}" for p in view["writable"]]]
            cmd = ["unshare", "--mount", "--ipc", "--net", "--pid", "--fork", "--kill-child",
                   "--mount-proc", "--propagation", "private", "--", *cmd]
        else:  # what it starts and leaves behind is reparented to this process, then ended
            ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
            # Namespaces of its own inside a user namespace, where the kernel lends one.
            self._proc = ZygoteChild.start(zygote_socket(), {
                "uid": None, "env": env, "release": str(release),
                "lesson": self._lesson, "keep": kept_in_view(scratch),
                "fork_server": "--no-fork-server" not in cmd},
                (requests_r, replies_w)) if user_namespaces() else None
        if self._proc is None:
            self._proc = subprocess.Popen(cmd, env=env, cwd=str(home),
                                          pass_fds=(requests_r, replies_w),
                                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        os.close(requests_r)
        os.close(replies_w)
        self._requests, self._replies = requests_w, replies_r
        self._ended_why = ""
        threading.Thread(target=self._drain, args=(self._proc,), daemon=True).start()
        threading.Thread(target=self._watch_memory, args=(self._proc,), daemon=True).start()
        if self._world:
            self._request({"op": "world", "one": True})

    def _drain(self, proc) -> None:
        kept = 0
        for line in proc.stdout:
            if kept < 200_000:  # what the submission printed, for a failure's message
                self._output.append(line)
                kept += len(line)

    def _watch_memory(self, proc) -> None:
        # Only while this child is the one this Submission holds: its user id passes to the
        # next sandbox once it is closed, and this watch must not judge that one.
        while proc.poll() is None and self._proc is proc:
            theirs = processes_of(self._uid, proc.pid)
            pids = [proc.pid, *theirs]
            held = tmpfs_bytes(theirs, [str(self._scratch / "home"), "/tmp", "/dev/shm"]) \
                if self._uid is not None else 0
            used = resident_upper_bound(pids) + held
            if used > MEMORY_LIMIT:  # the exact count (smaps) only when it may be over
                used = resident_bytes(pids) + held
            if used > MEMORY_LIMIT:
                if self._proc is not proc:
                    return
                self._ended_why = (f"used {used / 2**30:.1f} GB of memory, more than the "
                                   f"limit of {MEMORY_LIMIT / 2**30:g} GB")
                self._kill()
                return
            time.sleep(1.0)

    def _kill(self) -> None:
        proc = self._proc
        if proc is None:
            return
        for _ in range(3):
            pids = processes_of(self._uid, proc.pid)
            if self._uid is None:  # orphans of the child's, reparented to this process
                pids += processes_of(None, os.getpid())
            for pid in [*pids, proc.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            if not processes_of(self._uid, proc.pid if self._uid else os.getpid()):
                break
            time.sleep(0.1)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        """End the child and everything it started; remove its scratch tree."""
        if self._proc is None:
            return
        self._kill()
        for fd in (self._requests, self._replies):
            try:
                os.close(fd)
            except OSError:
                pass
        self._proc = None
        remove_tree(self._scratch)
        lock = getattr(self, "_uid_lock", None)
        if lock is not None:
            lock.close()
            self._uid_lock = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def output(self) -> str:
        return b"".join(self._output).decode(errors="replace")

    # --- requests --------------------------------------------------------------------------

    def _request(self, request: dict, timeout: float = CALL_TIMEOUT):
        if self._proc is None or self._proc.poll() is not None:
            self.close()
            self._start()
        self._seq += 1
        request = dict(request, seq=self._seq)
        data = frames.encode(request)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._requests, view):]
            reply = self._read_reply(timeout)
        except BaseException:  # a time limit, a crash, a forged reply: never reuse the child
            why = self._ended_why
            self.close()
            if why:
                raise SubmissionError(f"the submission {why}") from None
            raise
        if reply.get("seq") != self._seq:
            self.close()
            raise SubmissionError("the submission wrote on the grader's channel")
        if "raised" in reply:
            raise self._exception(reply["raised"])
        return from_data(reply["value"])

    def _read_reply(self, timeout: float) -> dict:

        deadline = time.monotonic() + timeout
        try:
            reply = frames.read_frame(lambda n: self._read(n, deadline, timeout))
        except frames.FrameTooLarge:
            raise SubmissionError(f"the submission's answer is over {frames.LIMIT} bytes") \
                from None
        if not isinstance(reply, dict):
            raise SubmissionError("the submission wrote on the grader's channel")
        return reply

    def _read(self, n: int, deadline: float, timeout: float) -> bytes:
        chunks = []
        while n:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._replies], [], [], max(0.0, min(left, 1.0)))
            if not ready:
                if time.monotonic() >= deadline:
                    raise SubmissionError(f"the submission did not answer in {timeout:g} s")
                if self._proc.poll() is not None and not self._ended_why:
                    self._ended_why = (f"ended its process (exit status "
                                       f"{self._proc.returncode})")
                continue
            chunk = os.read(self._replies, min(n, 1 << 20))
            if not chunk:
                self._proc.wait()
                raise SubmissionError("the submission " + (
                    self._ended_why or f"ended its process (exit status "
                                       f"{self._proc.returncode})"))
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def _exception(self, raised: dict) -> BaseException:
        builtin = getattr(builtins, str(raised["builtin"]), Exception)
        if not isinstance(builtin, type) or not issubclass(builtin, BaseException) or \
                not issubclass(builtin, Exception):
            # SystemExit, KeyboardInterrupt, pytest's Exit: they end only this request
            return SubmissionError(f"the submission's code raised {raised['builtin']}: "
                                   f"{raised['message'][:300]}")
        own = [self._own_class(name) for name in raised["mro"]
               if name in self._classes]
        cls = type(raised["mro"][0], (*own, builtin) if own else (builtin,), {}) \
            if own else builtin
        try:
            error = cls(raised["message"])
        except Exception:
            error = RuntimeError(raised["message"])
        error.submission_traceback = raised["where"]
        return error

    def _own_class(self, name: str) -> type:
        if name not in self._classes:
            self._classes[name] = type(name, (SubmissionException,), {})
        return self._classes[name]

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if name[:1].isupper() and name.endswith(("Error", "Exception")):
            return self._own_class(name)  # pytest.raises(ex.SnapshotError)

        def call(*args, **kwargs):
            return self._request({"op": "call", "name": name, "args": to_judge(args),
                                  "kwargs": to_judge(kwargs), **self._options})
        call.__name__ = name
        return call

    _options: dict = {}

    def probe(self, name: str, *args, refuse=(), env=None, **kwargs):
        """ddpcourse/course/probes.py's `name`(exercises, *args, **kwargs), run in the child."""
        return self._request({"op": "probe", "name": name, "args": to_judge(args),
                              "kwargs": to_judge(kwargs),
                              "refuse": [*self._options.get("refuse", []), *refuse],
                              "env": {**self._options.get("env", {}), **(env or {})},
                              "replace": self._options.get("replace", {})})

    @contextmanager
    def options(self, refuse=(), env=None, replace=None):
        """Calls made inside refuse these functions and see these environment variables; and
        replace {name: probe}: the submission's own function `name` is, for each of them,
        ddpcourse/course/probes.py's `probe` (the same arguments), so that an exercise that
        builds on another is graded with the grader's version of that one."""
        saved = self._options
        self._options = {"refuse": [*saved.get("refuse", []), *refuse],
                         "env": {**saved.get("env", {}), **(env or {})},
                         "replace": {**saved.get("replace", {}), **(replace or {})}}
        try:
            yield self
        finally:
            self._options = saved

    @contextmanager
    def world_of_one(self):
        """Calls made inside run in a one-process gloo world in the child."""
        self._world += 1
        if self._world == 1:
            self._request({"op": "world", "one": True})
        try:
            yield
        finally:
            self._world -= 1
            if self._world == 0 and self._proc is not None and self._proc.poll() is None:
                self._request({"op": "world", "one": False})

    def job(self, worker: str, script_args=(), timeout: float = 600, **launch) -> \
            subprocess.CompletedProcess:
        """A grading worker (ddpcourse/course/workers/<worker>) launched under torchrun by the
        child, so that every rank is inside the sandbox too."""
        workers = "ddpcourse/course/workers/" + worker
        result = self._request({"op": "job", "worker": workers,
                                "script_args": list(script_args),
                                "launch": dict(launch, timeout=timeout)}, timeout=timeout + 60)
        done = subprocess.CompletedProcess(worker, result["returncode"], result["stdout"],
                                           result["stderr"])
        done.observations = result.get("observations")
        return done


    def relayed_job(self, worker: str, nproc: int, nnodes: int = 1, args=(),
                    timeout: float = 60, refuse_collectives: bool = False) -> RelayedJob:
        """A grading worker (ddpcourse/course/workers/<worker>) run as nnodes x nproc ranks, each
        in a sandbox of its own whose one road to the others is the relay (relay.py), which
        this process holds. The ranks get the variables torchrun sets; each is stopped when
        `timeout` passes or the submission's memory goes over its limit."""
        from ddpcourse.course.relay import Relay

        if self._proc is None or self._proc.poll() is not None:
            self._request({"op": "world", "one": False})  # its scratch tree and user id
        world = nproc * nnodes
        relay = Relay(world, refuse_collectives=refuse_collectives)
        workers = str(self._scratch / "release" / "ddpcourse" / "course" / "workers" / worker)
        ranks, retries = [], []
        try:
            for rank in range(world):
                env = dict(self._env, RANK=str(rank), WORLD_SIZE=str(world),
                           LOCAL_RANK=str(rank % nproc), LOCAL_WORLD_SIZE=str(nproc),
                           GROUP_RANK=str(rank // nproc), NODE_RANK=str(rank // nproc),
                           ROLE_RANK=str(rank), ROLE_WORLD_SIZE=str(world),
                           TORCHELASTIC_RESTART_COUNT="0")
                request = {"kind": "rank", "uid": self._uid, "env": env, "worker": workers,
                           "args": list(args), "release": str(self._scratch / "release"),
                           "keep": kept_in_view(self._scratch),
                           **(self._view if self._uid is not None else {})}
                started = None
                for _ in range(2):  # the grader's own failure, before any code ran
                    started = ZygoteChild.start(zygote_socket(), request,
                                                (relay.rank_end(rank),))
                    if started is not None:
                        break
                    retries.append(f"rank {rank} of {worker}: the zygote did not answer")
                if started is None:
                    raise SubmissionError(f"could not start rank {rank} of {worker}")
                ranks.append(started)
            relay.close_rank_ends()
            relay.start()
            outputs = [[] for _ in ranks]
            drains = [threading.Thread(target=lambda p=p, o=o: o.extend(p.stdout), daemon=True)
                      for p, o in zip(ranks, outputs, strict=True)]
            for thread in drains:
                thread.start()
            exits = self._wait_for_ranks(ranks, timeout)
            for thread in drains:
                thread.join(timeout=5)
        finally:
            for proc in ranks:
                _kill_rank(proc)
            relay.close()
        return RelayedJob(relay.notes, relay.record, relay.secrets, exits,
                          [b"".join(o).decode(errors="replace")[-20_000:] for o in outputs],
                          retries)

    def _wait_for_ranks(self, ranks: list, timeout: float) -> list:
        deadline = time.monotonic() + timeout
        while True:
            codes = [p.poll() for p in ranks]
            if all(c is not None for c in codes):
                return codes
            if time.monotonic() > deadline:
                why = f"still running after {timeout:g} s"
                break
            pids = [p.pid for p in ranks]
            pids += [d for p in ranks for d in processes_of(None, p.pid)]
            if resident_upper_bound(pids) > MEMORY_LIMIT and resident_bytes(pids) > MEMORY_LIMIT:
                why = f"used more than the limit of {MEMORY_LIMIT / 2**30:g} GB of memory"
                break
            time.sleep(0.05)
        for proc in ranks:
            _kill_rank(proc)
        return [c if c is not None else why for c in codes]


def _kill_rank(proc) -> None:
    """A rank's sandbox: the process the judge holds, and (no namespace around it) what it
    started."""
    if proc.poll() is not None:
        return
    for pid in [*processes_of(None, proc.pid), proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def checked_tensor(tensor):
    """A tensor the child sent, once its shape, strides and storage agree: plain, inside its
    storage, and no more elements than the storage holds. torch.load rebuilds whatever view
    the bytes describe, and a view of a few bytes can stand for gigabytes once the judge
    computes with it."""
    import torch

    if tensor.layout != torch.strided:
        raise SubmissionError("the submission's answer holds a tensor that is not plain")
    if tensor.numel() == 0:
        return tensor
    size, stride = list(tensor.shape), list(tensor.stride())
    storage = tensor.untyped_storage().nbytes()
    last = tensor.storage_offset() + sum((n - 1) * st for n, st in zip(size, stride, strict=True))
    inside = min(stride, default=0) >= 0 and (last + 1) * tensor.element_size() <= storage
    if not inside or tensor.numel() * tensor.element_size() > storage:
        raise SubmissionError(f"the submission's answer holds a tensor of shape {size} and "
                              f"strides {stride} over {storage} bytes of storage")
    return tensor


def to_judge(obj):
    """Arguments for the child: Handles as the child knows them, the rest as it is."""
    if isinstance(obj, Handle):
        return {"__handle__": obj.key, "type": obj.type_name}
    if isinstance(obj, (list, tuple)):
        items = [to_judge(v) for v in obj]
        return items if isinstance(obj, list) else tuple(items)
    if isinstance(obj, dict):
        return {k: to_judge(v) for k, v in obj.items()}
    return obj


def from_data(obj):
    """The child's answer, already read with weights_only=True: handles, sets and arrays
    rebuilt; anything else must be plain data."""
    import torch

    if type(obj) is torch.Tensor:
        return checked_tensor(obj)
    if obj is None or type(obj) in (bool, int, float, str, bytes, complex):
        return obj
    if isinstance(obj, list):
        return [from_data(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(from_data(v) for v in obj)
    if isinstance(obj, dict):
        keys = set(obj)
        if keys == {"__handle__", "type"}:
            return Handle(int(obj["__handle__"]), str(obj["type"]))
        if keys == {"__set__"}:
            return set(from_data(obj["__set__"]))
        if keys == {"__ndarray__"}:
            return checked_tensor(obj["__ndarray__"]).numpy()
        if keys == {"__object__", "fields"} and isinstance(obj["fields"], dict):
            return Returned(str(obj["__object__"]), from_data(obj["fields"]))
        if keys == {"__repr__"}:
            return str(obj["__repr__"])
        return {from_data(k): from_data(v) for k, v in obj.items()}
    raise SubmissionError(f"the submission's answer holds a {type(obj).__name__}")
