"""Lesson 3 benchmark: one device vs DDP on 2 and 4 processes, and what starting a job costs.

    make bench-ddp
    python scripts/experiments/lesson3_benchmark.py --epochs 8 --nprocs 2 4

Each setting runs twice: once to train (samples/s over the training loop, and the wall time
of the whole run), once with --epochs 0, which starts the processes, imports torch and timm,
meets at the rendezvous, builds the data and the model, and stops: the start-up cost alone.
The single-device run is lesson2_single_device.py under plain python; the others are
lesson3_ddp.py under torchrun, with the CPU cores shared out among the processes.
"""

import subprocess
import sys
import time
from pathlib import Path

from ddpcourse.cli import ArgumentParser
from ddpcourse.cluster.launch import LaunchError, launch, visible_gpu_count
from ddpcourse.report import format_table, parse_summary, summary_line

ROOT = Path(__file__).resolve().parents[2]

SINGLE = "scripts/lesson2_single_device.py"
DDP = "scripts/lesson3_ddp.py"


def run_once(nproc: int | None, script_args: list[str], timeout: float) -> tuple[dict, float]:
    """(summary fields, wall seconds) of one run; nproc None means one device, plain python."""
    # Its own checkpoint file, so a benchmark never overwrites the lessons' trained models.
    script_args = [*script_args, "--checkpoint", f"runs/benchmark_{nproc or 1}.pt"]
    tick = time.perf_counter()
    if nproc is None:
        result = subprocess.run([sys.executable, SINGLE, *script_args], cwd=ROOT,
                                capture_output=True, text=True, timeout=timeout)
    else:
        try:
            result = launch(DDP, script_args, nproc=nproc, timeout=timeout, cwd=str(ROOT),
                            capture=True, echo=False)
        except LaunchError as error:
            sys.exit(f"error: {error}")
    wall = time.perf_counter() - tick
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        sys.exit(f"error: the run {'on one device' if nproc is None else f'on {nproc}'} "
                 f"failed with exit code {result.returncode}")
    return parse_summary(result.stdout), wall


def main():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--model", default="test_resnet")
    parser.add_argument("--nprocs", type=int, nargs="+", default=None,
                        help="DDP world sizes to compare with one device (default: 2 4 on "
                             "the CPU; 2, 4, 8 up to the number of GPUs, or 1 on one GPU)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per run")
    args = parser.parse_args()
    if args.nprocs is None:
        gpus = visible_gpu_count()  # one process per GPU
        args.nprocs = ([w for w in (2, 4, 8) if w <= gpus] or [1]) if gpus else [2, 4]
    if args.epochs < 1 or min(args.nprocs) < 1:
        parser.error("--epochs and every --nprocs value must be at least 1")
    common = ["--model", args.model]

    rows, baseline = [], None
    for nproc in [None, *args.nprocs]:
        name = "one device" if nproc is None else f"DDP x {nproc}"
        print(f"running: {name}, {args.epochs} epochs, then start-up alone", flush=True)
        trained, wall = run_once(nproc, [*common, "--epochs", str(args.epochs)], args.timeout)
        _, startup = run_once(nproc, [*common, "--epochs", "0"], args.timeout)
        rate = float(trained["samples_per_s"])
        baseline = baseline or rate
        rows.append({"setup": name, "processes": nproc or 1,
                     "samples/s": f"{rate:.0f}", "speed-up": f"{rate / baseline:.2f}",
                     "val acc": trained["val_acc"], "run wall s": f"{wall:.1f}",
                     "start-up s": f"{startup:.1f}"})
    print(format_table(rows))
    print("samples/s counts the training loop only; run wall s is the whole run, start to end; "
          "start-up s is a run with --epochs 0 (launcher, imports, rendezvous, data, model)")
    print(summary_line(**{f"samples_per_s_{r['processes']}": r["samples/s"] for r in rows},
                       **{f"startup_s_{r['processes']}": r["start-up s"] for r in rows},
                       epochs=args.epochs, model=args.model))


if __name__ == "__main__":
    main()
