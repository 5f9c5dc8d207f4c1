"""What an experiment reuses from a step (or from another experiment), imported by its path.

Experiments measure the steps and never copy them (CONTRIBUTING.md): they take a script's own
names, lesson 3's learning-rate rule or a step's CPUSyncBatchNorm, from the script itself:

    BASE_BATCH, BASE_LR = import_script("lesson3_ddp", "BASE_BATCH", "BASE_LR")

The script runs as a module named after its file (its `if __name__ == "__main__":` part does
not), once per process; scripts/ stays off sys.path, so no other file there becomes importable.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def import_script(script: str, *names: str):
    """scripts/SCRIPT.py ("lesson3_ddp", "experiments/lesson8_scale") as a module; with names,
    the module's objects of those names instead (a tuple when there are several)."""
    path = SCRIPTS / f"{script}.py"
    module = sys.modules.get(path.stem)
    if getattr(module, "__file__", None) != str(path):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or not path.is_file():
            raise ImportError(f"no script {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module  # before it runs: its dataclasses look themselves up
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[path.stem]
            raise
    if not names:
        return module
    found = tuple(getattr(module, name) for name in names)
    return found[0] if len(found) == 1 else found
