"""What every grading worker does around the code it checks.

A worker runs in the submission's sandbox, beside its code, so it decides nothing: each check
returns what it observed (the submission's results, the samples it read, the messages it
sent) as data, and rank 0 writes every rank's observations to the file COURSE_OBSERVATIONS
names; the grading tests judge them in their own process (ddpcourse/course/jobs.py).

Each check runs in a process group of its own, so code that hangs, or leaves messages
behind, spoils only its own check. Observations travel through the launcher's key-value
store, not through a process group (which the code under test may have broken).
"""

import argparse
import gc
import io
import os
import sys
from contextlib import contextmanager
from datetime import timedelta

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

# probes.py, beside this folder: the inputs the workers and the judge both build
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
VERDICT_WAIT = timedelta(seconds=60)    # how long ranks wait for each other's verdicts
LEAVE_WAIT = timedelta(seconds=20)      # ... and for each other to leave a check's group
HARNESS_EXIT = 75                        # a job whose check's group never formed (its line says)
STATE = "__state__"                      # the key of a launch's progress among its observations


def launcher_store() -> dist.TCPStore:
    """A client of the store torchrun's agent started for this job."""
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                         is_master=False, timeout=VERDICT_WAIT)


# Whether every rank was seen to leave the last check's group (everyone_left): until one is
# not, a group that cannot form is the machine's failure, not the code's.
_everyone_here = True

# How far this launch got with the submission it grades now, written by rank 0 with its
# observations before and after every check: the checks planned, whether the exercises were
# imported, the check whose code runs, and a check whose own group never formed. When a rank
# ends the job, the judge reads it to run the remaining checks in a fresh job without the one
# that ended it (ddpcourse/course/job_checks.py).
_progress = {"index": 0, "observed": {}, "state": {}}


def progress(index: int, planned: list[str]) -> None:
    """A submission's checks begin: nothing imported, nothing running yet."""
    _progress.update(index=index, observed={}, state={
        "planned": list(planned), "imported": False, "running": None, "harness_failed": None})
    write_progress()


def write_progress(**state) -> None:
    _progress["state"].update(state)
    write_observations(_progress["observed"], _progress["index"])


@contextmanager
def group_of_its_own(store, name: str, timeout: timedelta):
    """A fresh default process group for one check (keys under `name` in the store); on
    leaving it, every rank waits for all to have left (everyone_left).

    While every rank is there, a group that cannot form is the job's own failure, not the
    code's: gloo sometimes fails to connect on a loaded machine ("connectFullMesh failed ...
    Connection closed by peer", seen in a fresh job in CI). Every rank says whether its group
    formed, and all try again together, up to FORM_TRIES times; after that the job ends
    here with a HARNESS_FAILED line, its progress saying which check's group never formed:
    the judge launches the job again from that check (ddpcourse/course/job_checks.py)."""
    from ddpcourse.course.sandbox_child import FORM_TRIES, HARNESS_FAILED

    global _everyone_here
    here = _everyone_here
    for attempt in range(FORM_TRIES if here else 1):
        # The group's keys are named by a per-process count of groups made, which a failed
        # try advanced on its ranks alone (destroying a group resets it, failing does not):
        # reset, every rank names the try's group alike.
        c10d._world.group_count = 0
        try:
            dist.init_process_group("gloo", store=dist.PrefixStore(f"{name}/{attempt}", store),
                                    rank=RANK, world_size=WORLD, timeout=timeout)
            error = None
        except Exception as failed:
            if not here:  # a rank the code ended or left stuck: the code's failure
                raise
            error = failed
        if not here:
            break
        formed = error is None
        try:
            if everyone_formed(store, f"{name}/{attempt}", formed, timeout):
                break
        except Exception as failed:  # a rank never said, or this one's store connection broke
            error = failed
        if formed:
            dist.destroy_process_group()  # others failed: all try again together
    else:
        print(f"{HARNESS_FAILED}: rank {RANK} could not form the group of {name} "
              f"in {FORM_TRIES} tries: {one_line(error) if error else 'another rank could not'}",
              flush=True)
        write_progress(harness_failed=name.rsplit("/", 1)[-1])
        os._exit(HARNESS_EXIT)
    check = {"raised": False}  # the caller marks a check whose code raised
    try:
        yield check
    finally:
        try:
            dist.destroy_process_group()
        except Exception:  # a group the check broke
            pass
        if check["raised"]:
            # The error's frames hold the check's sub-groups (and a DDP reducer) in a cycle:
            # freed now, before this rank joins the next check's group, not by the collector
            # at some later moment, when their connections closing met the next check's
            # groups connecting (seen once in a few full runs: "connectFullMesh failed ...
            # Connection closed by peer" in the check after one whose code raised). Only
            # then: a collection after every check tripled lesson 4's grading time.
            gc.collect()
        _everyone_here = everyone_left(store, name, wait=here)


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}"[:300]


def submissions_to_grade(arg: str) -> list[str | None]:
    """--submissions A,B,...: grade those folders one after another (the project's own tests
    grade many wrong answers with one launch); empty: the one COURSE_SUBMISSION or
    COURSE_IMPL points at."""
    return [s for s in arg.split(",") if s] or [None]


