"""Lesson 9 experiment: what Lightning's Trainer does with your processes, each fact by a run.

    python scripts/experiments/lesson9_trainer.py

Every run is Trainer(accelerator="cpu", devices=2, strategy=...) on 2 processes (the two
"nodes" of (a): 1 device each). Each worker writes what it saw to a report file; the table is
made from those reports, never typed.

(a) how the processes start: strategy "ddp" started by python (the Trainer runs this script
    again, LOCAL_RANK=1 set: _SubprocessScriptLauncher), "ddp_spawn" and "ddp_fork" (every
    rank a child, LOCAL_RANK set in it: _MultiProcessingLauncher), and num_nodes=2 simulated
    on this machine (two launches with NODE_RANK=0 and 1, MASTER_ADDR=127.0.0.1, one free
    port). No rank gets RANK: each is NODE_RANK x devices + LOCAL_RANK (lightning/pytorch/
    strategies/ddp.py, DDPStrategy.set_world_ranks), checked against dist.get_rank().
(b) self.log(name, value, sync_dist=True) where the ranks hold 6 and 5 samples. A value per
    rank (logged once, at the epoch's end: a "batch" of 1) is averaged over the ranks,
    unweighted. Per-step values are weighted by their batch_size, and both the weighted sum
    and the count are averaged over the ranks, which would cancel, but the count is an
    integer tensor: on gloo it is summed, then divided by W in place, rounded down when the
    total is odd (logger_connector/result.py, _ResultMetric.update and compute;
    lightning/fabric/utilities/distributed.py, _sync_ddp). Exact: sums, one division.
(c) rank_zero_only (lightning_utilities' decorator; DDPStrategy.set_world_ranks sets its rank
    to the global rank): which ranks ran a decorated function, in every run of (a).
(d) validation duplicates: with use_distributed_sampler=True (the default) the Trainer gives
    the validation loader a DistributedSampler (trainer/connectors/data_connector.py,
    _get_distributed_sampler), which pads N samples to a multiple of W by repeating the first
    ones: the logged accuracy counts those twice. The exact way: correct and seen counted with
    reduce_fx="sum" over an unpadded split of our own (use_distributed_sampler=False), divided
    once.
(e) ddp_fork: a tensor built once, in the parent, before fit or validate, is in its children
    without a copy: the same address, and none of its pages private to a child
    (/proc/self/pagemap) until the child writes to them (copy on write).
"""

import atexit
import json
import os
import struct
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from ddpcourse.cli import ArgumentParser
from ddpcourse.cluster.launch import run_commands
from ddpcourse.ports import free_port
from ddpcourse.report import format_table, summary_line
from ddpcourse.runtime import fail, needs_library

needs_library("lightning", "make setup-lesson9")  # before importing it: one line
import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.data import DataLoader, Subset, TensorDataset

ROOT = Path(__file__).resolve().parents[2]
THIS = str(Path(__file__).resolve())
REPORT = "LESSON9_TRAINER_REPORT"  # the file every worker appends its lines to
# strategy name -> DDPStrategy's start_method (ddp.py, register_strategies); the object form
# is used below because it takes a timeout for the process group.
START_METHODS = {"ddp": "popen", "ddp_spawn": "spawn", "ddp_fork": "fork"}
# What the Trainer prints and saves that these runs do not need.
QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False,
             enable_model_summary=False)
MB = 2**20
# Lightning destroys its process group at exit under nccl only (fabric/utilities/distributed.py):
# a gloo group left to the interpreter's end can abort a finished rank with "terminate called
# without an active exception". Every process of this file, children included, destroys it.
atexit.register(lambda: dist.is_initialized() and dist.destroy_process_group())
BUILT_IN_PID = None  # the process that built (e)'s dataset; a forked child inherits the value


def report(**fields) -> None:
    """One line of facts from this process (O_APPEND: lines of several processes stay whole)."""
    with open(os.environ[REPORT], "a") as f:
        f.write(json.dumps(fields) + "\n")


