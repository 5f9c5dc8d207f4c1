"""The command line of scripts that torchrun starts W times. Free of torch, so a script can
parse its arguments (and set environment variables from them) before importing torch."""

from __future__ import annotations

import argparse
import os
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
