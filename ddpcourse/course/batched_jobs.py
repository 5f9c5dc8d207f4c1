"""A lesson's grading jobs, launched once for many of the course's own submissions, and
each one's share.

The project's tests grade dozens of wrong submissions of their own (tests/project/
wrong_submissions): the grading workers grade several folders in one launch (--submissions
A,B,...), so the jobs start once, not once per folder. Each folder's share (its report and
its observations) is written where the grading tests replay it (COURSE_GRADING_JOBS=DIR reads
DIR/<job name>.json and .pt, see ddpcourse/course/jobs.py), and the real grading tests then judge
each folder from its share. Students are never graded this way: their code would share
processes. `make grade-class` grades each student alone, in a sandbox of their own.

One submission costs only itself. The workers announce each submission (`### submission X`,
lesson 6 also `### drill X`) before any of its code runs, so when a job stops early (a rank
killed, os._exit, a hang), the last announcement names the submission it stopped in. The
submissions finished before it keep their shares; it is launched alone, so it gets exactly
what grading it alone gets; the ones after it are launched together again. A job that stops
before its first announcement stopped for no submission's doing: its submissions are not
graded, and the reason says why (never a silent zero). Each submission gets the time a job of
its own gets: a launch is stopped when the job's limit passes without an announcement.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ddpcourse.cluster.launch import launch
from ddpcourse.course.job_checks import run_each_check
from ddpcourse.course.jobs import TORCHRUN_JOBS, WORKERS, restartable
from ddpcourse.exercises import ROOT

ANNOUNCEMENT = re.compile(r"^### (\w+) (.+)$", re.M)


@dataclass(frozen=True)
class Share:
    """One submission's part of a job, as the grading tests replay it; or why it has none."""
    returncode: int = 0
    stdout: str = ""
    stderr: str = ""
    not_graded: str = ""
    observations: str = ""  # the file of what its checks saw (workers/common.py)

    def replay(self) -> dict:
        return {"returncode": self.returncode, "stdout": self.stdout, "stderr": self.stderr}


def lesson_jobs(lesson: int) -> list:
    """The torchrun jobs (ddpcourse/course/jobs.Job) the grading tests of `lesson` read."""
    return list(TORCHRUN_JOBS.get(lesson, {}).values())


def launch_for(job, folders: list[str], work: Path, skip=()) -> subprocess.CompletedProcess:
    """One launch of `job` that grades `folders` one after another (without the checks in
    `skip`); the observations of the i-th are in the file result.observed(i)."""
    args, options = ["--submissions", ",".join(folders)], {}
    if skip:
        args += ["--skip", ",".join(skip)]
    observed = Path(tempfile.mkdtemp(prefix=f"{job.name}-observed-", dir=work))
    if job.restarts:  # lesson 6: killed once per launch, in a folder of its own
        args += ["--work", tempfile.mkdtemp(prefix=f"{job.name}-", dir=work)]
        # and restarted up to twice more for each further submission whose code ends the
        # job (workers/lesson6_resume.py's ATTEMPTS): one submission gets job.restarts
        options = restartable(job.restarts + 2 * (len(folders) - 1))
    options["env"] = dict(os.environ, **options.get("env", {}), COURSE_OBSERVATIONS=str(observed))
    result = launch(str(WORKERS / job.worker), args, nproc=job.nproc,
                  nnodes=job.nnodes, timeout=job.timeout * len(folders),
                  progress=("### ", job.timeout), capture=True, echo=False, cwd=str(ROOT),
                  **options)
    result.observed = lambda i: str(observed / f"{i}.pt")
    return result


def read_announcements(stdout: str, folders: list[str]):
    """(each announced folder's report: the lines after its last `### submission` line,
    the folders whose last `### submission` line a later announcement follows (finished),
    the folder of the last announcement or None)."""
    marks = [m for m in ANNOUNCEMENT.finditer(stdout) if m.group(2) in folders]
    reports, finished = {}, set()
    for i, mark in enumerate(marks):
        if mark.group(1) != "submission":
            continue
        later = marks[i + 1] if i + 1 < len(marks) else None
        folder = mark.group(2)
        reports[folder] = stdout[mark.end():later.start() if later else len(stdout)]
        if later:
            finished.add(folder)
        else:
            finished.discard(folder)
    return reports, finished, marks[-1].group(2) if marks else None