@rank_zero_only
def ran_here() -> bool:
    """True where rank_zero_only.rank == 0; elsewhere the decorator returns None, unrun."""
    return True


# ---------------------------------------------------------------- (a), (c): who is which rank


class Probe(L.LightningModule):
    """One training step of a 1-weight model: enough for the Trainer to start its processes,
    make the process group and wrap the model in DDP. Defined at the top of the module, so
    ddp_spawn's children, which import this file afresh, can unpickle it."""

    def __init__(self, mode: str):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.mode = mode

    def setup(self, stage):  # called once the processes exist and the group is made
        t = self.trainer
        report(kind="rank", mode=self.mode, pid=os.getpid(), ppid=os.getppid(),
               env={v: os.environ.get(v) for v in ("RANK", "LOCAL_RANK", "NODE_RANK")},
               global_rank=t.global_rank, local_rank=t.local_rank, node_rank=t.node_rank,
               devices=t.num_devices, world_size=t.world_size, dist_rank=dist.get_rank(),
               dist_world_size=dist.get_world_size(), rank_zero_only_ran=ran_here() is True)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.ones(4, 1)), batch_size=1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def run_mode(mode: str, timeout: float) -> None:
    """Worker: fit the probe under `mode` (a strategy name, or "nodes": one of two nodes)."""
    nodes = 2 if mode == "nodes" else 1
    strategy = DDPStrategy(start_method=START_METHODS.get(mode, "popen"),
                           timeout=timedelta(seconds=timeout))
    trainer = L.Trainer(accelerator="cpu", devices=1 if nodes == 2 else 2, num_nodes=nodes,
                        strategy=strategy, max_steps=1, **QUIET)
    # Lightning's "ddp" children run this file again with LOCAL_RANK set: only the process
    # this experiment started times the fit.
    started_here = "LOCAL_RANK" not in os.environ
    tick = time.perf_counter()
    trainer.fit(Probe(mode))
    if started_here:
        report(kind="fit", mode=mode, pid=os.getpid(), seconds=time.perf_counter() - tick)


# ------------------------------------------------- (b), (d): logged means against exact ones


def scored_set(n: int):
    """n samples (index, features, label) and a fixed classifier: which samples it gets
    right is fixed by the seed, so one process can score them all as the exact answer."""
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(n, 4, generator=generator)
    labels = torch.randint(0, 3, (n,), generator=generator)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    return TensorDataset(torch.arange(n), features, labels), model


class Scorer(L.LightningModule):
    """Validation accuracy, logged the usual ways and counted exactly.

    split="own": each rank takes every W-th sample from its rank on, no padding (the Trainer
    runs with use_distributed_sampler=False); split="trainer": a plain loader, which the
    Trainer gives a DistributedSampler."""

    def __init__(self, dataset, model, split: str, part: str):
        super().__init__()
        self.dataset, self.model, self.split, self.part = dataset, model, split, part

    def val_dataloader(self):  # called in each process, once it knows its rank
        data = self.dataset
        if self.split == "own":
            data = Subset(data, range(self.global_rank, len(data), self.trainer.world_size))
        return DataLoader(data, batch_size=2)

    def on_validation_epoch_start(self):
        self.sums = torch.zeros(2, dtype=torch.float64)  # correct, seen on this rank
        self.indices = []

    def validation_step(self, batch, batch_idx):
        index, features, labels = batch
        correct = (self.model(features).argmax(1) == labels).double()
        # The usual line: a batch's accuracy. Lightning keeps sum(value x batch_size) and
        # sum(batch_size) per rank; sync_dist averages both over the ranks (the W cancels,
        # but for the integer count's rounding), then divides.
        self.log("acc_steps", correct.mean(), batch_size=len(labels), sync_dist=True)
        # The exact way: sums, summed over the ranks (reduce_fx="sum"), divided once below.
        self.log("correct", correct.sum(), reduce_fx="sum", sync_dist=True)
        self.log("seen", float(len(labels)), reduce_fx="sum", sync_dist=True)
        self.sums += torch.stack([correct.sum(), torch.tensor(float(len(labels)))])
        self.indices += index.tolist()

    def on_validation_epoch_end(self):
        own = self.sums[0] / self.sums[1]
        # One value per rank (outside a step Lightning counts it as a batch of 1): sync_dist
        # averages the ranks' values, whatever their sample counts.
        self.log("acc_rank", own, sync_dist=True)
        total = self.sums.clone()
        dist.all_reduce(total)  # by hand: correct and seen summed over the ranks
        report(kind="score", part=self.part, rank=self.global_rank, indices=self.indices,
               correct=self.sums[0].item(), seen=self.sums[1].item(), own_acc=own.item(),
               by_hand=(total[0] / total[1]).item())


