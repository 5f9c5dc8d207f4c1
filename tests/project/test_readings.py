"""The readings' figures say where they come from.

A number with a unit that a page calls "measured" must come from a run the course has: the
paragraph that says so names a make target some lessons/lessonN/lesson.toml registers
(`make lesson7-amp`) or a script under scripts/ that exists (`scripts/experiments/...py`, or
its bare name, `lesson8_memory.py`). A figure the course did not measure is labelled
"published" (with its source) or "assumed" instead, and this test leaves it alone.

No torch and no jobs: the pages are read as text (fenced code blocks, which are program
output and commands, are left out of the paragraphs).
"""

import json
import re

import pytest
from util import ROOT

from ddpcourse.course.lessons import all_targets

PAGES = sorted((ROOT / "lessons").rglob("*.md"))
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

# "measured", but not "not measured" / "never measured" / "unmeasured" (a page saying a figure
# was NOT measured is not claiming a measurement).
MEASURED = re.compile(r"(?<!\bnot )(?<!\bnever )(?<![\w#-])measured\b", re.I)

# A number next to a unit: "5.1 s", "0.39 ms", "1,262 samples/s", "20.1 MiB", "0.94 GB/s", "4 %".
UNITS = (r"%|ms|us|µs|ns|s|sec|seconds?|min|minutes?|h|hours?|days?"
         r"|[KMGT]i?B(?:/s)?|[kKMGT]?bit/s|B|bytes?|samples/s|steps/s|FLOP/s|TFLOP/s|[KMG]?FLOPs?"
         r"|kB|W|GHz")
NUMBER_WITH_UNIT = re.compile(r"(?<![\w.])\d(?:[\d,.]*\d)?\s?(?:" + UNITS + r")(?![\w/])")

MAKE = re.compile(r"\bmake\s+([a-z][\w-]*)")
MAKE_COMMAND = re.compile(r"`make ([a-z][\w-]*)")  # a command in code, not the English verb
SCRIPT = re.compile(r"\b(?:scripts/(?:experiments/)?)?(lesson\d+_\w+\.(?:py|sbatch))\b")
SCRIPTS = {p.name for p in (ROOT / "scripts").rglob("*") if p.suffix in (".py", ".sbatch")}
TARGETS = set(all_targets())


def paragraphs(markdown: str):
    """(first line number, text) of each block between blank lines, code blocks left out."""
    block, start, in_code = [], 0, False
    for n, line in enumerate([*markdown.splitlines(), ""], 1):
        if line.lstrip().startswith("```"):
            if block and not in_code:
                yield start, "\n".join(block)
            block, in_code = [], not in_code
            continue
        if in_code:
            continue
        if line.strip():
            if not block:
                start = n
            block.append(line)
        elif block:
            yield start, "\n".join(block)
            block = []


def sources():
    """(where, markdown) for every reading and every notebook's markdown cells."""
    for page in PAGES:
        yield str(page.relative_to(ROOT)), page.read_text()
    for notebook in NOTEBOOKS:
        cells = json.loads(notebook.read_text())["cells"]
        for i, cell in enumerate(cells):
            if cell["cell_type"] == "markdown":
                yield f"{notebook.relative_to(ROOT)} cell {i}", "".join(cell["source"])


def names_a_course_run(text: str) -> bool:
    return (any(target in TARGETS for target in MAKE.findall(text))
            or any(script in SCRIPTS for script in SCRIPT.findall(text)))


def unsourced_measurements(where: str, markdown: str) -> list[str]:
    found = []
    for line, text in paragraphs(markdown):
        if MEASURED.search(text) and NUMBER_WITH_UNIT.search(text) and not names_a_course_run(text):
            found.append(f"{where}:{line}: {' '.join(text.split())[:160]}")
    return found


def test_every_measured_figure_names_the_run_that_measured_it():
    found = [problem for where, markdown in sources()
             for problem in unsourced_measurements(where, markdown)]
    assert not found, ("a paragraph calls a figure measured without naming a course run "
                       "(`make TARGET` from a lesson.toml, or a script under scripts/); name "
                       "the run, or label the figure published (with its source) or "
                       "assumed:\n" + "\n".join(found))


