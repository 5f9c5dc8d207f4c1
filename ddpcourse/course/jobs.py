"""The grading tests' submission and torchrun jobs: the judge's side of the sandbox.

`graded(lesson)` gives each grading module the submission's exercises, reached only through
its sandboxed process (ddpcourse/course/sandbox.py). A grading worker runs every exercise of
its lesson in one job inside that sandbox and reports what it observed, as data; `judged`
turns the observations into one line per verdict here, in the judge, with the grading
module's own judges. The tests share the job and each asserts its own line.

COURSE_GRADING_JOBS=DIR replays instead of launching: the job's result is read from
DIR/<name>.json ({"returncode", "stdout", "stderr"}) and its observations from DIR/<name>.pt.
The project's own tests use it to grade many of their own wrong submissions with one launch
per job (the workers take --submissions A,B,...; ddpcourse/course/batched_jobs.py), then
score each with the real grading tests. Students are never graded that way: each is graded
in a sandbox of its own.
"""

import json
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from ddpcourse.course.grading import record_retry
from ddpcourse.course.job_checks import STATE, run_each_check
from ddpcourse.course.sandbox import Submission, from_data

WORKERS = Path(__file__).parent / "workers"
_results: dict[str, subprocess.CompletedProcess] = {}
_graded: dict[str, Submission] = {}  # the submission of the lesson being graded


def graded(lesson: int):
    """The body of each grading module's `ex` fixture: the submission's exercises of
    `lesson`, reached only through its sandboxed process (ddpcourse/course/sandbox.py);
    ended, with all it started, when the module's tests are done."""
    submission = Submission(lesson)
    _graded["now"] = submission
    try:
        yield submission
    finally:
        submission.close()
        _graded.pop("now", None)


@dataclass(frozen=True)
class Job:
    """One torchrun job of a lesson's grading (TORCHRUN_JOBS), which the project's own tests
    also launch for many submissions at once (ddpcourse/course/batched_jobs.py)."""
    name: str            # lesson4_W3: the file its result is replayed from
    worker: str          # a file in workers/
    nproc: int
    nnodes: int = 1
    timeout: float = 150
    restarts: int = 0    # > 0: the worker is killed and torchrun restarts it (lesson 6)


# The lessons graded by torchrun jobs ({lesson: {world size: job}}); every other lesson's
# multi-rank checks are relayed jobs, one per check (sandbox.Submission.relayed_job).
# Lesson 6: one restart is needed; the others let a restart that fails for another reason
# (a busy machine) try again, a second resume starting from the resumed run's own snapshots.
TORCHRUN_JOBS = {
    1: {4: Job("lesson1_W4", "lesson1_identity.py", nproc=2, nnodes=2, timeout=120)},
    5: {4: Job("lesson5_W4", "lesson5_devices.py", nproc=2, nnodes=2, timeout=120)},
    6: {w: Job(f"lesson6_W{w}", "lesson6_resume.py", nproc=w, timeout=240, restarts=3)
        for w in (1, 2, 3)},
}


def run_job(job: Job, **launch_args) -> subprocess.CompletedProcess:
    """The result of `job`, launched once per test session with launch_args, or replayed."""
    name, worker = job.name, job.worker
    launch_args = {"nproc": job.nproc, "nnodes": job.nnodes, "timeout": job.timeout,
                   **(restartable(job.restarts) if job.restarts else {}), **launch_args}
    script_args = launch_args.pop("script_args", [])
    if name not in _results:
        replay = os.environ.get("COURSE_GRADING_JOBS", "").strip()
        if replay:
            saved = json.loads((Path(replay) / f"{name}.json").read_text())
            _results[name] = subprocess.CompletedProcess(
                worker, saved["returncode"], saved["stdout"], saved["stderr"])
            observed = Path(replay) / f"{name}.pt"
            _results[name].observations = from_data(torch.load(observed, weights_only=True)) \
                if observed.exists() else None
            if isinstance(_results[name].observations, dict):
                _results[name].observations.pop(STATE, None)
        else:
            def launch_once(skip):
                allow_the_launch(launch_args.get("timeout", 600) + 90)
                # In the submission's sandbox: its ranks run its code, and what they print
                # is data to this process.
                return _graded["now"].job(worker, [*script_args, *(
                    ["--skip", ",".join(skip)] if skip else [])], **launch_args)

            result = run_each_check(launch_once, job.nproc * job.nnodes)
            for retry in result.retries:
                record_retry(f"{name}: {retry}")
            _results[name] = result
    return _results[name]


