"""Scripts teach by their diffs: every `diff scripts/A.py scripts/B.py` the course promises (in a
script, a reading or a notebook) is small enough to read as one lesson's change, and the step
scripts use torch's documented API only; experiments, the helper package and the grader
(tests/grading) use a private torch name only where the allow-list below says why (and the
source says it too, on the line or just above it).
"""

import ast
import difflib
import re

import pytest
from util import ROOT, promised_diffs

MAX_CHANGED_LINES = 100
COURSE_CODE = sorted([*(ROOT / "scripts").rglob("*.py"), *(ROOT / "ddpcourse").rglob("*.py"),
                      *(ROOT / "tests" / "grading").rglob("*.py")])
# The private torch names the course reaches, each for a reason; never from a step script.
ALLOWED_PRIVATE = {
    # inductor itself, behind a backend that counts the graphs torch.compile hands it: the
    # public API names inductor only by the string "inductor", which cannot count them
    ("scripts/experiments/lesson7_compile.py", "torch._inductor.compile_fx.compile_fx"),
    # context_parallel's rotate method in force, and its setter: only in the prototype's
    # private module
    ("scripts/experiments/lesson10_context_parallel.py",
     "torch.distributed.tensor.experimental._context_parallel._attention._cp_options"),
    ("scripts/experiments/lesson10_context_parallel.py",
     "torch.distributed.tensor.experimental._context_parallel._attention.set_rotate_method"),
    # the one way to see every c10d op a step runs
    ("scripts/experiments/lesson10_two_d.py", "torch.utils._python_dispatch.TorchDispatchMode"),
    # torch 2.14 has no public reader of a process's own flight recorder
    ("ddpcourse/traces.py", "torch._C._distributed_c10d._dump_fr_trace"),
    # how many buckets DDP rebuilt after its first step: no public API counts them
    ("scripts/experiments/lesson7_overlap_bench.py",
     "<expr>.reducer._get_zeros_like_grad_buckets"),
    # the sizes of DDP's buckets on the CPU: only its logging data reports them
    ("scripts/experiments/lesson8_memory.py", "model._get_ddp_logging_data"),
    # torch's FSDP2 memory estimator has no public home yet
    ("scripts/experiments/lesson8_scale.py",
     "torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker"),
    # The grader's workers. A retried group must be named alike on every rank: its name comes
    # from a per-process count of groups made, which only _world holds.
    ("ddpcourse/course/workers/common.py", "c10d._world"),
    # FlopCounterMode has no formula for the CPU's attention kernel
    ("ddpcourse/course/workers/lesson10_parallel.py",
     "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu"),
    # the C++ future's own wait, which a wait for a collective may call
    ("ddpcourse/course/workers/lesson7_checks.py", "torch._C"),
}
# Documented names that start with one underscore: not private.
UNDERSCORE_API = {"_replace", "_asdict", "_fields", "_make", "_exit"}


PROMISED = promised_diffs()


def changed_lines(old, new):
    """The lines a unified diff adds or removes, as Python's difflib aligns them: it may count
    a few more than GNU diff does for the same pair, so a step under this limit is under both."""
    before, after = ((ROOT / p).read_text().splitlines() for p in (old, new))
    return [line for line in difflib.unified_diff(before, after, lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("---", "+++"))]


def test_the_course_promises_its_diffs():
    steps = {new for _, new in PROMISED}
    # Lessons 2-8 each teach at least one step of the training by its diff; lesson 4 calls
    # the collectives on their own, outside that progression.
    progression = set(range(2, 9)) - {4}
    assert {int(re.match(r"scripts/lesson(\d+)_", new).group(1)) for new in steps} >= (
        progression), sorted(steps)


@pytest.mark.parametrize("pair", sorted(PROMISED), ids=lambda p: f"{p[0]}->{p[1]}")
def test_a_promised_diff_is_one_lesson_s_change(pair):
    old, new = pair
    where = PROMISED[pair]
    assert (ROOT / old).is_file() and (ROOT / new).is_file(), f"{where} promise a missing file"
    changed = changed_lines(old, new)
    assert len(changed) <= MAX_CHANGED_LINES, (
        f"`diff {old} {new}` (promised in {', '.join(sorted(set(where)))}) changes "
        f"{len(changed)} lines; a step is its predecessor plus one idea, at most "
        f"{MAX_CHANGED_LINES}")


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_names_defined(sources: list[str]) -> set[str]:
    """The course's own private names (functions, classes, variables, attributes it sets)."""
    names = set()
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name | ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.id if isinstance(node, ast.Name) else node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return {name for name in names if is_private(name)}


