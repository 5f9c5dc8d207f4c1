"""Lesson 9 experiment: what each launcher gives its workers, and which process starts which.

    python scripts/experiments/lesson9_launchers.py

Each launcher starts 2 workers of this same file (--as-worker), which report their
environment, the arguments added to their command line, their process and their parent;
the table is made from those reports, never typed. The launchers: torchrun; Lightning
Fabric and Lightning's Trainer started by plain `python` (the library runs the script again
for the other rank); `accelerate launch`; DeepSpeed's `deepspeed` launcher; and a Dask
cluster, whose workers get nothing and are handed the variables by the task.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from ddpcourse.cli import ArgumentParser
from ddpcourse.ports import free_port
from ddpcourse.report import format_table, summary_line

ROOT = Path(__file__).resolve().parents[2]
THIS = str(Path(__file__).resolve())
BIN = Path(sys.executable).parent
VARIABLES = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
             "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES"]
REPORT = "LESSON9_REPORT"  # where a worker appends its line


def report(kind: str, extra_args: list[str]) -> None:
    """A worker's line: its variables (after the library set up, where it sets some)."""
    seen = {name: os.environ.get(name) for name in VARIABLES}
    with open(os.environ[REPORT], "a") as f:
        f.write(json.dumps({"kind": kind, "pid": os.getpid(), "ppid": os.getppid(),
                            "args": extra_args, "env": seen}) + "\n")


def as_worker(kind: str, extra_args: list[str]) -> None:
    """Run as one of a launcher's workers: set up as that library does, then report."""
    if kind == "fabric":
        from lightning.fabric import Fabric

        fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
        fabric.launch()  # plain python: runs this script again for rank 1
        report(kind, extra_args)
    elif kind == "trainer":
        import lightning as L
        import torch

        class Probe(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(1, 1)

            def setup(self, stage):  # the processes exist now
                report(kind, extra_args)

            def training_step(self, batch, batch_idx):
                return self.layer(batch[0]).sum()

            def train_dataloader(self):
                return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(
                    torch.ones(4, 1)), batch_size=2)

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=1, logger=False,
                  enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False).fit(Probe())
    else:  # torchrun, accelerate launch, deepspeed: the launcher set everything
        report(kind, extra_args)
    import torch.distributed as dist

    # Lightning destroys its group at exit under nccl only: a gloo group left to the
    # interpreter's end can abort a finished worker ("terminate called without an active
    # exception").
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def dask_workers(env: dict) -> None:
    """Two Dask worker processes; each reports from a task, as lesson9_dask.py's would run."""
    from distributed import Client, LocalCluster

    def task():
        report("dask", [])
        return os.getpid()

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None, env={REPORT: env[REPORT]},
                      silence_logs=50) as cluster, Client(cluster) as client:
        client.gather([client.submit(task, workers=[w], pure=False)
                       for w in sorted(client.scheduler_info()["workers"])])


def shown(value: str | None) -> str:
    return "-" if value is None else value or '""'


def launchers() -> list[tuple[str, list[str], dict]]:
    """(name, command, extra environment) for each launcher, two workers each."""
    worker = [THIS, "--as-worker"]
    return [
        ("torchrun", [str(BIN / "torchrun"), "--nproc-per-node=2",
                      f"--master-port={free_port()}", *worker, "torchrun"], {}),
        ("Fabric, python", [sys.executable, *worker, "fabric"], {}),
        ("Trainer, python", [sys.executable, *worker, "trainer"], {}),
        # Without GPUs, --multi_gpu makes `accelerate launch` start 2 processes (through
        # torchrun; --cpu alone starts one, bar mpirun); ACCELERATE_USE_CPU=1 makes an
        # Accelerator() in them a gloo group, as cpu=True would (this probe makes none).
        ("accelerate launch", [str(BIN / "accelerate"), "launch", "--multi_gpu",
                               "--num_processes", "2", "--num_machines", "1",
                               "--mixed_precision", "no", "--dynamo_backend", "no",
                               "--main_process_port", str(free_port()), *worker, "accelerate"],
         {"ACCELERATE_USE_CPU": "1"}),
        ("deepspeed", [str(BIN / "deepspeed"), "--num_gpus", "2",
                       "--master_port", str(free_port()), *worker, "deepspeed"], {}),
        ("Dask", [sys.executable, THIS, "--dask"], {}),
    ]


def main():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--as-worker", help="run as a launcher's worker of this kind")
    parser.add_argument("--dask", action="store_true", help="run the Dask cluster's part")
    parser.add_argument("--timeout", type=float, default=180, help="seconds per launcher")
    args, extra = parser.parse_known_args()
    if args.as_worker:
        return as_worker(args.as_worker, extra)
    if args.dask:
        return dask_workers(os.environ)

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, command, more in launchers():
            path = Path(folder, f"{len(rows)}.jsonl")
            env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1",
                       **{REPORT: str(path)}, **more)
            # A session of its own, killed whole on time out: the workers it started too. (Not
            # run_commands: the table needs the launcher's pid, to name each worker's parent.)
            launcher = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)
            try:
                output, _ = launcher.communicate(timeout=args.timeout)
            except subprocess.TimeoutExpired:
                os.killpg(launcher.pid, signal.SIGKILL)
                launcher.communicate()
                sys.exit(f"error: {name} did not end within {args.timeout:g} s")
            lines = path.read_text().splitlines() if path.exists() else []
            if launcher.returncode != 0 or len(lines) != 2:
                sys.stderr.write(output[-3000:])
                sys.exit(f"error: {name} ended with {launcher.returncode} and {len(lines)} "
                         "report(s) of 2; its output is above")
            workers = sorted((json.loads(line) for line in lines),
                             key=lambda w: (w["env"]["LOCAL_RANK"] or "", w["pid"]))
            pids = {w["pid"] for w in workers}
            for w in workers:
                parent = ("is the launcher" if w["pid"] == launcher.pid else
                          "the launcher" if w["ppid"] == launcher.pid else
                          "the other worker" if w["ppid"] in pids else
                          "a process the launcher started")
                rows.append({"launcher": name, "started by": parent,
                             "added args": " ".join(w["args"]) or "-",
                             **{v: shown(w["env"][v]) for v in VARIABLES if v != "MASTER_PORT"},
                             "MASTER_PORT": "set" if w["env"]["MASTER_PORT"] else "-"})
            print(f"{name}: 2 workers reported", flush=True)
    print("\nwhat each worker found in its environment (- : not set), and who started it:")
    print(format_table(rows))
    print(summary_line(launchers=len(rows) // 2, workers=len(rows)))


if __name__ == "__main__":
    main()
