"""Run under `torchrun --max-restarts=K` by the lesson 6 grading tests: capture_state and
restore_state, graded by a kill.

The job trains a small DDP model that has everything a snapshot can forget: BatchNorm's
running statistics (buffers that change every step), dropout (torch's global generator),
input noise from a per-rank torch.Generator, augmentation choices from Python's `random`
(a sign flip per sample) and NumPy's global generator (a scale per sample), SGD with momentum
and a cosine schedule. Three kinds of run over the same data:
  reference  never interrupted; its final weights and buffers are the answer (once per job);
  drill      every rank writes its own snapshot (capture_state, torch.save) every
             SNAPSHOT_EVERY steps and trains on to KILL_STEP (once per submission);
  resume     after the kill: each rank reloads its snapshot (torch.load with
             weights_only=False, restore_state) and trains to the end (once per submission).
When every submission's drill has reached KILL_STEP, the last rank sends itself SIGKILL and
torchrun restarts every worker: one kill and one restart per job, however many submissions
it grades. The restarted job resumes each submission in turn and reports, per submission, the
resumed run's final weights and buffers (or the problem that stopped it): the grading tests
compare them with a reference they ran themselves (--reference-only, outside the
submission's sandbox), never with the one this job trained beside it. Each drill and each resume
is announced first (`### drill X`, `### submission X`: common.announce), so a job that stops
names the submission it stopped in; a restart in the middle of a resume announces it again.
Work in progress lives in --work (a folder per submission), so a restarted job knows where it
was. The positions each rank trains come from the grader's own copy of the sampler
arithmetic, so a mistake in resume_indices does not cost this exercise.
"""

import argparse
import os
import random
import signal
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpcourse.course.workers.common import (
    RANK,
    WORLD,
    announce,
    as_data,
    exercises_or_error,
    one_line,
    progress,
    select_submission,
    submissions_to_grade,
    write_observations,
    write_progress,
)

SAMPLES, GLOBAL_BATCH, EPOCHS = 96, 24, 3   # 4 steps per epoch, 12 in all
SNAPSHOT_EVERY, KILL_STEP = 3, 8            # killed mid-epoch 2, after the snapshot at 6
ATTEMPTS = 2    # a submission whose code ends the job this often is failed, not tried again
# One thread wherever it runs (the grader's reference outside the sandbox, the submission's
# runs inside): bit-identical needs the same reduction order in every matrix product.
torch.set_num_threads(1)
DATA = torch.Generator().manual_seed(7)
INPUTS = torch.randn(SAMPLES, 8, generator=DATA)
LABELS = torch.randint(0, 4, (SAMPLES,), generator=DATA)


def positions(epoch: int, start: int) -> list[int]:
    generator = torch.Generator()
    generator.manual_seed(epoch)
    order = torch.randperm(SAMPLES, generator=generator).tolist()
    return order[start:][RANK::WORLD]


def build():
    """A fresh model, optimizer, schedule and generators, seeded as a training script does."""
    torch.manual_seed(0)
    random.seed(200 + RANK)
    np.random.seed(300 + RANK)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.BatchNorm1d(32),
                                torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=EPOCHS * 4)
    noise = torch.Generator().manual_seed(100 + RANK)
    return model, optimizer, scheduler, noise


def augment(inputs: torch.Tensor, noise: torch.Generator) -> torch.Tensor:
    """Every generator a real input pipeline draws from, each shaping the batch."""
    flips = torch.tensor([-1.0 if random.random() < 0.5 else 1.0 for _ in range(len(inputs))])
    scales = torch.from_numpy(np.random.uniform(0.8, 1.2, size=len(inputs))).float()
    noisy = inputs + 0.1 * torch.randn(inputs.shape, generator=noise)
    return noisy * (flips * scales)[:, None]


def agree(ok: bool) -> bool:
    """True when every rank is ok (one rank's failure must not leave the others waiting)."""
    flag = torch.tensor([0 if ok else 1])
    dist.all_reduce(flag)
    return flag.item() == 0


