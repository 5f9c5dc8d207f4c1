"""Run under `torchrun --max-restarts=K` by the lesson 6 grading tests: capture_state and
restore_state, graded by a kill.

For each submission, in order, the job trains a small DDP model (dropout from torch's
global generator, input noise from a per-rank generator, SGD with momentum, a cosine
schedule) three times over its data:
  reference  never interrupted; its final weights are the answer;
  drill      every rank writes its own snapshot (capture_state, torch.save) every
             SNAPSHOT_EVERY steps; at KILL_STEP the last rank sends itself SIGKILL;
  resume     torchrun restarts every worker; each reloads its snapshot (torch.load,
             restore_state) and trains to the end.
The worker then prints `resume: ok, bit-identical at W ranks` or `resume: FAILED: ...`.
Work in progress lives in --work (one folder per submission), so a restarted job knows where
it was. The positions each rank trains come from the grader's own copy of the sampler
arithmetic, so a mistake in resume_indices does not cost this exercise.
"""

import argparse
import os
import signal
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from common import RANK, WORLD, one_line, select_submission, submissions_to_grade
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpcourse.grading import load_exercises

SAMPLES, GLOBAL_BATCH, EPOCHS = 96, 24, 3   # 4 steps per epoch, 12 in all
SNAPSHOT_EVERY, KILL_STEP = 3, 8            # killed mid-epoch 2, after the snapshot at 6
RESTART = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def positions(epoch: int, start: int) -> list[int]:
    generator = torch.Generator()
    generator.manual_seed(epoch)
    order = torch.randperm(SAMPLES, generator=generator).tolist()
    return order[start:][RANK::WORLD]


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=EPOCHS * 4)
    noise = torch.Generator().manual_seed(100 + RANK)
    return model, optimizer, scheduler, noise


DATA = torch.Generator().manual_seed(7)
INPUTS = torch.randn(SAMPLES, 8, generator=DATA)
LABELS = torch.randint(0, 4, (SAMPLES,), generator=DATA)


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
            inputs = INPUTS[chunk] + 0.1 * torch.randn(len(chunk), 8, generator=noise)
            loss = torch.nn.functional.cross_entropy(ddp(inputs), LABELS[chunk])
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
                dist.barrier()  # every snapshot of step 6 is written
                (folder / "killed").write_text(str(step))
                dist.barrier()
                if RANK == WORLD - 1:
                    os.kill(os.getpid(), signal.SIGKILL)  # torchrun restarts the whole job
                dist.barrier()  # the others wait here until torchrun stops them
            if start == 0:
                break
    if RANK == 0:
        torch.save(model.state_dict(), folder / f"{kind}_final.pt")
    dist.barrier()
    return None


def verdict(folder: Path) -> str:
    if (folder / "problem").exists():
        return "resume: FAILED: " + (folder / "problem").read_text()
    reference = torch.load(folder / "reference_final.pt", weights_only=False)
    resumed = torch.load(folder / "resume_final.pt", weights_only=False)
    differing = [k for k in reference if not torch.equal(reference[k], resumed[k])]
    if differing:
        biggest = max((reference[k] - resumed[k]).abs().max().item() for k in differing)
        return (f"resume: FAILED: after the kill the final weights differ from the run that "
                f"never stopped ({len(differing)} of {len(reference)} tensors, by up to "
                f"{biggest:.2e}): something that shapes training was not captured or restored")
    return f"resume: ok, bit-identical at {WORLD} ranks"


def main():
    parser = argparse.ArgumentParser(description="lesson 6 grading: kill and resume")
    parser.add_argument("--submissions", default="")
    parser.add_argument("--work", required=True, help="a folder for the runs' files")
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    for i, submission in enumerate(submissions_to_grade(args.submissions)):
        folder = Path(args.work) / str(i)
        folder.mkdir(parents=True, exist_ok=True)
        if (folder / "done").exists():
            continue
        if RESTART == 0 or not (folder / "killed").exists():
            select_submission(submission)  # prints the submission's header once
        elif submission:
            os.environ["COURSE_SUBMISSION"] = submission
        ex = load_exercises(6)
        if (folder / "killed").exists():
            problem = train(ex, folder, "resume")
        else:
            problem = train(ex, folder, "reference") or train(ex, folder, "drill")
        if RANK == 0:
            if problem:
                (folder / "problem").write_text(problem)
            print(verdict(folder), flush=True)
            (folder / "done").write_text("1")
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
