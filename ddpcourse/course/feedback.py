"""A grading run as a student reads it on the platforms that collect submissions.

A grading run (`run_grading`, `make grade`) leaves two files in its output folder:
results.json (per test: exercise, points, outcome) and junit.xml (what each failed test said).
Gradescope's results (`gradescope.py`) and GitHub Classroom's steps (`classroom.py`) are both
written from `graded_tests`, so a student reads the same points and the same reasons on
either, and the same as `make grade` shows.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from ddpcourse.course.grading import junit_address

# Characters of a failure shown for one test: the grading check that failed and the error it
# raised fit; a traceback through torch is cut in its middle.
OUTPUT_LIMIT = 2000
HEAD = 600  # of which the start: where the check is

# pytest's hint names an option of its own command line, which the student did not type; and
# its error lines left empty.
NOISE = re.compile(r"^(E?\s*Use -v to get more diff|E\s*)\n", re.M)

# A test whose grading process was killed has no details: its outcome is all there is to say.
WITHOUT_DETAILS = {
    "crashed": "This test ended the grading process (os._exit, a crash, or all the memory): "
               "it scores zero and the other tests were graded.",
    "not run": "Not graded: the grading run stopped before this test (its time limit).",
}


@dataclass
class GradedTest:
    nodeid: str      # tests/grading/test_lesson1.py::test_global_rank_every_rank_once
    exercise: str    # l1_global_rank
    points: float    # what passing it is worth
    outcome: str     # passed, failed, crashed, skipped, not run
    message: str     # why it did not pass ('' when it did)
    hidden_cases: bool = False  # it drew cases the release does not show (hidden.py)

    @property
    def name(self) -> str:
        """The test without its file: test_global_rank_every_rank_once[case]."""
        return self.nodeid.split("::", 1)[-1]

    @property
    def earned(self) -> float:
        return self.points if self.outcome == "passed" else 0.0


def graded_tests(out_dir: Path) -> list[GradedTest]:
    """Every test of the grading run in out_dir, in grading order ([] if none was graded)."""
    results = Path(out_dir) / "results.json"
    if not results.exists():
        return []
    said = failure_texts(Path(out_dir) / "junit.xml")
    graded = []
    for nodeid, test in json.loads(results.read_text()).get("tests", {}).items():
        outcome = test["outcome"]
        message = "" if outcome == "passed" else explain(outcome, said.get(junit_address(nodeid),
                                                                           ""))
        graded.append(GradedTest(nodeid, test["exercise"], float(test["points"]), outcome,
                                 message, bool(test.get("hidden_cases"))))
    return graded


def failure_texts(junit: Path) -> dict[tuple[str, str], str]:
    """(classname, name) -> what a test that did not pass said, from the JUnit file.

    The element's text is pytest's short traceback (the grading line, the student's line that
    raised, the error); the message attribute alone is what a killed run's test has.
    """
    try:
        cases = ET.parse(junit).getroot().iter("testcase")
    except (OSError, ET.ParseError):  # no JUnit file: the outcome alone explains the test
        return {}
    texts = {}
    for case in cases:
        for problem in case:
            if problem.tag in ("failure", "error", "skipped"):
                texts[(case.get("classname", ""), case.get("name", ""))] = (
                    problem.text or problem.get("message") or "").strip()
    return texts


def explain(outcome: str, text: str) -> str:
    """What a student reads about a test that did not pass."""
    if outcome in WITHOUT_DETAILS:
        return WITHOUT_DETAILS[outcome]
    text = trimmed(without_repeated_comparison(NOISE.sub("", text + "\n")).strip())
    if outcome == "skipped":
        return f"Skipped: {text}" if text else "Skipped."
    return text or f"{outcome.capitalize()}."


def without_repeated_comparison(text: str) -> str:
    """An assertion that says what went wrong, without pytest's comparison of the same values
    under it (the grading tests' messages name the values; the comparison repeats them)."""
    kept, skipping, explained = [], False, False
    for line in text.splitlines(keepends=True):
        if skipping and line.startswith("E "):
            continue
        skipping = explained and line.startswith("E   assert ")
        explained = line.startswith("E   AssertionError: ") or (explained and line.startswith("E "))
        if not skipping:
            kept.append(line)
    return "".join(kept)


def trimmed(text: str, limit: int = OUTPUT_LIMIT) -> str:
    """text, or its start and its end when longer than limit (the error is at the end)."""
    if len(text) <= limit:
        return text
    return text[:HEAD].rstrip() + "\n[...]\n" + text[-(limit - HEAD):].lstrip()