def private_torch_uses(source: str, own: set[str]) -> list[tuple[int, str]]:
    """(line, dotted name) of every private name the source takes from torch: imported
    (`from torch.nn.modules.batchnorm import _BatchNorm`), reached from a name bound to torch
    (`nn.modules.batchnorm._BatchNorm`, `torch._C`), or called on an object whose class the
    course did not write (`model._get_ddp_logging_data()`), unless `own` defines it."""
    tree = ast.parse(source)
    torch_names, other_imports, found = set(), set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                bound = alias.asname or parts[0]
                (torch_names if parts[0] == "torch" else other_imports).add(bound)
                if parts[0] == "torch" and any(map(is_private, parts)):
                    found.append((node.lineno, alias.name))
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            parts = node.module.split(".")
            for alias in node.names:
                (torch_names if parts[0] == "torch" else other_imports).add(
                    alias.asname or alias.name)
                if parts[0] == "torch" and any(map(is_private, [*parts, alias.name])):
                    found.append((node.lineno, f"{node.module}.{alias.name}"))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not is_private(node.attr):
            continue
        chain, root = [], node
        while isinstance(root, ast.Attribute):
            chain.insert(0, root.attr)
            root = root.value
        root = root.id if isinstance(root, ast.Name) else "<expr>"
        if root in torch_names or root not in {"self", "cls", *other_imports} and (
                node.attr not in own | UNDERSCORE_API):
            found.append((node.lineno, ".".join([root, *chain])))
    return sorted(set(found))


def test_private_torch_names_only_where_the_allow_list_says_why():
    sources = {str(path.relative_to(ROOT)): path.read_text() for path in COURSE_CODE}
    own = private_names_defined(list(sources.values()))
    found = {(path, name): line for path, source in sources.items()
             for line, name in private_torch_uses(source, own)}
    unexpected = [f"{path}:{line} {name}" for (path, name), line in sorted(found.items())
                  if (path, name) not in ALLOWED_PRIVATE]
    assert not unexpected, ("private torch names (a step must not use one; an experiment or "
                            "ddpcourse may, with one line saying why, listed in "
                            f"ALLOWED_PRIVATE): {'; '.join(unexpected)}")
    assert not ALLOWED_PRIVATE - set(found), f"no longer used: {ALLOWED_PRIVATE - set(found)}"
    steps = {str(path.relative_to(ROOT)) for path in (ROOT / "scripts").glob("*.py")}
    assert not {path for path, _ in ALLOWED_PRIVATE} & steps, "a step script must not"
    for (path, name), line in found.items():
        around = sources[path].splitlines()[max(0, line - 3):line]
        assert any("#" in text for text in around), f"{path}:{line} {name}: no line says why"


def test_the_private_torch_guard_catches_what_it_should():
    own = {"_owner_alive", "_storage_bytes"}
    planted = {
        "import torch.nn as nn\nkinds = (nn.modules.batchnorm._BatchNorm,)":
            [(2, "nn.modules.batchnorm._BatchNorm")],
        "from torch.nn.modules.batchnorm import _BatchNorm":
            [(1, "torch.nn.modules.batchnorm._BatchNorm")],
        "import torch\nbase = torch.nn.modules.batchnorm._BatchNorm":
            [(2, "torch.nn.modules.batchnorm._BatchNorm")],
        "from torch import nn\nclass Norm(nn.modules.batchnorm._BatchNorm): pass":
            [(2, "nn.modules.batchnorm._BatchNorm")],
        "import torch._C": [(1, "torch._C")],
        "def f(model):\n    return model.reducer._get_zeros_like_grad_buckets()":
            [(2, "model.reducer._get_zeros_like_grad_buckets")],
        # the course's own private names, and documented underscore names, are not torch's
        "import os\nfrom ddpcourse.cluster import hosts as H\nH._owner_alive(1)\nos._exit(0)": [],
        "def f(self, point):\n    self._x = point._replace(x=1)\n    return _storage_bytes([])":
            [],
    }
    for source, expected in planted.items():
        assert private_torch_uses(source, own) == expected, source


@pytest.mark.parametrize("lesson", range(5, 9))
def test_reading_shows_its_lesson_s_key_diff(lesson):
    reading = (ROOT / "lessons" / f"lesson{lesson}" / "README.md").read_text()
    assert "```diff\n" in reading, f"lesson {lesson}'s reading shows no diff block"
