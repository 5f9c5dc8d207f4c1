"""Lesson 9 experiment: every library's run against lesson 3's DDP, tensor by tensor.

    python scripts/experiments/lesson9_same_weights.py --world-sizes 2,3

For each world size W, lesson 3's step (its DDP script, under torchrun) trains first;
then each library's script trains the same model from the same seed on the same data order
with the same global batch, started the ways it can be: by plain `python` (the library
starts the other processes), by torchrun, by DeepSpeed's own launcher, or by a Dask
cluster. Each row compares the final state dict with lesson 3's: how many of its tensors
are not equal, and the largest gap. 0 is bit for bit; the reasons for anything else are in
the scripts' docstrings (DeepSpeed at W = 3 averages in another order, and with its
defaults clips the gradients; Accelerate's own loader is another order of the data).
"""

import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from ddpcourse.cli import ArgumentParser
from ddpcourse.cluster.launch import launch, run_commands
from ddpcourse.ports import free_port
from ddpcourse.report import format_table, summary_line

ROOT = Path(__file__).resolve().parents[2]

# (library, step under scripts/, how it is started, extra arguments): started "python"
# passes --devices W (the library starts W processes), "torchrun" is the course's launcher,
# "deepspeed" is `deepspeed --num_gpus W` (it adds --local_rank=N), "dask" passes --workers W.
RUNS = [
    ("Fabric", "lesson9_fabric", "python", []),
    ("Fabric", "lesson9_fabric", "torchrun", []),
    ("Trainer", "lesson9_lightning", "python", []),
    ("Trainer", "lesson9_lightning", "torchrun", []),
    ("Accelerate", "lesson9_accelerate", "torchrun", []),
    ("Accelerate, its own loader", "lesson9_accelerate", "torchrun", ["--accelerate-loader"]),
    ("DeepSpeed ZeRO-0", "lesson9_deepspeed", "torchrun", ["--zero-stage", "0"]),
    ("DeepSpeed ZeRO-1", "lesson9_deepspeed", "torchrun", ["--zero-stage", "1"]),
    ("DeepSpeed ZeRO-2", "lesson9_deepspeed", "torchrun", ["--zero-stage", "2"]),
    ("DeepSpeed ZeRO-3", "lesson9_deepspeed", "torchrun", ["--zero-stage", "3"]),
    ("DeepSpeed ZeRO-2", "lesson9_deepspeed", "deepspeed", ["--zero-stage", "2"]),
    ("DeepSpeed ZeRO-0, its defaults", "lesson9_deepspeed", "torchrun",
     ["--zero-stage", "0", "--deepspeed-defaults"]),
    ("Dask workers", "lesson9_dask", "dask", []),
]
REFERENCE = "lesson3_ddp"  # lesson 3's step, which every run is held against


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", default="2,3", help="comma-separated W")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--only", default="", help="comma-separated words: runs whose library "
                                                   "names one of them (Fabric,DeepSpeed,...)")
    parser.add_argument("--timeout", type=float, default=240, help="seconds per run")
    args = parser.parse_args()
    try:
        args.world_sizes = [int(w) for w in args.world_sizes.split(",")]
    except ValueError:
        parser.error("--world-sizes takes numbers, comma-separated")
    if not all(1 <= w <= 8 for w in args.world_sizes) or args.epochs < 1:
        parser.error("world sizes must be 1 to 8, and --epochs at least 1")
    words = [w.strip().lower() for w in args.only.split(",") if w.strip()]
    args.runs = [r for r in RUNS if not words or any(w in r[0].lower() for w in words)]
    if not args.runs:
        parser.error(f"--only {args.only!r} names no library")
    return args


def train(step_name, started_by, world, extra, checkpoint, args) -> float:
    """One run of scripts/STEP_NAME.py to `checkpoint`; its wall time. Exits with one line if
    it fails."""
    script = f"scripts/{step_name}.py"
    step = ["--epochs", str(args.epochs), "--checkpoint", str(checkpoint), *extra]
    tick = time.perf_counter()
    if started_by == "torchrun":
        result = launch(script, step, nproc=world, timeout=args.timeout, cwd=str(ROOT),
                        capture=True, echo=False, backend="gloo")
    else:
        env = None  # this process's
        if started_by == "deepspeed":  # on a CPU it shows the workers CUDA_VISIBLE_DEVICES=0,..
            command = [str(Path(sys.executable).parent / "deepspeed"), "--num_gpus", str(world),
                       "--master_port", str(free_port()), script, *step]
            # One thread per worker, as torchrun sets when it starts several: the CPU kernels'
            # sums then run in the same order as lesson 3's.
            env = dict(os.environ, OMP_NUM_THREADS="1")
        else:
            command = ([sys.executable, script, "--devices", str(world), *step]
                       if started_by == "python" else
                       [sys.executable, script, "--workers", str(world), "--", *step])
        # A session of its own, killed whole on time out: the library's other processes too.
        result = run_commands([command], timeout=args.timeout, envs=env and [env],
                              cwd=str(ROOT), capture=True)
    if result.returncode == 124:
        sys.exit(f"error: {script} ({started_by}, W = {world}) did not finish within "
                 f"{args.timeout:g} s and was stopped")
    if result.returncode != 0:
        sys.stderr.write(result.stdout[-1500:] + result.stderr[-2500:])
        sys.exit(f"error: {script} ({started_by}, W = {world}) failed; its output is above")
    return time.perf_counter() - tick


def compare(reference: dict, trained: dict) -> tuple[int, float]:
    """(tensors that are not equal, the largest |gap| in them)."""
    unequal = [n for n in reference if not torch.equal(reference[n], trained[n])]
    gap = max(((reference[n].double() - trained[n].double()).abs().max().item()
               for n in unequal), default=0.0)
    return len(unequal), gap


def main():
    args = parse_args()
    rows, identical = [], 0
    with tempfile.TemporaryDirectory() as folder:
        for world in args.world_sizes:
            ddp = Path(folder, f"ddp_w{world}.pt")
            train(REFERENCE, "torchrun", world, [], ddp, args)
            reference = torch.load(ddp, weights_only=False)["model"]
            for library, script, started_by, extra in args.runs:
                checkpoint = Path(folder, "run.pt")
                seconds = train(script, started_by, world, extra, checkpoint, args)
                trained = torch.load(checkpoint, weights_only=False)["model"]
                count, gap = compare(reference, trained)
                identical += count == 0
                rows.append({"library": library, "started by": started_by, "W": world,
                             "tensors not equal": f"{count} of {len(reference)}",
                             "max |gap|": f"{gap:.3g}", "wall s": f"{seconds:.1f}"})
                print(f"W = {world}: {library} ({started_by}): {count} tensor(s) not equal",
                      flush=True)
    print(f"\nfinal weights against lesson 3's DDP (torchrun, the same seed, data order and "
          f"global batch), after {args.epochs} epoch(s):")
    print(format_table(rows))
    print(summary_line(runs=len(rows), bit_identical=identical,
                       world_sizes=",".join(map(str, args.world_sizes))))


if __name__ == "__main__":
    main()