def will_launch(job: Job) -> bool:
    """Whether run_job(job) would start the job (it is neither replayed nor already run): a
    test that first calls the code in its own process, to fail before paying for a launch,
    need not when nothing is launched."""
    return job.name not in _results and not os.environ.get("COURSE_GRADING_JOBS", "").strip()


def restartable(restarts: int) -> dict:
    """launch() options for a job torchrun restarts after a worker dies (lesson 6): c10d
    rendezvous, and workers that do not share its store (else the restarted workers find the
    dead ones' addresses: see lessons/lesson6/restarts.md)."""
    return {"rdzv": "c10d", "torchrun_args": [f"--max-restarts={restarts}"],
            "env": {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}}


def allow_the_launch(seconds: float) -> None:
    """Give the running test the job's own time limit, from now on.

    A job test runs under the short default limit (tests/grading/conftest.py) until it
    launches, so a submission that hangs in its first, quick call costs seconds, not the
    job's minutes. pytest-timeout's default method is an alarm (SIGALRM): re-arming it moves
    the deadline and keeps its handler.
    """
    if signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        signal.setitimer(signal.ITIMER_REAL, seconds)


def verdict(stdout: str, name: str) -> str:
    """The one line of a job's report about check `name`."""
    lines = [line for line in stdout.splitlines() if line.startswith(f"{name}: ")]
    assert len(lines) == 1, stdout[-3000:]
    return lines[0]


def judged(job: Job, verdicts: dict, summarise=lambda problems: "; ".join(problems[:4])) -> str:
    """The job's report, judged here: one line per verdict, `<name>: ok on W ranks[, note]`
    or `<name>: FAILED: <problems>`. verdicts: {name: (check, judge)}; judge(every rank's
    observation of that check) returns (problems, note). The observations are data the
    submission's sandbox sent (workers/common.py); no line of the job's own output counts."""
    result = run_job(job)
    observed = getattr(result, "observations", None)
    if not isinstance(observed, dict):
        raise AssertionError("the job left no observations (exit status "
                             f"{result.returncode}):\n" + (result.stdout + result.stderr)[-3000:])
    return verdict_lines(observed, job.nproc * job.nnodes, verdicts, summarise)


def verdict_lines(observed: dict, world: int, verdicts: dict, summarise) -> str:
    lines = []
    for name, (check, judge) in verdicts.items():
        per_rank = observed.get(check)
        if not isinstance(per_rank, list) or len(per_rank) != world or \
                not all(isinstance(o, dict) for o in per_rank):
            problems, note = [f"no observations of {check} from {world} ranks"], ""
        else:
            problems = [str(o.get("error")) for o in per_rank if "data" not in o]
            note = ""
            if not problems:
                problems, note = judge([o["data"] for o in per_rank])
        lines.append(f"{name}: FAILED: {summarise(problems)}" if problems else
                     f"{name}: ok on {world} ranks" + (f", {note}" if note else ""))
    return "\n".join(lines) + "\n"


# --- relayed checks (ddpcourse/course/relay.py) ----------------------------------------------

_relayed: dict[tuple, object] = {}


def relayed(worker: str, check: str, nproc: int, nnodes: int = 1, timeout: float = 90,
            refuse_collectives: bool = False):
    """Check `check` of `worker` run once (per test session) as nnodes x nproc relayed ranks
    of the submission: a sandbox each, the relay between them (Submission.relayed_job)."""
    key = (worker, check, nproc, nnodes)
    if key not in _relayed:
        allow_the_launch(timeout + 60)
        done = _graded["now"].relayed_job(worker, nproc, nnodes, ["--check", check],
                                          timeout=timeout,
                                          refuse_collectives=refuse_collectives)
        for retry in done.retries:
            record_retry(f"{worker} {check}: {retry}")
        _relayed[key] = done
    return _relayed[key]


def relayed_report(worker: str, verdicts: dict, name: str, nproc: int, nnodes: int = 1,
                   secrets: list | None = None,
                   summarise=lambda problems: "; ".join(problems[:4]), **launch) -> str:
    """The report of verdict `name` (verdicts: {name: (check, judge)}) on the relayed job of
    its check at nnodes x nproc ranks (launched once, shared by the check's verdicts), judged
    here from what the ranks reported and the relay saw. `secrets`, a list, is first filled
    with the job's ranks' secrets, which the judges rebuild the inputs from."""
    check = verdicts[name][0]
    job = relayed(worker, check, nproc, nnodes, **launch)
    if secrets is not None:
        secrets[:] = job.secrets
    return verdict_lines({check: relayed_observations(job)}, nproc * nnodes,
                         {name: verdicts[name]}, summarise)