def train(ex, folder: Path, kind: str) -> str | None:
    """One run; returns a problem (one line) or None. kind: reference, drill or resume."""
    model, optimizer, scheduler, noise = build()
    ddp = DDP(model, find_unused_parameters=True)  # no bucket rebuild: see lesson 6
    epoch, start, step = 0, 0, 0
    mine = folder / f"snapshot_rank{RANK}.pt"
    if kind == "resume":
        problem = None
        try:
            # Our own file, written by this job: NumPy's generator state needs the full
            # unpickler, which weights_only=True refuses.
            state = torch.load(mine, map_location="cpu", weights_only=False)
            progress = ex.restore_state(state, model, optimizer, scheduler, noise)
            epoch, start, step = (int(progress[k]) for k in ("epoch", "start", "step"))
        except BaseException as error:
            problem = f"rank {RANK}: restore_state: {one_line(error)}"
        if not agree(problem is None):
            return problem or "another rank's restore_state failed"
    while epoch < EPOCHS:
        batch_positions = positions(epoch, start)
        per_rank = GLOBAL_BATCH // WORLD
        for i in range(0, len(batch_positions), per_rank):
            chunk = batch_positions[i:i + per_rank]
            loss = torch.nn.functional.cross_entropy(ddp(augment(INPUTS[chunk], noise)),
                                                     LABELS[chunk])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            step, start = step + 1, start + GLOBAL_BATCH
            if start >= SAMPLES:
                epoch, start = epoch + 1, 0
            if kind != "reference" and step % SNAPSHOT_EVERY == 0:
                problem = None
                try:
                    state = ex.capture_state(model, optimizer, scheduler, noise,
                                             {"epoch": epoch, "start": start, "step": step})
                    torch.save(state, mine)
                except BaseException as error:
                    problem = f"rank {RANK}: capture_state: {one_line(error)}"
                if not agree(problem is None):
                    return problem or "another rank's capture_state failed"
            if kind == "drill" and step == KILL_STEP:
                return None  # what this process still holds dies with it in the kill
            if start == 0:
                break
    if RANK == 0:
        torch.save(model.state_dict(), folder / f"{kind}_final.pt")
    dist.barrier()
    return None


def observation(folder: Path) -> dict:
    """What the judge needs of one submission: its problem, or its resumed final state."""
    if (folder / "problem").exists():
        return {"problem": (folder / "problem").read_text()}
    try:
        resumed = torch.load(folder / "resume_final.pt", weights_only=True)
    except Exception as error:
        return {"problem": f"the resumed run left no final weights ({one_line(error)})"}
    return {"resumed": as_data(dict(resumed))}


def one_attempt_more(folder: Path, phase: str) -> bool:
    """Counts this rank's attempts at `phase` of a submission; False once ATTEMPTS ran before
    (the submission's own code ended the job each time: a restart came in the middle)."""
    counter = folder / f"{phase}_attempts_rank{RANK}"
    tried = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(tried + 1))
    return agree(tried < ATTEMPTS)


def run_one(submission: str | None, folder: Path, phase: str) -> None:
    """The drill or the resume of one submission; a problem goes to folder/problem."""
    if submission:
        os.environ["COURSE_SUBMISSION"] = submission
    if not one_attempt_more(folder, phase):
        problem = f"the job died during the {phase} {ATTEMPTS} times, in the submission's code"
    else:
        ex, problem = exercises_or_error(6)
        if agree(problem is None):
            problem = train(ex, folder, phase)
        else:
            problem = problem or "another rank could not import the exercises"
    if RANK == 0 and problem:
        (folder / "problem").write_text(problem)
    dist.barrier()


def main():
    parser = argparse.ArgumentParser(description="lesson 6 grading: kill and resume")
    parser.add_argument("--submissions", default="")
    parser.add_argument("--work", required=True, help="a folder for the runs' files")
    parser.add_argument("--reference-only", action="store_true",
                        help="train the uninterrupted reference into --work and stop")
    args, _ = parser.parse_known_args()  # --skip: its one check is never skipped
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    work = Path(args.work)
    if args.reference_only:  # the grader's own run: no submission's code in it
        work.mkdir(parents=True, exist_ok=True)
        train(None, work, "reference")
        dist.destroy_process_group()
        return
    folders = [(submission, work / str(i))
               for i, submission in enumerate(submissions_to_grade(args.submissions))]
    for i, (_, folder) in enumerate(folders):
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / "done").exists():  # its one check runs from now on (job_checks.py)
            progress(i, ["resume"])
            write_progress(imported=True, running="resume")
    if not (work / "killed").exists():
        for submission, folder in folders:
            if not (folder / "drilled").exists() and not (folder / "problem").exists():
                announce("drill", submission)
                run_one(submission, folder, "drill")
                if RANK == 0:
                    (folder / "drilled").write_text("1")
                dist.barrier()
        if RANK == 0:
            (work / "killed").write_text(str(KILL_STEP))
        dist.barrier()
        if RANK == WORLD - 1:
            os.kill(os.getpid(), signal.SIGKILL)  # torchrun restarts the whole job
        dist.barrier()  # the others wait here until torchrun stops them
    for i, (submission, folder) in enumerate(folders):
        if (folder / "done").exists():
            continue
        select_submission(submission)  # the submission's header, then its one line
        if not (folder / "problem").exists():
            run_one(submission, folder, "resume")
        if RANK == 0:
            progress(i, ["resume"])
            write_progress(imported=True)
            write_observations({"resume": observation(folder)}, i)
            (folder / "done").write_text("1")
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
