"""A real SLURM cluster on the course's own hosts, for one run: submit a batch script to it.

    python -m ddpcourse.cluster.slurm run [--hosts 2] [--nproc P] [--timeout S]
                                          [SBATCH_OPTIONS] FILE [ARGS]
    python -m ddpcourse.cluster.slurm check          # can this machine run the cluster? (0 or 2)
    python -m ddpcourse.cluster.slurm cleanup-stale  # what a run killed with -9 left behind

`run` makes the hosts of ddpcourse.cluster.hosts, starts SLURM's own daemons on them, submits FILE
with `sbatch --wait` from host 0 (as a student would from a cluster's login node), shows the
job's output file as it grows, removes everything and exits with the job's exit status.
--hosts becomes sbatch's --nodes; --nproc is exported to the job as NPROC (processes per node,
which scripts/lesson5_slurm.sbatch hands to torchrun); SBATCH_OPTIONS (--name=value) go to
sbatch as they are, e.g. --ntasks-per-node=3. HOSTS, NPROC and TIMEOUT in the environment
are the defaults, as for ddpcourse.cluster.hosts.

The cluster, all of it in the run's own namespaces and temporary folder:

    host 0   munged, slurmctld (the controller: queue, nodes, jobs), slurmd
    host k   slurmd -N host<k> (the node daemon: it starts the job's tasks on its host)

- Each host's daemons run in a UTS namespace whose hostname is host<k>, so `hostname` inside
  a job names its node, as on a real cluster.
- Authentication is munge, as on real clusters: a key made for this run and a munged of its
  own whose socket lies in the run's folder (slurm.conf names it in AuthInfo). Only host 0
  runs munged; the other hosts reach its socket through the file system they share.
- No cgroups: processes are tracked by parentage (proctrack/linuxproc), tasks are not bound
  to cores (task/none), and cgroup.conf names cgroup/v1 only to stop slurmd from probing
  /sys/fs/cgroup, which `ip netns exec` hides.
- The usual ports (6817 slurmctld, 6818 slurmd): every run has its own network, so two runs
  at once do not meet.
- The hosts share this machine's cores and GPUs and SLURM here hands out no GPUs, so each
  node claims CPUS_PER_NODE CPUs (slurmd reports the configured count) and jobs run on the
  CPU with gloo (CUDA_VISIBLE_DEVICES is empty).

Needs what ddpcourse.cluster.hosts needs (Linux, root, `ip`) and the packages slurm-wlm and munge.
Standard library only, like ddpcourse.cluster.hosts.
"""

from __future__ import annotations

import argparse
import codecs
import itertools
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from ddpcourse.cluster import hosts as H
from ddpcourse.cluster.launch import AgentFailureSummary, LaunchError, positive_int

INSTALL = "install slurm-wlm and munge (apt-get install slurm-wlm munge)"
# The daemons live in sbin, which is not on every PATH.
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo", "scancel",
            "unshare", "hostname")
SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin")
CPUS_PER_NODE = 64          # enough for any NPROC the launchers accept
START_TIMEOUT = 30          # seconds for the nodes to report idle
FOLDER_MARK = "-slurm-"     # the run's folder: <tempdir>/ddpc<pid>-<n>-slurm-XXXX


class SlurmError(H.HostsError):
    """A problem making or using the cluster, reported as one line."""


# --- what the machine must offer ----------------------------------------------------------------

def find_programs() -> tuple[dict[str, str], list[str]]:
    """({name: path}, [missing names]) for the programs the cluster runs."""
    path = os.pathsep.join([os.environ.get("PATH", ""), *SBIN])
    found = {name: shutil.which(name, path=path) for name in PROGRAMS}
    return ({k: v for k, v in found.items() if v}, [k for k, v in found.items() if not v])


def unavailable_reason() -> str | None:
    """Why the cluster cannot run here (one line, ending in what to do instead), or None."""
    reason = H.unavailable_reason()  # Linux, root and `ip`; it ends with the 127.0.0.1 way
    if reason:
        return reason
    missing = find_programs()[1]
    slurm = [name for name in missing if name not in ("unshare", "hostname")]
    if slurm:
        return f"SLURM on the course's hosts needs {', '.join(slurm)}: {INSTALL}"
    if missing:
        return (f"SLURM on the course's hosts needs {' and '.join(missing)}: install "
                "util-linux and hostname")
    return None


