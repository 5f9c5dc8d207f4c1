"""The lessons, as each registers itself in lessons/lessonN/lesson.toml.

A lesson's lesson.toml names its make targets and what they run, the function that draws its
figures, and its graded exercises (one pytest marker each). The Makefile, the figure writer,
pytest's marker list and the course's own tests all read it from here, so adding a lesson
touches only that lesson's files (CONTRIBUTING.md has the checklist).

    python -m ddpcourse.course.lessons targets [--bench]   the make targets, for the Makefile
    python -m ddpcourse.course.lessons help                one line per target, for `make help`
    python -m ddpcourse.course.lessons setup-of TARGET     the make target that installs what
                                                           TARGET needs (setup, setup-lesson9)
    python -m ddpcourse.course.lessons run TARGET --nproc 2 --nnodes 1 --port '' --timeout 600
                                           --backend '' --args '--epochs 1'
    python -m ddpcourse.course.lessons figures [--lesson N] [--out DIR]   `make figures`

A step is "torchrun SCRIPT ARGS..." (started by ddpcourse.cluster.launch on NPROC x NNODES) or
"python SCRIPT ARGS..." (one process); "{world}" in a step becomes NPROC x NNODES. Like
ddpcourse.cluster.launch, this module uses only the standard library: it runs before .venv exists.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shlex
import signal
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LESSONS = ROOT / "lessons"
MARKER = re.compile(r"^l(\d+)_[a-z0-9_]+$")


@dataclass
class Step:
    kind: str            # "torchrun" or "python"
    command: list[str]   # script and its arguments, "{world}" not yet filled in
    drill: str = ""      # a drill step: exit status 1 is the expected failure, and this says so


@dataclass
class Target:
    name: str
    help: str
    steps: list[Step]
    bench: bool = False  # part of `make bench`
    args: bool = True    # ARGS reaches every step
    min_world: int = 1   # fewer processes (NPROC x NNODES) cannot show what it is about
    setup: str = "setup"  # the make target that installs what it needs (its lesson's `setup`)


@dataclass
class Lesson:
    number: int
    folder: Path
    title: str
    figures: str = ""    # "module:function" returning {file name: matplotlib Figure}
    targets: dict[str, Target] = field(default_factory=dict)
    exercises: dict[str, str] = field(default_factory=dict)  # marker -> what it grades
    readings: dict[str, str] = field(default_factory=dict)  # marker -> "PAGE.md#section"


class RegistrationError(Exception):
    pass


def parse_step(entry, where: str) -> Step:
    if isinstance(entry, str):
        entry = {"run": entry}
    words = shlex.split(entry.get("run", ""))
    if len(words) < 2 or words[0] not in ("torchrun", "python") or words[1:2] == ["-m"] and (
            words[0] == "torchrun" or len(words) < 3):
        raise RegistrationError(f"{where}: a step is 'torchrun SCRIPT ...', 'python SCRIPT "
                                f"...' or 'python -m MODULE ...', not {entry.get('run')!r}")
    return Step(words[0], words[1:], entry.get("drill", ""))


def load_lesson(folder: Path) -> Lesson:
    path = folder / "lesson.toml"
    match = re.fullmatch(r"lesson(\d+)", folder.name)
    if not match:
        raise RegistrationError(f"{folder}: lesson folders are named lessonN")
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise RegistrationError(f"{path}: {error}") from None
    number = int(match.group(1))
    lesson = Lesson(number, folder, data.get("title", ""), data.get("figures", ""),
                    exercises=dict(data.get("exercises", {})),
                    readings=dict(data.get("readings", {})))
    for name, spec in data.get("targets", {}).items():
        steps = [parse_step(s, f"{path} [targets.{name}]") for s in spec.get("steps", [])]
        lesson.targets[name] = Target(name, spec.get("help", ""), steps,
                                      bench=spec.get("bench", False), args=spec.get("args", True),
                                      min_world=spec.get("min_world", 1),
                                      setup=data.get("setup", "setup"))
        if not re.fullmatch(r"setup(-[a-z0-9]+)?", lesson.targets[name].setup):
            raise RegistrationError(f"{path}: setup must name a make target setup[-NAME]")
    for marker in lesson.exercises:
        m = MARKER.match(marker)
        if not m or int(m.group(1)) != number:
            raise RegistrationError(f"{path}: exercise marker {marker!r} must be "
                                    f"l{number}_<name> (lower case)")
    unknown = sorted(set(lesson.readings) - set(lesson.exercises))
    if unknown:
        raise RegistrationError(f"{path}: [readings] names {', '.join(unknown)}, not in "
                                "[exercises]")
    return lesson


def all_lessons() -> list[Lesson]:
    """Every lessons/lessonN folder with a lesson.toml, in lesson order."""
    folders = [p for p in LESSONS.glob("lesson*") if (p / "lesson.toml").exists()]
    lessons = [load_lesson(p) for p in folders]
    return sorted(lessons, key=lambda lesson: lesson.number)


def all_targets() -> dict[str, Target]:
    targets: dict[str, Target] = {}
    for lesson in all_lessons():
        for name, target in lesson.targets.items():
            if name in targets:
                raise RegistrationError(f"make target {name!r} is registered twice")
            targets[name] = target
    return targets


def exercise_markers() -> dict[str, str]:
    """marker -> 'lesson N, what it grades', for pytest's marker list."""
    return {marker: f"lesson {lesson.number}, {text}"
            for lesson in all_lessons() for marker, text in lesson.exercises.items()}


