"""The command line of scripts that torchrun starts W times. Free of torch, so a script can
parse its arguments (and set environment variables from them) before importing torch."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from typing import NoReturn

# How long a rank other than 0 waits before it reports a mistake itself (see below).
WAIT_FOR_RANK_0_S = 30.0


def exit_after_rank_0(message: str, status: int, rank: int | None = None) -> NoReturn:
    """Print `message` (one line) and exit with `status`, once for the whole job.

    A mistake every process makes (a bad option, a missing dataset) is rank 0's to report.
    The other ranks wait instead of exiting at once: torchrun stops every worker as soon as
    one fails, so a rank that failed first could cut rank 0 off before it spoke. A rank still
    running after the wait met the problem alone (a file missing on its node only), so it
    reports it itself, naming its rank. `rank` defaults to torchrun's RANK variable.
    """
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    if rank != 0:
        time.sleep(WAIT_FOR_RANK_0_S)  # torchrun normally ends this process during the wait
        message = message.replace("error:", f"error (rank {rank}):", 1)
    print(message, file=sys.stderr, flush=True)
    raise SystemExit(status)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, for a script that every process of a job runs: one line, from
    rank 0, for a mistake in the arguments, instead of W usage texts."""

    def error(self, message: str) -> NoReturn:
        exit_after_rank_0(f"{self.prog}: error: {message} (--help lists the options)", 2)


def split_batch(requested: int | None, default: int, world_size: int) -> tuple[int, int, str]:
    """(global batch, per-process batch, note): a global batch shared out over world_size.

    `requested` is what --batch-size gave, None when it was left out. Left out, `default`
    is rounded down to a multiple of world_size (256 // 3 = 85 each, 255 in all; at least
    one sample each), so a run with the default arguments starts for any world size, and
    `note` says what was rounded, ready to end a line: " (256 does not split ...)" or "".
    A batch the student chose is taken as asked or refused: ValueError with a one-line
    message, since training on another batch than the one asked for would mislead.
    """
    if requested is not None:
        if requested < world_size or requested % world_size:
            raise ValueError(f"the global batch {requested} does not split evenly over "
                             f"{world_size} processes; use a multiple of {world_size}")
        return requested, requested // world_size, ""
    per_process = max(1, default // world_size)
    chosen = per_process * world_size
    if chosen == default:
        return chosen, per_process, ""
    if chosen < default:
        why = f"{default} does not split over {world_size} processes; rounded down"
    else:
        why = f"{default} is under one sample per process for {world_size}; rounded up to 1 each"
    return chosen, per_process, f" ({why})"


# Message sizes on the command line of the benchmarks: 4096, 64K, 256M (powers of 1024).
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def byte_count(text: str) -> int:
    """'64K' -> 65536, for argparse's type=; a one-line error for anything else."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)B?\s*", str(text).upper())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; use e.g. 4096, 64K, 256M")
    return int(m.group(1)) * UNITS[m.group(2)]


def human(n: int) -> str:
    """65536 -> '64 KB' (the largest unit that divides it)."""
    for unit in ("G", "M", "K"):
        if n >= UNITS[unit] and n % UNITS[unit] == 0:
            return f"{n // UNITS[unit]} {unit}B"
    return f"{n} B"
