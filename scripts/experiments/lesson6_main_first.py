"""Lesson 6 experiment: one rank prepares the data, the others wait: the timeout, and 3 fixes.

    make lesson6-main-first NPROC=3  # prints, then runs, this command:
    python scripts/experiments/lesson6_main_first.py --nproc 3

The "preparation" stands for tokenizing a dataset into a cache file: 600 generated documents,
a word's index in a small vocabulary per token, and a sleep (--prepare-seconds, 8 s in all)
for the time a real tokenizer takes. The job's collectives run on a group whose timeout
(--timeout, 3 s) stands for the default one (10 minutes on nccl, 30 on gloo), shorter than
the preparation. Each case is a torchrun job of NPROC workers, timed from here:

(a) the failure: rank 0 prepares alone; the others wait in `dist.barrier(group=job)` and give
    up after 3 s. Each rank prints what it saw: torchrun stops rank 0 mid-preparation, or, where
    the others take a while to exit (a loaded machine), rank 0 reaches the barrier and finds
    them gone. Either way the preparation is lost.
(b) prepare before launch: this script's --prepare-only pass, one process and no process
    group, writes the cache; the job then finds it and only reads it.
(c) main process first: every rank makes a group with a longer timeout for this phase only
    (`dist.new_group(timeout=...)`, --phase-timeout, 60 s); rank 0 prepares, all meet in that
    group's barrier, the others read the cache; the group is destroyed, and the rest of the
    job keeps its short timeout.
(d) the work split over the ranks: each rank tokenizes its share of the documents into a file
    of its own, all meet in the job's barrier (each arrives after 8/NPROC s of its own work,
    so nobody waits long), then every rank reads every share.
Every fix must give every rank the same tokens (a CRC-32 checksum, compared over the ranks).
Files go to --out (runs/lesson6_main_first), one folder per case.
"""

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import zlib
from datetime import timedelta
from pathlib import Path

from ddpcourse.cli import ArgumentParser
from ddpcourse.cluster.launch import LaunchError, launch
from ddpcourse.report import format_table, parse_summary, summary_line

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "scripts/experiments/lesson6_main_first.py"
WORDS = ("the of and to in a is that for it as with was on be by this are from at or an not "
         "which have but they one all were there their has been more if can will when who so "
         "no what out up into its time only some could new other than then also two").split()
VOCAB = {word: i for i, word in enumerate(WORDS)}
# init_process_group's timeout, used only to start: on a busy machine the workers can finish
# importing torch seconds apart, which is not this drill. Every later collective runs on
# `job`, the group with the short timeout.
START_TIMEOUT_S = 60
CASES = {"alone": "(a) rank 0 prepares, the others wait",
         "prepared": "(b) prepared before launch",
         "main-first": "(c) main process first, longer phase timeout",
         "split": "(d) the work split over the ranks"}



def say(*args, end="\n", flush=True):
    """print in one write: the ranks share torchrun's pipe, and under python -u or
    PYTHONUNBUFFERED a print's text and its newline go out apart, so two ranks' lines could
    join."""
    sys.stdout.write(" ".join(str(a) for a in args) + end)
    sys.stdout.flush()


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=3, help="processes of each job")
    parser.add_argument("--documents", type=int, default=600, help="documents to tokenize")
    parser.add_argument("--prepare-seconds", type=float, default=8,
                        help="seconds the whole preparation takes (one process)")
    parser.add_argument("--timeout", type=float, default=3,
                        help="seconds the job's group waits in a collective")
    parser.add_argument("--phase-timeout", type=float, default=60,
                        help="seconds the preparation's own group waits, in (c)")
    parser.add_argument("--out", default="runs/lesson6_main_first", help="folder for the caches")
    parser.add_argument("--launch-timeout", type=float, default=120,
                        help="wall-clock limit of each job, in seconds")
    parser.add_argument("--prepare-only", action="store_true",
                        help="write the whole cache into --cache in this process, then stop")
    parser.add_argument("--case", choices=sorted(CASES), help="run one case (under torchrun)")
    parser.add_argument("--cache", help="the cache folder of --prepare-only or --case")
    args = parser.parse_args()
    if args.documents < 1 or args.prepare_seconds < 0:
        parser.error("--documents must be >= 1 and --prepare-seconds >= 0")
    if not 0 < args.timeout < args.prepare_seconds < args.phase_timeout:
        parser.error(f"the drill needs --timeout < --prepare-seconds < --phase-timeout (here "
                     f"{args.timeout:g}, {args.prepare_seconds:g}, {args.phase_timeout:g}): a "
                     "preparation longer than the job's timeout, shorter than the phase's")
    if (args.prepare_only or args.case) and not args.cache:
        parser.error("--prepare-only and --case need --cache FOLDER")
    if args.case and "RANK" not in os.environ:
        parser.error(f"--case runs under torchrun; start the drill with: python {SCRIPT}")
    if not (args.case or args.prepare_only) and not 2 <= args.nproc <= 16:
        parser.error("--nproc must be 2-16: a rank that waits needs another one to wait for")
    return args