def announce(kind: str, submission: str | None) -> None:
    """`### <kind> <folder>` from rank 0, before any of the submission's code runs: when a job
    that grades many stops, the last announcement names the submission that stopped it
    (ddpcourse/course/batched_jobs.py); `### submission` also opens the folder's report."""
    if submission and RANK == 0:
        print(f"### {kind} {submission}", flush=True)


def select_submission(submission: str | None, store=None, tag: str = "") -> None:
    """Grade `submission` from now on, announced. With the launcher's store, every rank first
    answers a roll call: a rank that the previous submission's code ended (even os._exit(0))
    or left stuck stops the job here, before the next submission is announced, instead of
    failing the checks of every submission after it."""
    global _everyone_here
    if submission:
        if store is not None:
            keys = [f"present/{tag}/{r}" for r in range(WORLD)]
            store.set(keys[RANK], "1")
            store.wait(keys, VERDICT_WAIT)  # raises on a missing rank: the job stops
            _everyone_here = True
        os.environ["COURSE_SUBMISSION"] = submission
        announce("submission", submission)


def exercises_or_error(lesson: int):
    """(the graded module, None), or (None, why it could not be imported): a submission that
    fails to import fails every check of the job, each with that one line."""
    from ddpcourse.exercises import load_exercises

    try:
        return load_exercises(lesson), None
    except BaseException as error:  # the submission's own code ran: anything may come out
        return None, f"could not import the exercises: {one_line(error)}"


# --- observations, judged elsewhere ------------------------------------------------------------

def as_data(value):
    """The value as the judge may read it (numbers, strings, lists, dicts, plain tensors):
    anything else becomes a marker that judges as wrong."""
    from ddpcourse.course.sandbox_child import Handles, to_data

    return to_data(value, Handles())


def everyones_observation(store, name: str, mine: dict) -> list[dict] | None:
    """At rank 0, every rank's observation for `name`, in rank order ({"data": ...} or
    {"error": why}); None on the other ranks."""
    import torch

    buffer = io.BytesIO()
    torch.save(mine, buffer)
    keys = [f"observed/{name}/{r}" for r in range(WORLD)]
    store.set(keys[RANK], buffer.getvalue())
    if RANK != 0:
        return None
    try:
        store.wait(keys, VERDICT_WAIT)
    except Exception:  # a rank died or is stuck: what arrived
        pass
    gathered = []
    for r, key in enumerate(keys):
        if not store.check([key]):
            gathered.append({"error": f"rank {r}: no observation (it stopped or is stuck)"})
            continue
        try:
            gathered.append(torch.load(io.BytesIO(store.get(key)), weights_only=True))
        except Exception as error:
            gathered.append({"error": f"rank {r}: unreadable observation: {one_line(error)}"})
    return gathered


def observe_checks(store, tag: str, lesson: int, checks, timeout_of, index: int, run) -> dict:
    """Every check of `checks` (names), each in a process group of its own with the timeout
    timeout_of(name); run(name, ex, import_error) returns this rank's observation ({"data": ...} or
    {"error": ...}). {check: every rank's} at rank 0, written after each check. A check in
    which a rank ended or stuck is the last of this job: the ranks still here stop, and the
    judge runs the rest in a fresh one."""
    progress(index, list(checks))
    ex, import_error = exercises_or_error(lesson)
    write_progress(imported=True)
    observed = _progress["observed"]
    for check in checks:
        with group_of_its_own(store, f"lesson{lesson}/{tag}/{check}",
                              timeout_of(check)) as outcome:
            write_progress(running=check)
            mine = run(check, ex, import_error)
            outcome["raised"] = "error" in mine
            observed[check] = everyones_observation(store, f"lesson{lesson}/{tag}/{check}", mine)
        write_progress(running=None)
        if not _everyone_here:
            break
    return observed


def observe(store, tag: str, lesson: int, checks: dict, timeout: timedelta,
            index: int = 0, graded_with=None) -> dict:
    """observe_checks for a worker whose checks[name](ex) returns this rank's observations.
    graded_with {check: {name: probe}}: while that check runs, the submission's own function
    `name` is probes.py's `probe` (an exercise graded with the grader's version of another it
    builds on; the sandbox's own replacing, sandbox_child.refusing)."""
    from ddpcourse.course.sandbox_child import refusing

    def run(check, ex, import_error):
        try:
            if import_error:
                raise RuntimeError(import_error)
            with refusing([], ex, (graded_with or {}).get(check)):
                return {"data": as_data(checks[check](ex))}
        except BaseException as error:  # the graded code raised: the next check runs
            return {"error": f"rank {RANK}: {one_line(error)}"}

    return observe_checks(store, tag, lesson, list(checks), lambda _: timeout, index, run)