# --- the figures -----------------------------------------------------------------------------

def figure_functions() -> dict[int, Callable[[], dict]]:
    """lesson number -> the function its lesson.toml names to draw its figures."""
    found = {}
    for lesson in all_lessons():
        if lesson.figures:
            module, _, name = lesson.figures.partition(":")
            found[lesson.number] = getattr(importlib.import_module(module), name)
    return found


def write_figures(lessons: list[int] | None = None, out_root: Path | None = None) -> list[Path]:
    """Draw the figures of `lessons` (all by default) into lessons/lessonN/figures (or
    OUT_ROOT/lessonN/figures); returns the files written."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    from ddpcourse.figures import save_or_return  # matplotlib's, in .venv

    functions = figure_functions()
    written = []
    for lesson in lessons or sorted(functions):
        folder = (out_root or LESSONS) / f"lesson{lesson}" / "figures"
        for name, fig in functions[lesson]().items():
            written.append(Path(save_or_return(fig, folder / name)))
    return written


# --- running a target ------------------------------------------------------------------------

def shown(path: str) -> str:
    """A path as a student would type it from the course folder: relative inside it, whole
    outside it (an interpreter elsewhere is not ../../../opt/...)."""
    relative = os.path.relpath(path)
    return path if relative == ".." or relative.startswith("../") else relative


def run_python(command: list[str], timeout: float, backend: str) -> int:
    env = dict(os.environ)
    prefix = ""
    if backend == "gloo":  # the CPU even on a GPU machine, as the torchrun steps do
        env["CUDA_VISIBLE_DEVICES"] = ""
        prefix = "CUDA_VISIBLE_DEVICES= "
    print("$ " + prefix + shlex.join([shown(sys.executable), *command]), flush=True)
    child = subprocess.Popen([sys.executable, *command], env=env)
    try:
        return child.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"error: {command[0]} did not finish within {timeout:g} s and was stopped",
              file=sys.stderr)
        stop(child, signal.SIGTERM)
        return 124
    except KeyboardInterrupt:  # the child got the Ctrl-C too: let it clean up
        stop(child, None)
        return 130


def stop(child: subprocess.Popen, sig, grace: float = 15.0) -> None:
    """Give a step time to clean up after itself (a namespace, its workers), then kill it."""
    if sig is not None:
        child.send_signal(sig)
    try:
        child.wait(timeout=grace)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        child.kill()
        child.wait()


def run_target(target: Target, nproc: str, nnodes: str, port: str, timeout: str,
               backend: str, extra: list[str]) -> int:
    from ddpcourse.cluster import launch

    opts = ["--nproc", nproc, "--nnodes", nnodes, "--port", port, "--timeout", timeout,
            "--backend", backend]
    world = int(nproc) * int(nnodes)  # checked by `launch --check` before make got here
    if world < target.min_world:
        print(f"error: make {target.name} needs NPROC x NNODES of at least {target.min_world} "
              f"(here {world}): {target.help}", file=sys.stderr, flush=True)
        return 2
    for step in target.steps:
        command = [word.replace("{world}", str(world)) for word in step.command]
        command += extra if target.args else []
        if step.kind == "torchrun":
            rc = launch.main([*opts, *command])
        else:
            rc = run_python(command, float(timeout), backend)
        if rc == 1 and step.drill:
            print(step.drill, flush=True)
        elif rc != 0:
            return rc
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The lessons' make targets.")
    sub = parser.add_subparsers(dest="command", required=True)
    targets = sub.add_parser("targets", help="the target names, for the Makefile")
    targets.add_argument("--bench", action="store_true", help="only the benchmarks")
    sub.add_parser("help", help="one line per target")
    sub.add_parser("setup-of", help="the make target that installs what a target needs"
                   ).add_argument("target")
    figures = sub.add_parser("figures", help="draw every lesson's figures (make figures)")
    figures.add_argument("--lesson", type=int, action="append")
    figures.add_argument("--out", type=Path, default=None, help="a folder instead of lessons/")
    run = sub.add_parser("run", help="run one target's steps")
    run.add_argument("target")
    for name, default in (("nproc", "2"), ("nnodes", "1"), ("port", ""), ("timeout", "600"),
                          ("backend", ""), ("args", "")):
        run.add_argument(f"--{name}", default=default)
    args = parser.parse_args(argv)
    try:
        found = all_targets()
    except RegistrationError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.command == "targets":
        print(" ".join(name for name, t in found.items() if t.bench or not args.bench))
    elif args.command == "setup-of":
        print(found[args.target].setup if args.target in found else "setup")
    elif args.command == "help":
        for name, target in found.items():
            print(f"{name:<19} {target.help}")  # a space even after the longest names
    elif args.command == "figures":
        for path in write_figures(args.lesson, args.out):
            print(f"wrote {path}")
    else:
        if args.target not in found:
            print(f"error: no lesson registers a target {args.target!r}", file=sys.stderr)
            return 2
        try:
            extra = shlex.split(args.args)
        except ValueError as error:
            print(f"error: ARGS={args.args!r}: {error}", file=sys.stderr)
            return 2
        return run_target(found[args.target], args.nproc, args.nnodes, args.port,
                          args.timeout, args.backend, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