def relayed_observations(job) -> list[dict]:
    """Every rank's observation ({"data": ...} or {"error": why}), each dict of it that
    names a case ({"case": k}) given what the relay saw that rank do in case k: "messages",
    [(kind, peer, numel, nbytes)], peers as global ranks; "collectives", [(op, numel, nbytes,
    member ranks, the group's timeout in seconds)]; "groups", [(member ranks, timeout)] made;
    and "refused", the ready-made collectives it refused. The case numbers must be the ones
    the rank noted, in order; the rest is the relay's."""
    seen = []
    for rank, (notes, record, exit) in enumerate(zip(job.notes, job.record, job.exits,
                                                      strict=True)):
        reported = [n["observation"] for n in notes if "observation" in n]
        if len(reported) != 1 or not isinstance(reported[0], dict):
            how = f"exit status {exit}" if isinstance(exit, int) else exit
            seen.append({"error": f"rank {rank}: no observation ({how})"})
            continue
        observation = from_data(reported[0])
        if "data" not in observation:  # what the check raised: no case to fill
            seen.append({"error": str(observation.get("error"))[:300]})
            continue
        noted = [n["case"] for n in notes if n.get("case") is not None]
        named = []
        try:
            filled = with_traffic(observation, record, named)
        except (TypeError, ValueError) as error:
            seen.append({"error": f"rank {rank}: unexpected observation ({error})"})
            continue
        if named != noted or named != list(range(len(named))):
            seen.append({"error": f"rank {rank}: its observation names cases {named[:8]}, "
                                  f"the relay saw it begin {noted[:8]}"})
            continue
        seen.append(filled)
    return seen


def with_traffic(value, record, named):
    if isinstance(value, dict):
        out = {k: with_traffic(v, record, named) for k, v in value.items()}
        if "case" in value:
            k = value["case"]
            if not isinstance(k, int) or isinstance(k, bool):
                raise TypeError("a case that is not a number")
            named.append(k)
            timeouts = {e["group"]: e["timeout"] for e in record if e["kind"] == "group"}
            events = [e for e in record if e.get("case") == k]
            out["messages"] = [(e["kind"], e["peer"], e["numel"], e["nbytes"])
                               for e in events if e["kind"] in ("send", "recv")]
            out["collectives"] = [(e["op"], e["numel"], e["nbytes"], e["ranks"],
                                   timeouts.get(e["group"])) for e in events
                                  if e["kind"] == "collective"]
            out["groups"] = [(e["ranks"], e["timeout"]) for e in events if e["kind"] == "group"]
            out["refused"] = [f"a ready-made collective ({e['op']})" for e in events
                              if e["kind"] == "refused"]
        return out
    if isinstance(value, (list, tuple)):
        return type(value)(with_traffic(v, record, named) for v in value)
    return value


class Unreadable(tuple):
    """The verdict of observations that are not what the worker writes (a submission that
    returned something odd, or forged them): (problems, note), for every verdict name too."""

    def __new__(cls, error):
        return super().__new__(cls, ([f"unexpected observation ({error!r})"], ""))

    def __getitem__(self, key):
        return tuple(self) if isinstance(key, str) else super().__getitem__(key)


def judge_once(judge):
    """A judge of every rank's observations of one check, run once per job (the check's
    verdicts share it); observations of the wrong shape fail every verdict it gives."""
    done = {}

    def once(seen):
        key = tuple(id(x) for x in seen)  # the job's own objects, kept alive below
        if key not in done:
            try:
                done[key] = (seen, judge(seen))
            except (KeyError, TypeError, IndexError, AttributeError, ValueError,
                    RuntimeError) as error:
                done[key] = (seen, Unreadable(error))
        return done[key][1]
    once.__name__ = judge.__name__
    return once


def one_line_value_error(call, *args, **kwargs):
    """call(*args, **kwargs) raises ValueError, whose message is one line."""
    with pytest.raises(ValueError) as refused:
        call(*args, **kwargs)
    assert "\n" not in str(refused.value).strip(), (args, kwargs, str(refused.value))


def brief(value, limit=120):
    """repr(value), only its start when longer than `limit`: a failure message stays short."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def difference(got, want, item="position", items="indices"):
    """Where the list `got` first departs from the list `want`, in words."""
    try:
        at = next(i for i, (g, w) in enumerate(zip(got, want, strict=False)) if g != w)
        where = f"{item} {at} is {brief(got[at], 40)}, expected {brief(want[at], 40)}; "
    except Exception:  # no item differs (a length does), or `got` is no list
        where = ""
    size = f"{len(got)} {items} " if isinstance(got, list) else ""
    return f"{where}got {size}{brief(got)}, expected {len(want)} {brief(want)}"