def everyone_left(store, name: str, wait: bool = True) -> bool:
    """Say this rank has left check `name`'s group, and wait until every rank has (and freed
    what it held), so that no rank connects the next check's group while another still
    closes this one's connections (seen in a full run even after the collect: "connectFullMesh
    failed ... Connection closed by peer" in the check after one whose code raised). False
    when a rank never came (it stopped or is stuck), or without `wait` (a rank was already
    missing): the next checks say so, without this wait. Every rank says it, waiting or not,
    so that ranks which waited at different moments stay in step."""
    keys = [f"left/{name}/{r}" for r in range(WORLD)]
    store.set(keys[RANK], "1")
    if not wait:
        return False
    try:
        store.wait(keys, LEAVE_WAIT)
        return True
    except Exception:
        return False


def everyone_formed(store, name: str, mine: bool, timeout: timedelta) -> bool:
    """Whether every rank formed the group `name` (mine: this one did). A rank whose peers
    failed may wait in gloo's connect for the group's timeout before it fails too."""
    keys = [f"formed/{name}/{r}" for r in range(WORLD)]
    store.set(keys[RANK], "1" if mine else "0")
    store.wait(keys, timeout + LEAVE_WAIT)
    return all(store.get(key) == b"1" for key in keys)


def write_observations(observed: dict, index: int) -> None:
    """Rank 0: the observations of the index-th submission of this launch, where the sandbox
    (or the project's batched grading) reads them."""
    import torch

    folder = os.environ.get("COURSE_OBSERVATIONS")
    if RANK != 0 or not folder:
        return
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{index}.pt")
    torch.save({**observed, STATE: dict(_progress["state"])}, path + ".tmp")
    os.replace(path + ".tmp", path)


def worker_arguments(description: str, checks: dict) -> argparse.Namespace:
    """--submissions A,B,... and --skip C,D,... (checks left out: the judge continues a job
    that a rank ended without the checks already observed and the one it ended in)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--submissions", default="",
                        help="comma-separated submission folders to grade one after another")
    parser.add_argument("--skip", default="", help="comma-separated checks to leave out")
    args, _ = parser.parse_known_args()
    skip = {c for c in args.skip.split(",") if c}
    if skip - set(checks):
        sys.exit(f"error: unknown check(s) {sorted(skip - set(checks))}; known: "
                 + ", ".join(checks))
    args.checks = {name: fn for name, fn in checks.items() if name not in skip}
    return args


def observe_each_submission(lesson: int, checks: dict, timeout: timedelta,
                            description: str, graded_with=None) -> None:
    """A worker's main: observe(...) once per submission, each written for the judge."""
    args = worker_arguments(description, checks)
    store = launcher_store()
    for i, submission in enumerate(submissions_to_grade(args.submissions)):
        select_submission(submission, store, tag=str(i))
        write_observations(observe(store, str(i), lesson, args.checks, timeout, index=i,
                                   graded_with=graded_with), i)


# --- relayed ranks (ddpcourse/course/relay.py) ---------------------------------------------------

ALARM_S = 30       # a Python-level endless loop in a relayed check
SECRET = 0         # this rank's, from the relay: a relayed worker builds its inputs from it
_cases = iter(range(10**6))


def case() -> dict:
    """A case begins: the relay files what this rank does from now on under its number, which
    the judge finds in the observation (jobs.relayed_observations)."""
    from ddpcourse.course import relay

    number = next(_cases)
    relay.note(case=number)
    return {"case": number}


def end_case() -> None:
    """What this rank does from now on belongs to no case (the grader's own set-up between
    two cases)."""
    from ddpcourse.course import relay

    relay.note(case=None)


def observe_within_alarm(fn, ex) -> dict:
    import signal

    def alarm(signum, frame):
        raise TimeoutError(f"still running after {ALARM_S} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(ALARM_S)
    try:
        try:
            return {"data": as_data(fn(ex))}
        finally:  # at once: no alarm may interrupt the reporting below
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
    except NotImplementedError:
        return {"error": f"rank {RANK}: not implemented"}
    except BaseException as error:  # the code under test may raise anything, even SystemExit
        return {"error": f"rank {RANK}: {one_line(error)}"}


def relayed_rank(lesson: int, checks: dict, description: str, graded_with=None) -> None:
    """The body of a relayed worker (`--check NAME`): join the relay (the default process
    group; SECRET set), run check NAME of `checks` ({name: (observe(ex), group timeout)}) on
    the submission, note what it returned to the relay, and end this rank. graded_with: as
    observe's."""
    global SECRET
    from ddpcourse.course import relay
    from ddpcourse.course.sandbox_child import refusing

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", required=True, choices=list(checks))
    args = parser.parse_args()
    observe, timeout = checks[args.check]
    SECRET = relay.join(int(os.environ["COURSE_RELAY_FD"]), RANK, WORLD, timeout)["secret"]
    ex, import_error = exercises_or_error(lesson)
    if import_error:
        mine = {"error": f"rank {RANK}: {import_error}"}
    else:
        with refusing([], ex, (graded_with or {}).get(args.check)):
            mine = observe_within_alarm(observe, ex)
    relay.note(observation=mine)
    sys.stdout.flush()
    os._exit(0)  # whatever the submission left running, this rank is done