# --- the data: generated documents, tokenized into a cache file --------------------------------

def documents(count, seed=0):
    """The raw dataset: `count` documents of 20 to 60 words (generated: nothing is downloaded)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60)))
            for _ in range(count)]


def share(count, rank, world_size):
    """The documents rank `rank` tokenizes in (d): a contiguous block, so that the shares read
    in rank order are the whole dataset in its order."""
    return range(rank * count // world_size, (rank + 1) * count // world_size)


def tokenize_into(path, docs, seconds, progress=None):
    """Tokenize `docs` and write them to `path` atomically (a temporary file, then a rename:
    a reader never sees half a cache). The sleep stands for the tokenizer's time, `seconds`
    in all. `progress[0]` counts the documents done."""
    import torch

    tokens, lengths = [], []
    for i, doc in enumerate(docs):
        ids = [VOCAB[word] for word in doc.split()]
        tokens += ids
        lengths.append(len(ids))
        time.sleep(seconds / len(docs))
        if progress is not None:
            progress[0] = i + 1
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    torch.save({"tokens": torch.tensor(tokens, dtype=torch.int32),
                "lengths": torch.tensor(lengths, dtype=torch.int32)}, temporary)
    os.replace(temporary, path)


def read_cache(paths):
    """(documents, tokens, CRC-32 of the tokens) of the cache files, read in order."""
    import torch

    parts = [torch.load(p, weights_only=True) for p in paths]
    tokens = torch.cat([p["tokens"] for p in parts])
    documents = sum(len(p["lengths"]) for p in parts)
    return documents, len(tokens), f"{zlib.crc32(tokens.numpy().tobytes()):08x}"


def prepare_only(args):
    """(b)'s first half: the whole cache, in one process, before any job starts."""
    import torch  # noqa: F401  (imported before the clock starts: its import is not the work)

    path = Path(args.cache) / "tokens.pt"
    tick = time.monotonic()
    tokenize_into(path, documents(args.documents), args.prepare_seconds)
    say(f"prepared {args.documents} documents into {path} in "
          f"{time.monotonic() - tick:.1f} s, without a process group", flush=True)


# --- one case, in every worker of a torchrun job ------------------------------------------------

def in_words(error):
    """An exception's first line, without gloo's [source file:line] prefix."""
    return f"{type(error).__name__}: " + re.sub(r"^\[[^\]]*\]\s*", "", str(error).splitlines()[0])


def the_failure(args, rank, job, cache):
    """(a): rank 0 prepares while the others sit in the job's barrier."""
    import torch.distributed as dist

    if rank == 0:
        progress, tick = [0], time.monotonic()

        def stopped(signum, frame):  # torchrun stops the other workers when one fails
            say(f"rank 0: still tokenizing when torchrun stopped it (SIGTERM) "
                  f"{time.monotonic() - tick:.1f} s in, at document {progress[0]} of "
                  f"{args.documents}: the cache was never written", flush=True)
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, stopped)
        tokenize_into(cache / "tokens.pt", documents(args.documents), args.prepare_seconds,
                      progress)
    tick = time.monotonic()
    try:
        dist.barrier(group=job)  # the others wait here for rank 0, up to the job's timeout
    except RuntimeError as error:
        say(f"rank {rank}: waited {time.monotonic() - tick:.1f} s in dist.barrier(group=job) "
              f"(timeout {args.timeout:g} s), then {in_words(error)}", flush=True)
        sys.exit(1)
    say(f"rank {rank}: passed the barrier after {time.monotonic() - tick:.1f} s", flush=True)