@pytest.mark.parametrize("text, bad", [
    # the kinds of sentence the check must refuse ...
    ("NVLink carries 175 MB in 0.39 ms, as measured in lesson 5.", True),
    ("Measured here: 5.1 s instead of 1.4 s, same losses.", True),
    ("We measured 20.1 MiB with `make lesson7-nonexistent`.", True),
    ("We measured 20.1 MiB with `scripts/experiments/lesson7_missing.py`.", True),
    # ... and those it must let through
    ("Measured by `make lesson7-amp`: 20.1 MiB against 39.1 MiB.", False),
    ("`scripts/experiments/lesson8_memory.py` measured 1.495 MB per rank.", False),
    ("`lesson7_amp_bench.py` measured 20.1 MiB.", False),
    ("NVLink 4 moves 450 GB/s each way (published, NVIDIA).", False),
    ("On GPUs more of it can hide; not measured here, 254-403 ms on the CPU.", False),
    ("The gain was measured, but no figure is given.", False),
    ("```\nmeasured 5 ms\n```", False),
])
def test_the_check_refuses_an_unsourced_measurement(text, bad):
    assert bool(unsourced_measurements("planted", text)) is bad


def test_the_pages_name_only_make_targets_that_exist():
    """Lessons 5-9's pages, where a make target stands for the run that made a figure."""
    makefile = (ROOT / "Makefile").read_text()
    own = set(re.findall(r"^([a-z][\w-]*):", makefile, re.M))
    wrong = sorted({f"{where}: make {target}" for where, markdown in sources()
                    if where.startswith(("lessons/lesson5", "lessons/lesson6", "lessons/lesson7",
                                         "lessons/lesson8", "lessons/lesson9",
                                         "lessons/appendix", "notebooks/lesson5",
                                         "notebooks/lesson6", "notebooks/lesson7",
                                         "notebooks/lesson8", "notebooks/lesson9"))
                    for target in MAKE_COMMAND.findall(markdown)
                    if target not in TARGETS | own | {"lessonN"}})
    assert not wrong, "pages name make targets that do not exist:\n" + "\n".join(wrong)


@pytest.mark.parametrize("reading", sorted((ROOT / "lessons").glob("lesson*/README.md")),
                         ids=lambda p: p.parent.name)
def test_a_lesson_s_reading_is_at_most_400_lines(reading):
    # The course's contract: a reading a student gets through in one sitting; side pages
    # (at_scale.md, preemption.md, the appendix) take the rest.
    assert len(reading.read_text().splitlines()) <= 400


@pytest.mark.parametrize("folder", sorted((ROOT / "lessons").glob("lesson*/")),
                         ids=lambda p: p.name)
def test_a_lesson_s_core_path_is_at_most_2000_words(folder):
    """The hour a newcomer has: what is not under an "Under the hood" heading or on an extra
    page, counted the strict way (`torch.distributed` is two words)."""
    from ddpcourse.course.readings import CORE_LIMIT, lesson_words

    core, _, _ = lesson_words(folder)
    assert core <= CORE_LIMIT, (f"{folder.name}'s core path is {core} words; move "
                                f"{core - CORE_LIMIT} or more under an \"Under the hood\" heading")


def test_no_page_shows_a_path_of_the_machine_it_was_written_on():
    """Output pasted into a page names the course's files relative to it (`.venv/bin/torchrun`,
    `runs/x.pt`), never where the author's checkout happened to be."""
    absolute = re.compile(r"(?<![\w.~])/(?:work|home|root|tmp|Users)/\S*(?:\.venv|scripts|runs)/")
    shown = [f"{where}: {line.strip()[:120]}" for where, markdown in sources()
             for line in markdown.splitlines() if absolute.search(line)]
    assert not shown, "pages show a build machine's paths:\n" + "\n".join(shown)