# ----------------------------------------------------------- (e): one dataset, no copies


def page_sharing(tensor: torch.Tensor) -> dict:
    """How many of the memory pages under `tensor` this process has, and how many of those
    no other process maps (bit 63 "present" and bit 56 "exclusively mapped" of each page's
    entry in /proc/self/pagemap, Linux); {} where that file cannot be read."""
    size = os.sysconf("SC_PAGE_SIZE")
    first = tensor.data_ptr() // size
    last = (tensor.data_ptr() + tensor.nbytes - 1) // size
    try:
        with open("/proc/self/pagemap", "rb") as f:
            f.seek(first * 8)
            raw = f.read((last - first + 1) * 8)
    except OSError:
        return {}
    entries = struct.unpack(f"{len(raw) // 8}Q", raw)
    present = [e for e in entries if e >> 63 & 1]
    return {"pages": len(entries), "present": len(present),
            "exclusive": sum(e >> 56 & 1 for e in present)}


class Reader(L.LightningModule):
    """Reads every sample of its shard of a dataset it was given, built before the fork."""

    def __init__(self, data: torch.Tensor):
        super().__init__()
        self.data = data  # a plain attribute: not a parameter, so nothing moves or copies it

    def val_dataloader(self):
        return DataLoader(TensorDataset(self.data), batch_size=4096)

    def on_validation_epoch_start(self):
        self.total = torch.zeros((), dtype=torch.float64)

    def validation_step(self, batch, batch_idx):
        self.total += batch[0].sum()  # reads the pages, writes none

    def on_validation_epoch_end(self):
        read = page_sharing(self.data)
        # A write copies the pages it touches (copy on write): this process's first MB only.
        self.data.view(-1)[: MB // 4] += 1
        written = page_sharing(self.data)
        report(kind="shared", rank=self.global_rank, pid=os.getpid(), ppid=os.getppid(),
               built_in=BUILT_IN_PID, data_ptr=self.data.data_ptr(), read=read,
               written=written)


def run_demos(timeout: float, val_size: int, shared_mb: int) -> None:
    """Worker for (b), (d), (e): three ddp_fork runs from this one process."""
    global BUILT_IN_PID
    dataset, model = scored_set(val_size)
    with torch.no_grad():  # one process scores every sample: the exact accuracy
        _, features, labels = dataset.tensors
        exact = (model(features).argmax(1) == labels).double().mean().item()
    report(kind="one_process", acc=exact, n=val_size)

    def trainer(**more):
        # The launcher writes its port into os.environ, where the next run's Trainer would
        # read it back: a fresh one for each run.
        os.environ["MASTER_PORT"] = str(free_port())
        return L.Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(
            start_method="fork", timeout=timedelta(seconds=timeout)), **QUIET, **more)

    for part, split, distributed_sampler in (("b", "own", False), ("d", "trainer", True)):
        tick = time.perf_counter()
        logged = trainer(use_distributed_sampler=distributed_sampler).validate(
            Scorer(dataset, model, split, part), verbose=False)[0]  # rank 0's, sent back
        report(kind="logged", part=part, seconds=time.perf_counter() - tick,
               **{name: float(value) for name, value in logged.items()})

    # Built here, once, before the fork; the children read it where it is.
    data = torch.randn(shared_mb * MB // 4 // 128, 128)
    BUILT_IN_PID = os.getpid()
    tick = time.perf_counter()
    trainer().validate(Reader(data), verbose=False)
    report(kind="logged", part="e", seconds=time.perf_counter() - tick, pid=os.getpid(),
           data_ptr=data.data_ptr(), pages=page_sharing(data))


# ------------------------------------------------------------------------- the experiment


def worker_env(report_path: str, **more) -> dict:
    """This environment without any launcher's variables, on the CPU, one thread per process."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK",
                        "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")}
    return dict(env, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", **{REPORT: report_path},
                **more)


def launch(name: str, commands: list[list[str]], envs: list[dict], args) -> float:
    """Run the worker command(s) together, each in a session of its own, killed whole (the
    processes the Trainer started with it) on time out; the wall time. One line if it fails."""
    tick = time.perf_counter()
    result = run_commands(commands, timeout=args.timeout, envs=envs, cwd=str(ROOT),
                          capture=True)
    if result.returncode == 124:
        fail(f"{name} did not finish within {args.timeout:g} s and was stopped")
    if result.returncode != 0:
        sys.stderr.write(result.stdout[-1500:] + result.stderr[-2500:])
        fail(f"{name} failed (exit status {result.returncode}); its output is above")
    return time.perf_counter() - tick


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def rank_row(label: str, lines: list[dict], wall: float) -> tuple[dict, list[dict]]:
    """(a)'s row for one launch, from its reports, and its ranks' reports."""
    ranks = sorted((x for x in lines if x["kind"] == "rank"), key=lambda x: x["global_rank"])
    fits = [x for x in lines if x["kind"] == "fit"]
    started = {x["pid"] for x in fits}  # the process(es) this experiment started
    if len(ranks) != 2 or not fits:
        fail(f"{label}: {len(ranks)} rank report(s) of 2 and {len(fits)} of the fit")
    for x in ranks:  # the Trainer's rank, the formula's and the process group's agree
        if not x["node_rank"] * x["devices"] + x["local_rank"] == x["global_rank"] == (
                x["dist_rank"]):
            fail(f"{label}: rank {x['global_rank']} is not NODE_RANK x devices + LOCAL_RANK")

    def who(x):
        if x["pid"] in started:
            return "ours"
        return "its child" if x["ppid"] in started else "other"

    def env(name):
        return ",".join(x["env"][name] or "-" for x in ranks)

    return {"part": "a", "run": label, "W": ranks[0]["dist_world_size"],
            "ranks": ", ".join(f"{x['global_rank']}={x['node_rank']}x{x['devices']}+"
                               f"{x['local_rank']} ({who(x)})" for x in ranks),
            "measured": f"env RANK={env('RANK')} NODE_RANK={env('NODE_RANK')} "
                        f"LOCAL_RANK={env('LOCAL_RANK')}",
            "trainer s": f"{max(x['seconds'] for x in fits):.1f}",
            "launch s": f"{wall:.1f}"}, ranks


def demo_rows(lines: list[dict], n: int) -> tuple[list[dict], dict]:
    """(b), (d), (e)'s rows from the ddp_fork runs' reports, and their numbers."""
    one = next((x for x in lines if x["kind"] == "one_process"), None)
    logged = {x["part"]: x for x in lines if x["kind"] == "logged"}
    scores = {p: sorted((x for x in lines if x["kind"] == "score" and x["part"] == p),
                        key=lambda x: x["rank"]) for p in "bd"}
    shared = sorted((x for x in lines if x["kind"] == "shared"), key=lambda x: x["rank"])
    if one is None or set(logged) != set("bde") or len(shared) != 2 or not all(
            len(v) == 2 for v in scores.values()):
        fail("the ddp_fork runs of (b), (d), (e) did not report from every rank")
    exact, world = one["acc"], 2

    def row(part, run, ranks, measured, seconds):
        return {"part": part, "run": run, "W": world, "ranks": ranks, "measured": measured,
                "trainer s": seconds, "launch s": "-"}

    # (b) Ranks with 6 and 5 samples. Lightning's mean of the ranks' values, and its
    # per-step bookkeeping: sum(correct) / W over int(sum(seen) / W), the count rounded down.
    b, bl = scores["b"], logged["b"]
    split = ", ".join(f"{x['seen']:g} (acc {x['own_acc']:.4f})" for x in b)
    correct, seen = sum(x["correct"] for x in b), sum(x["seen"] for x in b)
    predicted = (correct / world) / int(seen / world)
    sums = bl["correct"] / bl["seen"]
    numbers = {"gap": abs(bl["acc_rank"] - exact), "gap_steps": abs(bl["acc_steps"] - exact),
               "gap_sums": abs(sums - exact)}
    seconds = f"{bl['seconds']:.1f}"
    rows = [
        row("b", "a rank's acc, logged once, sync_dist", split,
            f"logged={bl['acc_rank']:.4f} exact={exact:.4f} gap={numbers['gap']:.4f}", seconds),
        row("b", "a step's acc, batch_size, sync_dist", split,
            f"logged={bl['acc_steps']:.4f} predicted=({correct:g}/{world})/int({seen:g}/{world})"
            f"={predicted:.4f} exact={exact:.4f} gap={numbers['gap_steps']:.4f}", seconds),
        row("b", "sums: reduce_fx=sum, all_reduce", split,
            f"logged={sums:.4f} by_hand={b[0]['by_hand']:.4f} exact={exact:.4f} "
            f"gap={numbers['gap_sums']:.4f}", seconds)]

    # (d) The Trainer's own sampler pads: a sample is scored twice. The exact way is (b)'s
    # sums over an unpadded split of our own.
    d, dl = scores["d"], logged["d"]
    indices = [i for x in d for i in x["indices"]]
    twice = sorted({i for i in indices if indices.count(i) > 1})
    numbers["duplicates"] = len(indices) - n
    rows += [
        row("d", "the Trainer's sampler (default)", ", ".join(f"{x['seen']:g}" for x in d),
            f"N={n} scored={len(indices)} duplicates={numbers['duplicates']} twice={twice} "
            f"logged={dl['acc_steps']:.4f} exact={exact:.4f}", f"{dl['seconds']:.1f}"),
        row("d", "own unpadded split, sums", ", ".join(f"{x['seen']:g}" for x in b),
            f"N={n} scored={seen:g} duplicates={seen - n:g} "
            f"logged={sums:.4f} ({bl['correct']:g}/{bl['seen']:g}) exact={exact:.4f}", seconds)]

    # (e) One tensor, built in the parent: where the children find it, and whose pages.
    el = logged["e"]
    page_mb = os.sysconf("SC_PAGE_SIZE") / MB
    same = all(x["data_ptr"] == el["data_ptr"] for x in shared)
    numbers["private_mb"] = max(x["read"].get("exclusive", -1) for x in shared) * page_mb
    written = max(x["written"].get("exclusive", -1) for x in shared) * page_mb
    rows.append(row(
        "e", "ddp_fork: a tensor built before it",
        ", ".join(f"pid {x['pid']} (parent {x['ppid']})" for x in shared),
        f"built_in={shared[0]['built_in']} same_address={same} "
        f"size={el['pages'].get('pages', 0) * page_mb:.0f}MB "
        f"private={numbers['private_mb']:.0f}MB after_a_1MB_write={written:.0f}MB",
        f"{el['seconds']:.1f}"))
    return rows, numbers


def main():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help="internal: run as one of this experiment's workers")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds each launch (and each process group) may take")
    parser.add_argument("--val-size", type=int, default=11,
                        help="validation samples for (b) and (d): odd, so 2 ranks split unevenly")
    parser.add_argument("--shared-mb", type=int, default=32, help="(e)'s dataset, in MB")
    args = parser.parse_args()
    if args.timeout <= 0:
        parser.error("--timeout must be > 0")
    if args.val_size < 3 or args.val_size % 2 == 0:
        parser.error("--val-size must be odd and >= 3: 2 ranks must hold different numbers")
    if not 1 <= args.shared_mb <= 1024:
        parser.error("--shared-mb must be between 1 and 1024")
    if args.worker in ("ddp", "ddp_spawn", "ddp_fork", "nodes"):
        return run_mode(args.worker, args.timeout)
    if args.worker == "demos":
        return run_demos(args.timeout, args.val_size, args.shared_mb)
    if args.worker:
        parser.error(f"no worker {args.worker!r}")

    rows, ranks = [], {}
    worker = [sys.executable, THIS, "--timeout", str(args.timeout)]
    with tempfile.TemporaryDirectory() as folder:
        for mode, label in (("ddp", "ddp, started by python"), ("ddp_spawn", "ddp_spawn"),
                            ("ddp_fork", "ddp_fork"), ("nodes", "ddp, num_nodes=2 x 1 device")):
            path = Path(folder, f"{mode}.jsonl")
            if mode == "nodes":  # two launches, as on two machines: one address and port
                port = str(free_port())
                commands = [[*worker, "--worker", mode]] * 2
                envs = [worker_env(str(path), NODE_RANK=str(node), MASTER_ADDR="127.0.0.1",
                                   MASTER_PORT=port) for node in (0, 1)]
            else:
                commands, envs = [[*worker, "--worker", mode]], [worker_env(str(path))]
            wall = launch(label, commands, envs, args)
            row, ranks[mode] = rank_row(label, read(path), wall)
            rows.append(row)
            print(f"(a) {label}: 2 ranks reported, {wall:.1f} s", flush=True)

        # (c) Every rank of (a) called the decorated function; which ran it?
        ran = {mode: [x["global_rank"] for x in r if x["rank_zero_only_ran"]]
               for mode, r in ranks.items()}
        skipped_local_0 = [x for x in ranks["nodes"]
                           if x["local_rank"] == 0 and not x["rank_zero_only_ran"]]
        rows.append({"part": "c", "run": "rank_zero_only, in (a)", "W": 2,
                     "ranks": "every rank called it",
                     "measured": "ran_on " + " ".join(f"{m}={r}" for m, r in ran.items()) + (
                         f" (not on node 1's LOCAL_RANK 0: global "
                         f"{skipped_local_0[0]['global_rank']})" if skipped_local_0 else ""),
                     "trainer s": "-", "launch s": "-"})

        path = Path(folder, "demos.jsonl")
        wall = launch("the ddp_fork runs of (b), (d), (e)",
                      [[*worker, "--worker", "demos", "--val-size", str(args.val_size),
                        "--shared-mb", str(args.shared_mb)]], [worker_env(str(path))], args)
        print(f"(b), (d), (e): 3 ddp_fork runs from one process, {wall:.1f} s", flush=True)
        more, numbers = demo_rows(read(path), args.val_size)
        rows += more

    print("\nLightning's Trainer, 2 processes on the CPU. ranks: (a) global = NODE_RANK x "
          "devices + LOCAL_RANK, and whose process (ours: this experiment started it); (b), "
          "(d) samples per rank. trainer s: the fit (a) or validate call in the process we "
          "started; launch s: that process, start to exit.")
    print(format_table(rows))
    print(summary_line(trainer_runs=len(ranks) + 3, rank_zero_only_ran_on=",".join(
                           str(r) for r in sorted({r for v in ran.values() for r in v})),
                       sync_dist_gap=round(numbers["gap"], 4),
                       per_step_gap=round(numbers["gap_steps"], 4),
                       sums_gap=round(numbers["gap_sums"], 4),
                       duplicates=numbers["duplicates"],
                       private_mb=round(numbers["private_mb"], 1)))

if __name__ == "__main__":
    main()