def worker(args):
    import torch.distributed as dist

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=timedelta(seconds=START_TIMEOUT_S))
    job = dist.new_group(timeout=timedelta(seconds=args.timeout))  # the job's collectives
    cache = Path(args.cache)
    if args.case == "alone":
        the_failure(args, rank, job, cache)
        dist.destroy_process_group()
        return
    tick = time.monotonic()  # every rank is up: from here to the data read, on every rank
    prepared = waited = None
    if args.case == "prepared":  # (b): written before the job started
        paths = [cache / "tokens.pt"]
        if not paths[0].exists():
            say(f"rank {rank}: no cache at {paths[0]}: run --prepare-only first", flush=True)
            sys.exit(1)
    elif args.case == "main-first":  # (c)
        # Every rank makes the group (new_group is called by all), before rank 0 starts.
        phase = dist.new_group(timeout=timedelta(seconds=args.phase_timeout))
        paths = [cache / "tokens.pt"]
        if rank == 0:
            tokenize_into(paths[0], documents(args.documents), args.prepare_seconds)
            prepared = time.monotonic() - tick
        waiting = time.monotonic()
        dist.barrier(group=phase)  # the others wait here, up to the phase's longer timeout
        waited = time.monotonic() - waiting
        dist.destroy_process_group(phase)  # the rest of the job: the short timeout again
    else:  # (d) split: each rank its share, into its own file
        mine = share(args.documents, rank, world_size)
        docs = documents(args.documents)
        tokenize_into(cache / f"tokens-{rank}-of-{world_size}.pt", [docs[i] for i in mine],
                      args.prepare_seconds * len(mine) / args.documents)
        prepared = time.monotonic() - tick
        waiting = time.monotonic()
        dist.barrier(group=job)  # all shares written: each rank waits only for the slowest
        waited = time.monotonic() - waiting
        paths = [cache / f"tokens-{r}-of-{world_size}.pt" for r in range(world_size)]
    count, tokens, checksum = read_cache(paths)
    ready = time.monotonic() - tick
    line = f"rank {rank}: "
    if prepared is not None:
        line += (f"tokenized {len(mine) if args.case == 'split' else count} documents in "
                 f"{prepared:.1f} s, ")
    if waited is not None:
        group = "the phase's" if args.case == "main-first" else "the job's"
        line += f"waited {waited:.1f} s in {group} barrier, "
    line += (f"read {len(paths)} file(s): {count} documents, {tokens} tokens, "
             f"checksum {checksum}")
    lines = [None] * world_size if rank == 0 else None
    dist.gather_object((line, checksum, waited or 0.0, ready), lines, dst=0, group=job)
    if rank == 0:  # printed once, in rank order
        say("\n".join(entry[0] for entry in lines), flush=True)
        sums = {entry[1] for entry in lines}
        say(summary_line(case=args.case, world_size=world_size, documents=count,
                           same_tokens_on_all_ranks=len(sums) == 1, checksum=checksum,
                           longest_wait_s=max(entry[2] for entry in lines),
                           data_ready_s=max(entry[3] for entry in lines)), flush=True)
    dist.destroy_process_group()


# --- the drill: each case a job of its own, timed from here --------------------------------------

def case_args(args, case, cache):
    return ["--case", case, "--cache", str(cache), "--documents", str(args.documents),
            "--prepare-seconds", f"{args.prepare_seconds:g}", "--timeout", f"{args.timeout:g}",
            "--phase-timeout", f"{args.phase_timeout:g}"]


