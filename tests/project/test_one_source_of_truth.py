"""What students receive agrees with the grader and gives no answers away.

- Points: the grader (each grading test's `points(n)` marker) is the one source. Every table
  in a reading, a notebook or a `grading.md` that has a "points" column, and every
  "Lesson N (P points)" heading, must say what the grader awards.
- Answers: no solution function's body stands, line for line, in a file the student release
  ships (everything but solutions/ and the wrong submissions, as `make student-release`).
"""

import ast
import json
import re
import subprocess

import pytest
from util import PYTHON, ROOT, run

pytestmark = pytest.mark.skipif(not (ROOT / "solutions").is_dir(),
                                reason="this copy of the course has no solutions/")

EXERCISE = re.compile(r"`?(l\d+_[a-z0-9_]+)`?")


# --- points ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def grader_points(tmp_path_factory):
    """exercise -> the points the grading tests award, read from pytest's own collection."""
    results = tmp_path_factory.mktemp("collect") / "results.json"
    out = run([PYTHON, "-m", "pytest", "tests/grading", "--collect-only", "-q",
               "-p", "no:cacheprovider"], env={"COURSE_RESULTS": str(results)}, timeout=180)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    totals = {}
    for test in json.loads(results.read_text())["tests"].values():
        totals[test["exercise"]] = totals.get(test["exercise"], 0) + test["points"]
    assert len(totals) >= 20, totals
    return totals


def markdown_texts():
    """(where, markdown text) of every reading, grading table and notebook markdown cell."""
    for path in sorted((ROOT / "lessons").rglob("*.md")) + [ROOT / "README.md"]:
        yield str(path.relative_to(ROOT)), path.read_text()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        yield str(path.relative_to(ROOT)), "\n\n".join(
            "".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def stated_points(text):
    """[(exercise, points as written)] from every markdown table with a "points" column."""
    found = []
    for table in re.findall(r"(?:^\|.*\|[ \t]*\n)+", text, re.M):
        rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
                for line in table.strip().splitlines()]
        column = next((i for i, name in enumerate(rows[0]) if name.lower() == "points"), None)
        if column is None:
            continue
        for row in rows[2:]:
            named = EXERCISE.match(row[0])
            if named and column < len(row):
                found.append((named.group(1), row[column]))
    return found


def as_number(written):
    """'7', '**7**' or '2 + 4 + 1 = 7' -> 7.0"""
    return float(written.split("=")[-1].replace("*", "").strip())


def test_every_stated_point_count_is_the_graders(grader_points):
    wrong, seen = [], set()
    for where, text in markdown_texts():
        for exercise, written in stated_points(text):
            seen.add(where)
            if exercise not in grader_points:
                wrong.append(f"{where}: {exercise} is not an exercise the grader knows")
            elif as_number(written) != grader_points[exercise]:
                wrong.append(f"{where}: {exercise} says {written!r}, "
                             f"the grader gives {grader_points[exercise]:g}")
        for lesson, total in re.findall(r"^#+ Lesson (\d+) \((\d+) points\)", text, re.M):
            graded = sum(p for e, p in grader_points.items() if e.startswith(f"l{lesson}_"))
            if float(total) != graded:
                wrong.append(f"{where}: lesson {lesson} says {total} points, the grader "
                             f"gives {graded:g}")
    assert not wrong, "\n".join(wrong)
    # every lesson's grading table is among what was compared
    lessons = {e.split("_")[0][1:] for e in grader_points}
    assert {f"lessons/lesson{n}/grading.md" for n in lessons} <= seen


def test_the_points_check_sees_a_wrong_count():
    table = ("| exercise | points |\n| --- | --- |\n| `l4_fix_hang` | 2 + 3 = 5 |\n"
             "| `l4_all_gather`: `all_gather_p2p` | **6** |\n")
    assert [(e, as_number(p)) for e, p in stated_points(table)] == [
        ("l4_fix_hang", 5.0), ("l4_all_gather", 6.0)]


# --- no answers in what students receive ----------------------------------------------------

WINDOW = 4        # consecutive lines of a solution's body ...
MIN_CHARS = 100   # ... holding at least this much code (so `else:` / `return x` runs don't count)


def normalised(lines):
    """Lines without indentation, blank lines or comments: what survives a copy-and-reindent."""
    kept = []
    for line in lines:
        line = line.split("  #")[0].strip()
        if line and not line.startswith("#"):
            kept.append(line)
    return kept


def solution_bodies():
    """(lesson, function name, normalised body without its docstring) of every solution."""
    for path in sorted((ROOT / "solutions").glob("lesson*/exercises.py")):
        source = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(source))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                body = node.body[1:] if ast.get_docstring(node) is not None else node.body
                if body:
                    lines = source[body[0].lineno - 1:body[-1].end_lineno]
                    yield path.parent.name, node.name, normalised(lines)


def received_files():
    """What `make student-release` ships (tracked files), and new files it would once they
    are committed (not ignored): a leak is caught before it is committed."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in listed.splitlines():
        if name.startswith(("solutions/", "tests/project/wrong_submissions/")):
            continue
        path = ROOT / name
        if path.suffix in (".py", ".md", ".ipynb", ".sbatch", ".toml") and path.is_file():
            yield name, path


def windows(lines):
    for i in range(len(lines) - WINDOW + 1):
        chunk = tuple(lines[i:i + WINDOW])
        if sum(map(len, chunk)) >= MIN_CHARS:
            yield chunk


def copies_of_solutions(files):
    """[(file, lesson, function)] where a window of a solution's body stands in a file."""
    index = {}
    for lesson, function, body in solution_bodies():
        for chunk in windows(body):
            index.setdefault(chunk, (lesson, function))
    found = set()
    for name, text in files:
        if name.endswith(".ipynb"):
            text = "\n".join("".join(c["source"]) for c in json.loads(text)["cells"])
        lines = normalised(text.splitlines())
        for chunk in windows(lines):
            if chunk in index:
                found.add((name, *index[chunk]))
    return sorted(found)


def test_no_solution_body_stands_in_a_file_students_receive():
    copies = copies_of_solutions((name, path.read_text()) for name, path in received_files())
    assert not copies, "solution code in files students receive (call the exercise instead): " \
        + "; ".join(f"{name} holds {lesson}'s {function}" for name, lesson, function in copies)


def test_the_answer_check_finds_a_reindented_copy():
    lesson, function, body = max(solution_bodies(), key=lambda b: len(b[2]))
    copied = "def helper():\n" + "\n".join("        " + line for line in body) + "\n"
    assert copies_of_solutions([("scripts/copy.py", copied)]) == [
        ("scripts/copy.py", lesson, function)]
