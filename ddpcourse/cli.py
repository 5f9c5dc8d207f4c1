"""The command line of scripts that torchrun starts W times. Free of torch, so a script can
parse its arguments (and set environment variables from them) before importing torch."""

from __future__ import annotations

import argparse
import os
from typing import NoReturn


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, for a script that every process of a job runs.

    A mistake in the arguments is the same in every process: rank 0 reports it in one line,
    the others exit with the same status (2) without repeating it.
    """

    def error(self, message: str) -> NoReturn:
        if os.environ.get("RANK", "0") != "0":
            self.exit(2)
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")