def rank_order(line):
    found = re.match(r"rank (\d+):", line)
    return int(found.group(1)) if found else sys.maxsize  # other lines (the summary) last


def run_case(args, case):
    """Run one case's job: (its row of the table, whether it went as the drill says)."""
    cache = Path(args.out) / case
    shutil.rmtree(cache, ignore_errors=True)
    print(f"\n== {CASES[case]}", flush=True)
    row = {"case": CASES[case], "data on all ranks s": "-", "longest wait s": "-",
           "wall s": "-", "result": ""}
    before = worked = ""
    if case == "prepared":
        tick = time.monotonic()
        command = [sys.executable, SCRIPT, "--prepare-only", *case_args(args, case, cache)[2:]]
        print("$ python " + " ".join(command[1:]), flush=True)
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                              timeout=args.launch_timeout)
        print(done.stdout + done.stderr, end="", flush=True)
        took = re.search(r" in ([\d.]+) s, without a process group", done.stdout)
        if done.returncode != 0 or not took:
            return dict(row, result="the --prepare-only pass failed"), False
        before, worked = f"{time.monotonic() - tick:.1f} + ", f"{took.group(1)} + "
    tick = time.monotonic()
    result = launch(SCRIPT, case_args(args, case, cache), nproc=args.nproc,
                    timeout=args.launch_timeout, cwd=str(ROOT), capture=True, backend="gloo")
    row["wall s"] = f"{before}{time.monotonic() - tick:.1f}"
    lines = result.stdout.splitlines()
    print("\n".join(sorted(lines, key=rank_order)), flush=True)
    for line in result.stderr.splitlines():  # the launcher's one line about a failed job
        if line.startswith("error:"):
            print(line, flush=True)
    if case == "alone":
        waits = {rank_order(line): float(found.group(1)) for line in lines
                 if (found := re.match(r"rank \d+: waited ([\d.]+) s .* then .*\btimed? ?out\b",
                                       line, re.I))}
        ok = result.returncode != 0 and sorted(waits) == list(range(1, args.nproc))
        if waits:
            row["longest wait s"] = f"{max(waits.values()):.1f}"
        return dict(row, result=f"failed: rank(s) {', '.join(map(str, sorted(waits)))} timed "
                    "out in the barrier" if ok else "did not fail as the drill expects"), ok
    try:
        fields = parse_summary(result.stdout, once=True)
    except ValueError:
        return dict(row, result=f"failed (exit status {result.returncode})"), False
    ok = result.returncode == 0 and fields["same_tokens_on_all_ranks"] == "True"
    row["data on all ranks s"] = f"{worked}{float(fields['data_ready_s']):.1f}"
    if case != "prepared":
        row["longest wait s"] = f"{float(fields['longest_wait_s']):.1f}"
    row["result"] = (f"ok: {fields['documents']} documents, checksum {fields['checksum']} on "
                     f"all {args.nproc} ranks" if ok else "the ranks read different tokens")
    return row, ok


def drill(args):
    print(f"{args.nproc} ranks; the job's group times out after {args.timeout:g} s; tokenizing "
          f"{args.documents} documents takes {args.prepare_seconds:g} s in one process",
          flush=True)
    rows, failures = [], []
    for case, name in CASES.items():
        row, ok = run_case(args, case)
        rows.append(row)
        if not ok:
            failures.append(name)
    print(f"\n{format_table(rows)}\n"
          "data on all ranks: from the moment every rank is up to the moment every rank has "
          "read the data ((b): the --prepare-only pass + the job); longest wait: the most a "
          "rank spent in the barrier after the preparation; wall: each launch, start-up "
          "included", flush=True)
    if failures:
        sys.exit(f"error: not as the drill expects: {'; '.join(failures)} (output above)")


def main():
    args = parse_args()
    if args.prepare_only:
        prepare_only(args)
    elif args.case:
        worker(args)
    else:
        drill(args)


if __name__ == "__main__":
    try:
        main()
    except LaunchError as error:
        sys.exit(f"error: {error}")
