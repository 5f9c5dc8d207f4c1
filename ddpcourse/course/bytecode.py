"""Write, at setup, the bytecode of the modules the lessons import, so that the first run is
as fast as the tenth.

Setup installs with `pip --no-compile`: byte-compiling all of torch takes about a minute
here, for thousands of modules no lesson imports. Without bytecode, every process of a run
compiles what it imports (torch, timm and torchvision: about 10 s instead of 4.4 s), and
where PYTHONDONTWRITEBYTECODE=1 is set, as in some containers, Python reads bytecode but
never writes it, so every run pays again. This imports the lessons' modules once in a child
that may write bytecode, then compiles with py_compile, which writes whatever that variable
says, any module whose bytecode is still missing.

    python -m ddpcourse.course.bytecode        # `make setup` runs it
"""

from __future__ import annotations

import importlib.util
import json
import os
import py_compile
import subprocess
import sys
import time

# What the lessons' scripts, experiments and torchrun itself import (grep the scripts'
# imports to extend it); importing them pulls in everything underneath.
MODULES = (
    "torch", "torch.distributed", "torch.distributed.run", "torch.nn.parallel",
    "torch.distributed.fsdp", "torch.distributed.tensor", "torch.distributed.tensor.parallel",
    "torch.distributed.device_mesh", "torch.distributed.pipelining",
    "torch.distributed.checkpoint", "torch.distributed.checkpoint.state_dict",
    "torch.distributed.optim", "torch.distributed.algorithms.join",
    "torch.distributed.algorithms.ddp_comm_hooks", "torch.distributed.nn",
    "torch.distributed.elastic.multiprocessing.errors", "torch.utils.checkpoint",
    "torch.profiler", "torch.multiprocessing", "timm", "timm.models", "torchvision",
    "numpy", "PIL", "matplotlib.pyplot", "ddpcourse.cli", "ddpcourse.data",
    "ddpcourse.models", "ddpcourse.report", "ddpcourse.runtime", "ddpcourse.sharding",
    "ddpcourse.collectives", "ddpcourse.topology", "ddpcourse.cluster.launch",
)

CHILD = """
import importlib, json, sys
sys.dont_write_bytecode = False  # the imports below write their bytecode as they compile
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except ImportError:  # an optional module this machine lacks: nothing to compile
        pass
print(json.dumps(sorted({getattr(m, "__file__", None) or "" for m in list(sys.modules.values())})))
"""


def imported_sources(modules=MODULES) -> list[str]:
    """The .py files of every module that importing `modules` loads, imported once in a
    child that writes their bytecode (whatever PYTHONDONTWRITEBYTECODE says)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["MPLBACKEND"] = "Agg"
    result = subprocess.run([sys.executable, "-c", CHILD, json.dumps(modules)], env=env,
                            capture_output=True, text=True, check=True)
    return [f for f in json.loads(result.stdout.splitlines()[-1])
            if f.endswith(".py") and os.path.isabs(f) and os.path.isfile(f)]


def missing_bytecode(sources: list[str]) -> list[str]:
    """Those of `sources` with no bytecode file, or one older than the source."""
    missing = []
    for source in sources:
        cached = importlib.util.cache_from_source(source)
        if not os.path.exists(cached) or os.path.getmtime(cached) < os.path.getmtime(source):
            missing.append(source)
    return missing


def write_bytecode(modules=MODULES) -> tuple[list[str], list[str], list[str]]:
    """(the sources importing `modules` loads, those py_compile had to compile, those still
    without bytecode: a folder this user may not write, say)."""
    sources = imported_sources(modules)
    missing = missing_bytecode(sources)
    for source in missing:  # written even under PYTHONDONTWRITEBYTECODE=1
        py_compile.compile(source, doraise=False, quiet=2)
    return sources, missing, missing_bytecode(sources)


def main() -> int:
    started = time.perf_counter()
    sources, compiled, still = write_bytecode()
    print(f"bytecode: {len(sources) - len(still)} of the {len(sources)} modules the lessons "
          f"import are compiled ({len(compiled)} by py_compile) in "
          f"{time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