# --- the configuration --------------------------------------------------------------------------

def slurm_conf(folder: str, nodes: int, munge_socket: str, cpus: int = CPUS_PER_NODE,
               kill_wait: int = 5, requeue_wait: int | None = None) -> str:
    """slurm.conf for a cluster of `nodes` hosts whose files all lie under `folder`.
    kill_wait: seconds from the SIGTERM that stops a job to the SIGKILL (SLURM's default: 30).
    requeue_wait: seconds a requeued job waits before it may start again (SLURM's cred_expire,
    also the lifetime of a job step's credential; None: SLURM's default, 120)."""
    lines = [
        "# A throw-away cluster made by ddpcourse.cluster.slurm on ddpcourse.cluster.hosts' hosts",
        "ClusterName=course",
        f"SlurmctldHost=host0({H.address(0)})",
        "SlurmUser=root",
        "SlurmdUser=root",
        # munge with this run's own munged (socket) and key
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}"
        + (f",cred_expire={requeue_wait}" if requeue_wait else ""),
        # No cgroups: track processes by parentage, do not bind tasks to cores
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "MpiDefault=none",
        # Nothing to account for, nobody to mail
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "JobAcctGatherType=jobacct_gather/none",
        f"MailProg={shutil.which('true') or '/bin/true'}",
        # Every file of the cluster lies in the run's folder (%n: the node's name)
        f"StateSaveLocation={folder}/state",
        f"SlurmdSpoolDir={folder}/%n/spool",
        f"SlurmdPidFile={folder}/%n/slurmd.pid",
        f"SlurmdLogFile={folder}/%n/slurmd.log",
        f"SlurmctldPidFile={folder}/slurmctld.pid",
        f"PlugStackConfig={folder}/plugstack.conf",  # not the machine's /etc/slurm one
        # sbatch --wait polls every 2 s only while MinJobAge / 2 <= 2, else 8 s and more
        "MinJobAge=5",
        "SchedulerParameters=batch_sched_delay=0",  # start batch jobs at once, not 3 s later
        f"KillWait={kill_wait}",       # seconds from SIGTERM to SIGKILL for a stopped job
        "ReturnToService=2",           # a node that restarts is usable at once
        "EnforcePartLimits=ALL",       # refuse a job that cannot fit, instead of queueing it
        "SlurmdParameters=config_overrides",  # the hosts share the cores: trust these counts
    ]
    # Each host has the machine's memory (they share it): a job that asks for --mem fits.
    memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    lines += [f"NodeName=host{k} NodeAddr={H.address(k)} CPUs={cpus} "
              f"RealMemory={memory_mb} State=UNKNOWN"
              for k in range(nodes)]
    lines.append("PartitionName=course Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


# slurmd starts a cgroup plugin even when nothing uses it, and its autodetection looks at
# /sys/fs/cgroup, which is empty in a host (`ip netns exec` mounts a fresh /sys). Naming the
# v1 plugin skips the detection; with linuxproc and task/none it is never asked for anything.
CGROUP_CONF = "CgroupPlugin=cgroup/v1\n"


# --- runs killed with -9 ------------------------------------------------------------------------

def stale_folders() -> list[str]:
    """The folders of runs whose process is gone (the pid is in the name, as for namespaces)."""
    top = tempfile.gettempdir()
    found = []
    for name in sorted(os.listdir(top)):
        m = re.match(rf"{H.NAME_PREFIX}(\d+)-\d+{FOLDER_MARK}", name)
        if m and not H._owner_alive(int(m.group(1))):
            found.append(os.path.join(top, name))
    return found


def cleanup_stale() -> list[str]:
    """Remove what runs killed with -9 left: namespaces (and the daemons in them), folders."""
    removed = H.cleanup_stale()
    for folder in stale_folders():
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


# --- the cluster --------------------------------------------------------------------------------

@dataclass
class Job:
    """What became of one `sbatch --wait`."""
    command: list[str]      # as run, inside host 0
    returncode: int         # the job's exit status; 124 when it ran out of time
    job_id: str | None      # None when sbatch refused the job
    output: str             # the job's output file: its stdout and stderr
    sbatch_output: str      # what sbatch itself said
    seconds: float


class Cluster:
    """A SLURM cluster of `count` hosts for the duration of a `with` block.

        with Cluster(2) as cluster:
            job = cluster.sbatch("scripts/lesson5_slurm.sbatch", ["scripts/lesson1_whoami.py"])

    Everything goes when the block ends, also after an exception, Ctrl-C or SIGTERM: the hosts
    go (ddpcourse.cluster.hosts stops every process inside them: daemons and jobs), then the folder.
    """

    def __init__(self, count: int = 2, start_timeout: float = START_TIMEOUT,
                 kill_wait: int = 5, requeue_wait: int | None = None):
        self.hosts = H.Hosts(count)
        self.count = count
        self.waits = {"kill_wait": kill_wait, "requeue_wait": requeue_wait}
        self.start_timeout = start_timeout
        self.folder = ""
        self.conf = ""
        self.start_seconds = 0.0
        self.programs: dict[str, str] = {}
        self._daemons: list[tuple[str, subprocess.Popen]] = []
        self._logs: list = []
        self._job_numbers = itertools.count()

    # Making and removing ------------------------------------------------------------------

    def __enter__(self) -> Cluster:
        reason = unavailable_reason()
        if reason:
            raise SlurmError(reason)
        self.programs = find_programs()[0]
        started = time.monotonic()
        self.hosts.__enter__()  # removes stale namespaces; traps SIGTERM for the cleanup
        try:
            for folder in stale_folders():
                shutil.rmtree(folder, ignore_errors=True)
            self.folder = tempfile.mkdtemp(prefix=f"{self.hosts.run_id}{FOLDER_MARK}")
            os.chmod(self.folder, 0o755)  # munged wants every folder above its socket searchable
            self._write_files()
            self._start_daemons()
            self._wait_until_idle()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self.start_seconds = time.monotonic() - started
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.hosts.__exit__(*exc)  # TERM, then KILL, every process in the hosts
        finally:
            for _, daemon in self._daemons:
                try:
                    daemon.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    daemon.kill()
            for log in self._logs:
                log.close()
            self._daemons, self._logs = [], []
            if self.folder:
                shutil.rmtree(self.folder, ignore_errors=True)

    def path(self, *parts: str) -> str:
        return os.path.join(self.folder, *parts)

    def _write_files(self) -> None:
        for k in range(self.count):
            os.makedirs(self.path(f"host{k}", "spool"))
        os.makedirs(self.path("state"))
        os.makedirs(self.path("munge"))
        # A fresh key: only this run's daemons and commands can talk to each other.
        key = os.open(self.path("munge", "munge.key"), os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                      0o400)
        with os.fdopen(key, "wb") as f:
            f.write(os.urandom(1024))
        self.conf = self.path("slurm.conf")
        files = {"slurm.conf": slurm_conf(self.folder, self.count, self.munge_socket,
                                                 **self.waits),
                 "cgroup.conf": CGROUP_CONF,   # read from slurm.conf's folder
                 "plugstack.conf": ""}
        for name, text in files.items():
            with open(self.path(name), "w") as f:
                f.write(text)

    @property
    def munge_socket(self) -> str:
        return self.path("munge", "munge.socket")

    def env(self, base: dict | None = None) -> dict:
        """An environment for SLURM's commands and daemons: this cluster's slurm.conf, and
        nothing left from a SLURM job this process may itself be running in."""
        base = dict(os.environ if base is None else base)
        env = {key: value for key, value in base.items()
               if not key.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
        env["SLURM_CONF"] = self.conf
        return env

    def _daemon(self, name: str, k: int, argv: list[str], hostname: bool) -> None:
        log = open(self.path(f"host{k}", f"{name}.out"), "wb")
        self._logs.append(log)
        proc = self.hosts.popen(k, argv, env=self.env(), hostname=hostname,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self._daemons.append((f"{name} on host{k}", proc))

    def _start_daemons(self) -> None:
        p = self.programs
        self._daemon("munged", 0, [
            p["munged"], "--foreground", f"--socket={self.munge_socket}",
            f"--key-file={self.path('munge', 'munge.key')}",
            f"--pid-file={self.path('munge', 'munged.pid')}",
            f"--seed-file={self.path('munge', 'munged.seed')}"], hostname=False)
        self._wait_for(lambda: os.path.exists(self.munge_socket), 10,
                       "munged made no socket")
        # -D: stay in the foreground, as our child, logging to its .out file too
        self._daemon("slurmctld", 0, [p["slurmctld"], "-D", "-f", self.conf], hostname=True)
        for k in range(self.count):
            self._daemon("slurmd", k, [p["slurmd"], "-D", "-N", f"host{k}", "-f", self.conf],
                         hostname=True)

    def _check_daemons(self) -> None:
        for name, daemon in self._daemons:
            if daemon.poll() is not None:
                raise SlurmError(f"{name} stopped (exit status {daemon.returncode}) while the "
                                 f"cluster started{self._last_words(name)}")

    def _wait_for(self, ready, timeout: float, failure: str, detail=lambda: "") -> None:
        deadline = time.monotonic() + timeout
        while True:
            self._check_daemons()
            if ready():
                return
            if time.monotonic() > deadline:
                raise SlurmError(f"{failure} within {timeout:g} s{detail()}")
            time.sleep(0.1)

    def _wait_until_idle(self) -> None:
        states: dict[str, str] = {}

        def idle() -> bool:
            states.update(self.node_states(timeout=1))  # then see whether a daemon stopped
            return len(states) == self.count and set(states.values()) == {"idle"}

        def detail() -> str:
            said = " ".join(f"{node} {state}" for node, state in sorted(states.items()))
            return f" ({said or 'the controller did not answer'})"

        self._wait_for(idle, self.start_timeout, "the nodes were not idle", detail)

    def _last_words(self, name: str) -> str:
        """What a daemon ("slurmd on host1") said last: its last error, else its last line."""
        daemon, k = name.split(" on host")
        try:
            with open(self.path(f"host{k}", f"{daemon}.out"), errors="replace") as f:
                lines = [line.strip() for line in f if line.strip()]
        except OSError:
            return ""
        errors = [line for line in lines if re.search(r"error|fatal", line, re.I)]
        return f"; it said: {(errors or lines or [''])[-1]}" if lines else ""

    # Using it ------------------------------------------------------------------------------------

    def run(self, argv: list[str], k: int = 0, timeout: float = 30,
            **kwargs) -> subprocess.CompletedProcess:
        """A SLURM command (sinfo, scontrol, ...) run in host k, e.g. run(["sinfo"])."""
        argv = [self.programs.get(argv[0], argv[0]), *argv[1:]]
        return subprocess.run(self.hosts.command(k, argv), env=self.env(),
                              capture_output=True, text=True, timeout=timeout, **kwargs)

    def node_states(self, timeout: float = 30) -> dict[str, str]:
        """{node: state} as sinfo reports it ({} while the controller does not answer)."""
        try:  # sinfo itself keeps trying to reach the controller for up to 10 s
            result = self.run(["sinfo", "--noheader", "--Node", "--format=%N %T"],
                              timeout=timeout)
        except subprocess.TimeoutExpired:
            return {}
        pairs = (line.split() for line in result.stdout.splitlines())
        return {p[0]: p[1] for p in pairs if len(p) == 2} if result.returncode == 0 else {}

    def job_env(self, extra: dict | None = None, base: dict | None = None) -> dict:
        """The environment sbatch passes to the job (sbatch exports it all by default)."""
        env = self.env(base)
        env["CUDA_VISIBLE_DEVICES"] = ""  # SLURM here hands out no GPUs: the CPU, with gloo
        env.update(extra or {})
        return env

    def sbatch(self, script: str, script_args: list[str] | None = None,
               options: list[str] | None = None, extra_env: dict | None = None,
               timeout: float = 600, cwd: str | None = None, echo: bool = False) -> Job:
        """Submit `script` with `sbatch --wait` from host 0 and wait for the job to end.

        With echo: the command first, then what sbatch says and the job's output file as it
        grows. A job still running after `timeout` seconds is cancelled (returncode 124).
        """
        output = self.path(f"job{next(self._job_numbers)}.out")
        # stdbuf: sbatch's "Submitted batch job N" comes at once, not when the job has ended
        stdbuf = [shutil.which("stdbuf"), "-oL"] if shutil.which("stdbuf") else []
        argv = [*stdbuf, self.programs["sbatch"], "--wait", f"--nodes={self.count}",
                f"--output={output}", *(options or []), script, *(script_args or [])]
        command = self.hosts.command(0, argv)
        if echo:
            shown = {"SLURM_CONF": self.conf, "CUDA_VISIBLE_DEVICES": "", **(extra_env or {})}
            prefix = "".join(f"{key}={shlex.quote(value)} " for key, value in shown.items())
            print("$ " + prefix + shlex.join(command), flush=True)
        # What a person reads: torchrun's output with a one-line summary after a failure
        # report, as ddpcourse.cluster.launch shows it (COURSE_RAW_TORCHRUN=1: without).
        raw = os.environ.get("COURSE_RAW_TORCHRUN", "") not in ("", "0")
        readable = AgentFailureSummary(_write) if echo and not raw else None
        follower = _Follower(output, readable.feed if readable else _write if echo else None)
        started = time.monotonic()
        sbatch = subprocess.Popen(command, env=self.job_env(extra_env), cwd=cwd,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        said: list[str] = []
        reader = threading.Thread(target=_collect, args=(sbatch.stdout, said, echo),
                                  daemon=True)
        reader.start()
        try:
            returncode = sbatch.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            job_id = _job_id("".join(said))
            # Killing sbatch --wait leaves the job running: cancel it (all of ours if its
            # number is not known yet).
            me = pwd.getpwuid(os.getuid()).pw_name
            self.run(["scancel", job_id] if job_id else ["scancel", f"--user={me}"])
            returncode = 124
        finally:  # also on Ctrl-C: sbatch must end before its output is complete
            if sbatch.poll() is None:
                sbatch.kill()
                try:  # bounded: a Ctrl-C inside wait() can leave Popen's lock taken
                    sbatch.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    pass
            reader.join(timeout=10)
            follower.stop()
            if readable:
                readable.close()
        return Job(command, returncode, _job_id("".join(said)), follower.text, "".join(said),
                   time.monotonic() - started)

    def describe(self) -> str:
        nodes = ", ".join(f"host{k}" for k in range(self.count))
        return (f"SLURM on them: slurmctld and munged on host0, slurmd on {nodes} (all idle "
                f"after {self.start_seconds:.1f} s; config {self.conf})")


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _job_id(said: str) -> str | None:
    found = re.search(r"Submitted batch job (\d+)", said)
    return found.group(1) if found else None


def _collect(pipe, lines: list[str], echo: bool) -> None:
    """Keep every line of `pipe` (and show it)."""
    for line in pipe:
        lines.append(line)
        if echo:
            _write(line)


class _Follower:
    """Reads a file as it grows (a job's output); hands each whole line to `emit`, if given."""

    def __init__(self, path: str, emit=None):
        self.path, self.emit = path, emit
        self._data = b""
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    @property
    def text(self) -> str:
        return self._data.decode(errors="replace")

    def _follow(self) -> None:
        while True:
            done = self._done.is_set()  # read once more after the job ended
            self._read()
            if done:
                if self.emit and self._partial:
                    self.emit(self._partial)
                return
            self._done.wait(0.2)

    def _read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(len(self._data))
                new = f.read()
        except OSError:  # not there yet: the job has not started
            return
        self._data += new
        if new and self.emit:
            *lines, self._partial = (self._partial + self._decoder.decode(new)).split("\n")
            for line in lines:
                self.emit(line + "\n")

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=10)


# --- the command line ---------------------------------------------------------------------------

OUR_OPTIONS = ("--hosts", "--nproc", "--timeout")


def split_run_args(words: list[str]) -> tuple[list[str], list[str], list[str]]:
    """`run`'s words as (our options, sbatch's options, [FILE, ARGS...]).

    Before FILE, --hosts/--nproc/--timeout (with a value) are ours; any other option goes to
    sbatch and must carry its value after '=' (--ntasks-per-node=3).
    """
    ours: list[str] = []
    sbatch: list[str] = []
    i = 0
    while i < len(words) and words[i].startswith("-"):
        word = words[i]
        if word.split("=", 1)[0] in OUR_OPTIONS:
            ours.append(word)
            if "=" not in word and i + 1 < len(words):
                ours.append(words[i + 1])
                i += 1
        elif word in ("-h", "--help"):
            ours.append(word)
        else:
            sbatch.append(word)
        i += 1
    return ours, sbatch, words[i:]


def run_job(script: str, script_args: list[str], hosts: int, nproc: int | None,
            timeout: float, sbatch_options: list[str]) -> int:
    """Make the cluster, submit the script, show its output, remove it all; the job's status."""
    extra = {"NPROC": str(nproc)} if nproc else {}
    if "OMP_NUM_THREADS" not in os.environ:  # the hosts share this machine's cores
        extra["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // (hosts * (nproc or 1))))
    with Cluster(hosts) as cluster:
        print(cluster.hosts.describe(), flush=True)
        print("".join(note + "\n" for note in cluster.hosts.notes), end="", file=sys.stderr)
        print(cluster.describe(), flush=True)
        job = cluster.sbatch(script, script_args, sbatch_options, extra, timeout=timeout,
                             echo=True)
    if job.returncode == 124:
        print(f"error: the job did not finish within {timeout:g} s and was stopped",
              file=sys.stderr)
    elif job.job_id is None:  # sbatch refused it, saying why just above
        print("error: sbatch did not take the job (its message is above)", file=sys.stderr)
    else:
        print(f"job {job.job_id} ended with exit status {job.returncode} after "
              f"{job.seconds:.1f} s; the cluster is gone again", flush=True)
    return job.returncode


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m ddpcourse.cluster.slurm",
                                     description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="submit FILE to a throw-away cluster on the hosts",
                         usage="%(prog)s [--hosts H] [--nproc P] [--timeout S] "
                               "[--SBATCH-OPTION=VALUE ...] FILE [ARGS ...]")
    env = os.environ
    run.add_argument("--hosts", default=env.get("HOSTS", "2"), help="nodes (HOSTS, default 2)")
    run.add_argument("--nproc", default=env.get("NPROC", ""),
                     help="processes per node, exported to the job as NPROC (default: unset)")
    run.add_argument("--timeout", default=env.get("TIMEOUT", "600"),
                     help="wall-clock limit of the job in seconds (TIMEOUT)")
    sub.add_parser("check", help="say whether the cluster can run here")
    sub.add_parser("cleanup-stale", help="remove what runs killed with -9 left behind")
    if argv[:1] == ["run"]:
        ours, sbatch_options, rest = split_run_args(argv[1:])
        args = parser.parse_args(["run", *ours])
        if not rest:
            run.error("the batch script FILE is missing")
    else:
        args = parser.parse_args(argv)
    try:
        if args.command in ("check", "cleanup-stale"):
            reason = unavailable_reason()
            if reason:
                raise SlurmError(reason)
            if args.command == "check":
                print("ok: this machine can run a SLURM cluster on separate hosts")
            else:
                removed = cleanup_stale()
                print(f"removed {len(removed)} stale namespace(s) and folder(s)" +
                      (f": {' '.join(removed)}" if removed else ""))
            return 0
        hosts = positive_int("HOSTS", args.hosts, H.MAX_HOSTS)
        nproc = positive_int("NPROC", args.nproc, 64) if args.nproc.strip() else None
        timeout = positive_int("TIMEOUT", args.timeout, 24 * 3600)
        script, script_args = rest[0], rest[1:]
        if not os.path.isfile(script):
            raise SlurmError(f"batch script {script} does not exist")
        reason = unavailable_reason()
        if reason:
            raise SlurmError(reason)
        return run_job(script, script_args, hosts, nproc, timeout, sbatch_options)
    except (H.HostsError, LaunchError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the cluster and the hosts are gone again
        return 130


if __name__ == "__main__":
    sys.exit(main())