def alone(job, folder: str, work: Path, say, first) -> Share:
    """The share of a submission's job of its own, every check observed or ended, as real
    grading's (ddpcourse/course/job_checks.py); `first`: its first launch, already run."""
    import torch

    ready = [first]

    def launch_once(skip):
        result = ready.pop() if ready else launch_for(job, [folder], work, skip)
        path = getattr(result, "observed", lambda i: "")(0)
        result.observations = torch.load(path, weights_only=True) \
            if path and Path(path).is_file() else None
        return result

    merged = run_each_check(launch_once, job.nproc * job.nnodes)
    for retry in merged.retries:
        say(f"{job.name}: {Path(folder).resolve()}: {retry}")
    saved = Path(tempfile.mkdtemp(prefix=f"{job.name}-merged-", dir=work)) / "0.pt"
    if merged.observations is not None:
        torch.save(merged.observations, saved)
    return Share(merged.returncode, merged.stdout, merged.stderr,
                 observations=str(saved) if saved.exists() else "")


def shares_of(job, folders: list[str], work: Path, say=print) -> dict[str, Share]:
    """Each folder's share of `job`, from as few launches as the submissions allow."""
    result = launch_for(job, folders, work)
    if len(folders) == 1:  # the job of this submission alone, continued as real grading's
        return {folders[0]: alone(job, folders[0], work, say, first=result)}
    reports, finished, stopped_in = read_announcements(result.stdout, folders)
    if stopped_in is None:  # before the workers began any submission: none is to blame
        last = (result.stderr.strip().splitlines() or ["no message"])[-1]
        why = (f"job {job.name} stopped before it began any submission (exit status "
               f"{result.returncode}): {last}")
        say(why)
        return {folder: Share(not_graded=why) for folder in folders}
    def observed(folder):
        return getattr(result, "observed", lambda i: "")(folders.index(folder))

    if result.returncode == 0 and set(reports) == set(folders):
        return {folder: Share(0, reports[folder], observations=observed(folder))
                for folder in folders}
    shares = {folder: Share(0, reports[folder], observations=observed(folder))
              for folder in folders if folder in finished}
    again = [f for f in folders if f not in shares and f != stopped_in]
    say(f"{job.name}: the launch for {len(folders)} submissions stopped (exit status "
        f"{result.returncode}) in {Path(stopped_in).resolve()}: that one is graded alone"
        + (f", the {len(again)} after it together again" if again else ""))
    shares.update(shares_of(job, [stopped_in], work, say))
    if again:
        shares.update(shares_of(job, again, work, say))
    return shares


def launch_jobs_for_all(lesson: int, replay_dirs: dict[Path, Path], work: Path,
                        say=print) -> dict[Path, str]:
    """Every job of `lesson` launched for all submission folders at once ({folder: where
    COURSE_GRADING_JOBS will replay its jobs}), each folder's share written there. Returns
    {folder: why it is not graded} for the folders a job never reached (no replay is
    written for them: their grading tests would fail to find it)."""
    work.mkdir(parents=True, exist_ok=True)
    # The workers read --submissions A,B,...: names without commas, whatever the students
    # called their folders (the exercises loader resolves the links).
    named = Path(tempfile.mkdtemp(prefix="submissions-", dir=work))
    links = {}
    for i, folder in enumerate(replay_dirs):
        (named / str(i)).symlink_to(Path(folder).resolve(), target_is_directory=True)
        links[str(named / str(i))] = folder
    not_graded: dict[Path, str] = {}
    for job in lesson_jobs(lesson):
        for link, share in shares_of(job, list(links), work, say).items():
            folder = links[link]
            if share.not_graded:
                not_graded.setdefault(folder, share.not_graded)
                continue
            replay = replay_dirs[folder]
            replay.mkdir(parents=True, exist_ok=True)
            (replay / f"{job.name}.json").write_text(json.dumps(share.replay()))
            if share.observations and Path(share.observations).exists():
                shutil.copyfile(share.observations, replay / f"{job.name}.pt")
    return not_graded
