"""Grading: the score keeper and the grading commands.

Which code is graded comes from COURSE_IMPL and COURSE_SUBMISSION, read by the one adapter,
`ddpcourse.exercises.load_exercises`.

Commands (the Makefile's `grade` and `grade-class` call these):

    python -m ddpcourse.course.grading grade [--lesson N] [--impl student|solutions]
                                             [--submission DIR]
    python -m ddpcourse.course.grading class SUBMISSIONS_DIR [--lesson N] [--csv grades.csv]
                                             [--workers K] [--only STUDENT] [--term T]
                                             [--roster R] [--policy P] [--gradebook G]
                                             [--anonymous]

A class is graded a lesson at a time, K students at a time, each student alone: the grading
tests (the judge) run in a process of their own that never imports the student's code, which
runs in a sandbox of its own (ddpcourse/course/sandbox.py). What a class run grades is merged
into the term's record (ddpcourse/course/term.py), and class.csv is written from the record.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ddpcourse.course import hidden, intake, term
from ddpcourse.course.lessons import all_lessons
from ddpcourse.course.sandbox import is_root, isolation, user_namespaces, zygote_for_this_process
from ddpcourse.exercises import IMPLS, ROOT

GRADING_TESTS = ROOT / "tests" / "grading"
EXERCISE_MARKER = re.compile(r"^l\d+_\w+$")


# --- the score keeper (a pytest plugin, registered by tests/grading/conftest.py) ----------

def exercise_of(item) -> str:
    names = [m.name for m in item.iter_markers() if EXERCISE_MARKER.match(m.name)]
    if len(set(names)) != 1:
        raise ValueError(f"{item.nodeid} must carry exactly one exercise marker, has {names}")
    return names[0]


def what_it_checks(item) -> str:
    """The first paragraph of the test's docstring, on one line (what a student reads it
    checks), or ''."""
    doc = getattr(getattr(item, "obj", None), "__doc__", None) or ""
    lines = [line.strip() for line in doc.strip().splitlines()]
    first = " ".join(lines[:lines.index("")] if "" in lines else lines)  # the first paragraph
    return first


def points_of(item) -> float:
    marker = item.get_closest_marker("points")
    if marker is None or not marker.args:
        raise ValueError(f"{item.nodeid} has no points marker")
    return float(marker.args[0])


# The grader's own relaunches in this grading process (ddpcourse/course/job_checks.py), for
# results.json and the JUnit report: nothing the submission did is tried again.
RETRIES: list[str] = []


def record_retry(what: str) -> None:
    RETRIES.append(what)
    print(f"grading: {what}", file=sys.stderr)


class ScoreKeeper:
    """Records every grading test's outcome and writes results JSON after each one.

    Writing as it goes means a submission that kills the grading process still leaves the
    scores of the tests before it, and the name of the test that was running.
    """

    def __init__(self, results_path: Path | None):
        self.path = results_path
        self.tests: dict[str, dict] = {}
        self.running: str | None = None
        self.draws_before = 0

    def pytest_collection_finish(self, session):
        for item in session.items:  # after -m / -k / --deselect: only what will run
            if GRADING_TESTS not in Path(str(item.path)).parents:
                continue
            self.tests[item.nodeid] = {"exercise": exercise_of(item), "points": points_of(item),
                                       "outcome": "not run", "checks": what_it_checks(item)}
        self._write(finished=False)

    def pytest_runtest_logstart(self, nodeid, location):
        self.running = nodeid
        self.draws_before = len(hidden.DRAWS)
        self._write(finished=False)

    def pytest_runtest_logreport(self, report):
        test = self.tests.get(report.nodeid)
        if test is None:
            return
        if report.when == "call" or (report.when == "setup" and not report.passed):
            test["outcome"] = "passed" if report.passed else (
                "skipped" if report.skipped else "failed")
            if len(hidden.DRAWS) > self.draws_before:  # its message may show a hidden case
                test["hidden_cases"] = True
        if report.when == "teardown":
            self.running = None
            self._write(finished=False)

    def pytest_sessionfinish(self, session):
        self._write(finished=True)

    def pytest_terminal_summary(self, terminalreporter):
        if self.path is not None:  # under `make grade`, which prints the table of all runs
            return
        terminalreporter.write_line("")
        for line in score_table(summarise(self.tests)).splitlines():
            terminalreporter.write_line(line)

    def _write(self, finished: bool) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {"finished": finished, "running": self.running, "tests": self.tests,
                "graded": str(exercise_source_label()), "retries": list(RETRIES)}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(self.path)


def exercise_source_label() -> str:
    return os.environ.get("COURSE_SUBMISSION") or os.environ.get("COURSE_IMPL", "student")


def summarise(tests: dict[str, dict]) -> dict[str, dict]:
    """Points earned and possible per exercise, in the order the tests were collected."""
    scores: dict[str, dict] = {}
    for test in tests.values():
        s = scores.setdefault(test["exercise"], {"earned": 0.0, "possible": 0.0})
        s["possible"] += test["points"]
        if test["outcome"] == "passed":
            s["earned"] += test["points"]
    return scores


def score_table(scores: dict[str, dict]) -> str:
    from ddpcourse.report import format_table

    rows = [{"exercise": name, "points": f"{s['earned']:g} / {s['possible']:g}"}
            for name, s in scores.items()]
    earned = sum(s["earned"] for s in scores.values())
    possible = sum(s["possible"] for s in scores.values())
    rows.append({"exercise": "TOTAL", "points": f"{earned:g} / {possible:g}"})
    return format_table(rows)


# --- the commands ------------------------------------------------------------------------

def registered_exercises() -> dict[str, int]:
    """{exercise marker: its lesson} from every lesson.toml."""
    return {e: lesson.number for lesson in all_lessons() for e in lesson.exercises}


def grading_targets(lesson: int | None) -> list[str]:
    if lesson is None:
        return [str(GRADING_TESTS)]
    path = GRADING_TESTS / f"test_lesson{lesson}.py"
    if not path.exists():
        raise SystemExit(f"error: lesson {lesson} has no graded exercises ({path} is missing)")
    return [str(path)]


def intake_problems(submission: str | Path,
                    lesson: int | None) -> tuple[dict[int, str], dict[int, str]]:
    """({lesson: why refused}, {lesson: what was expected where}) for each lesson (or this
    one) the intake (ddpcourse/course/intake.py) refuses, or finds nothing of, in the folder."""
    refused, missing = {}, {}
    for n in [lesson] if lesson is not None else graded_lessons():
        kind, why = intake_problem(submission, n)
        if kind:
            (refused if kind == term.REFUSED else missing)[n] = why
    return refused, missing


def intake_problem(submission: str | Path, lesson: int) -> tuple[str, str]:
    """("", ""), (term.REFUSED, the intake's reason) or (term.MISSING, what was expected
    where: "no lesson1/exercises.py ... under alice/") for one lesson of a folder."""
    try:
        intake.take(Path(submission), lesson)
    except intake.Refused as why:
        return term.REFUSED, str(why)
    except intake.Missing as why:
        return term.MISSING, term.missing_reason(Path(submission), lesson, str(why))
    return "", ""


def run_grading(lesson: int | None, out_dir: Path, impl: str = "student",
                submission: str | None = None, timeout: float = 900,
                quiet: bool = False, exercise: str | None = None) -> dict[str, dict]:
    """Run the grading tests in a child pytest; returns the per-test records. With
    `exercise`, only its tests run and are returned; out_dir's results.json and junit.xml
    keep the other exercises' tests from its last grading, so its feedback stays whole.

    The child is the judge: it never imports the submission, whose code runs in a sandbox
    (ddpcourse/course/sandbox.py), so a submission that exits, hangs or crashes fails only
    the request it was serving. Should the judge itself die all the same (the machine out of
    memory), the test that was running scores zero and grading resumes after it; each crash
    uses up one test, so there are at most as many restarts as tests.

    Why not pytest-xdist, which also restarts a crashed worker: its controller does not
    collect, so the report of a test that killed its worker carries no exercise marker or
    points, and the controller is one more process to start. Measured here for lesson 1:
    3.8 s for a plain grading run, 7.4-8.3 s with `-n 1`. This loop costs a restart only
    when a submission crashes.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    results = out_dir / "results.json"
    env = dict(os.environ, COURSE_IMPL=impl, COURSE_RESULTS=str(results))
    env.pop("COURSE_SUBMISSION", None)
    who = f" {Path(submission).name}" if submission else ""
    refused, missing = {}, {}
    if submission:
        # The folder itself, not where a link at its name points (intake refuses such a link).
        env["COURSE_SUBMISSION"] = str(Path(submission).absolute())
        refused, missing = intake_problems(submission, lesson)
        for n, why in refused.items():
            print(f"grading{who}: lesson {n} refused ({why}): it scores 0", file=sys.stderr)
        for n, why in missing.items():
            print(f"grading{who}: lesson {n} missing ({why})", file=sys.stderr)
    tests: dict[str, dict] = {}
    retries: list[str] = []
    deselect: list[str] = []
    junit_parts: list[Path] = []
    kept: dict[str, dict] = {}  # with `exercise`: the others' tests as last graded
    if exercise and results.exists():
        kept = {nodeid: test for nodeid, test in json.loads(results.read_text())["tests"].items()
                if test["exercise"] != exercise}
        if (out_dir / "junit.xml").exists():
            junit_parts.append(out_dir / "junit.kept.xml")
            shutil.copy(out_dir / "junit.xml", junit_parts[-1])
    for attempt in itertools.count():
        results.unlink(missing_ok=True)
        junit_parts.append(out_dir / f"junit.part{attempt}.xml")
        cmd = [sys.executable, "-m", "pytest", *grading_targets(lesson), "-q", "-rN",
               "--tb=short", "--no-header", f"--junitxml={junit_parts[-1]}",
               "-p", "no:cacheprovider", *(["-m", exercise] if exercise else []),
               *[f"--deselect={d}" for d in deselect]]
        try:
            subprocess.run(cmd, cwd=ROOT, env=env, timeout=timeout,
                           stdout=subprocess.DEVNULL if quiet else None)
        except subprocess.TimeoutExpired:
            pass
        if not results.exists():
            break
        data = json.loads(results.read_text())
        retries += data.get("retries", [])
        for nodeid, test in data["tests"].items():
            if nodeid not in tests or test["outcome"] != "not run":
                tests[nodeid] = test
        if data["finished"] or not data.get("running") or attempt > len(tests):
            break
        crashed = data["running"]
        tests[crashed]["outcome"] = "crashed"
        retries.append(f"{crashed} killed the grading process: it scores zero, and the tests "
                       "after it ran in a fresh one")
        print(f"grading{who}: {crashed} killed the grading process; it scores zero, "
              "grading goes on", file=sys.stderr)
        deselect = [n for n, t in tests.items() if t["outcome"] != "not run"]
    everything = {**kept, **tests}
    results.write_text(json.dumps({"finished": True, "tests": everything,
                                   "scores": summarise(everything),
                                   "refused": {str(n): why for n, why in refused.items()},
                                   "missing": {str(n): why for n, why in missing.items()},
                                   "retries": retries, "graded_at": term.now()}, indent=1))
    merge_junit(junit_parts, everything, out_dir / "junit.xml", retries)
    return tests


def junit_address(nodeid: str) -> tuple[str, str]:
    """(classname, name) of a test in pytest's JUnit file: tests/a.py::C::t -> (tests.a.C, t)."""
    *path, name = nodeid.split("::")
    path[0] = path[0].removesuffix(".py").replace("/", ".")
    return ".".join(path), name


def merge_junit(parts: list[Path], tests: dict[str, dict], target: Path,
                retries: list[str] = ()) -> None:
    """One JUnit file for the whole grading, a test case for every graded test.

    The cases come from the child pytests' own files; a child that was killed wrote none, so
    its tests are written here from the score keeper's records (the one that killed it as a
    failure). Cases the records do not know (a grading file that failed to import) are kept.
    """
    written: dict[tuple[str, str], ET.Element] = {}
    for part in parts:
        try:
            for case in ET.parse(part).getroot().iter("testcase"):
                written[(case.get("classname", ""), case.get("name", ""))] = case
        except (OSError, ET.ParseError):  # a child killed before it wrote its file
            pass
        part.unlink(missing_ok=True)
    suite = ET.Element("testsuite", name="grading")
    if retries:  # the grader's own relaunches, each said
        properties = ET.SubElement(suite, "properties")
        for retry in retries:
            ET.SubElement(properties, "property", name="retry", value=retry)
    for nodeid, test in tests.items():
        classname, name = junit_address(nodeid)
        case = written.pop((classname, name), None)
        if case is None:
            case = ET.Element("testcase", classname=classname, name=name)
            outcome = test["outcome"]
            if outcome == "crashed":
                ET.SubElement(case, "failure", message="killed the grading process")
            elif outcome == "failed":
                ET.SubElement(case, "failure",
                              message="failed (details lost with the killed grading process)")
            elif outcome in ("skipped", "not run"):
                ET.SubElement(case, "skipped", message=outcome)
        suite.append(case)
    suite.extend(written.values())
    cases = suite.findall("testcase")
    for count, tag in (("failures", "failure"), ("errors", "error"), ("skipped", "skipped")):
        suite.set(count, str(sum(case.find(tag) is not None for case in cases)))
    suite.set("tests", str(len(cases)))
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(target, encoding="utf-8", xml_declaration=True)


def cmd_grade(args) -> int:
    out = Path(args.out)
    tests = run_grading(args.lesson, out, args.impl, args.submission, args.timeout)
    if not tests:
        print("error: no grading tests ran", file=sys.stderr)
        return 1
    print()
    print(f"graded: {args.submission or args.impl}"
          + (f", lesson {args.lesson}" if args.lesson else ", all lessons"))
    print(score_table(summarise(tests)))
    print(f"results: {out / 'results.json'}  junit: {out / 'junit.xml'}")
    return 0


def graded_lessons() -> list[int]:
    return sorted(int(m.group(1)) for path in GRADING_TESTS.glob("test_lesson*.py")
                  if (m := re.fullmatch(r"test_lesson(\d+)\.py", path.name)))


def grade_lesson_of_class(lesson: int, students: list[Path], out: Path, timeout: float,
                          workers: int, exercise: str | None = None
                          ) -> dict[Path, tuple[dict[str, dict], str]]:
    """{student: (per-test records, why it is not graded or "")} for one lesson, `workers`
    students at a time. Each student is graded alone: a judge process of its own, and the
    student's code in a sandbox of its own (ddpcourse/course/sandbox.py), its jobs included,
    so nothing of one student's reaches another's grading. Results and JUnit go to
    out/<student>/lesson<N>/."""
    where = {student: out / student.name / f"lesson{lesson}" for student in students}

    def grade(student: Path) -> tuple[dict[str, dict], str]:
        tests = run_grading(lesson, where[student], submission=str(student), timeout=timeout,
                            quiet=True, exercise=exercise)
        return tests, "" if tests else "its grading tests did not run (the grader failed)"

    with ThreadPoolExecutor(workers) as pool:
        return dict(zip(students, pool.map(grade, students), strict=True))


def submission_folders(base: Path) -> list[Path]:
    """A class's submission folders, in name order (hidden ones left out); a link among them
    is kept, for its grading to refuse it."""
    return sorted(p for p in base.iterdir() if (p.is_dir() or p.is_symlink())
                  and not p.name.startswith("."))


def grade_students(students: list[Path], lessons: list[int], args) -> dict[str, dict]:
    """{student name: {"scores": {exercise: earned}, "not_graded": ["lesson N: why", ...],
    "lessons": {"N": term.lesson_record(...)}}} for these students, a lesson at a time
    (grade_lesson_of_class), timed as it goes. A folder with nothing of a lesson is not
    graded: its lesson is missing, with what was expected where (its results.json says so)."""
    out = Path(args.out)
    results = {s.name: {"scores": {}, "not_graded": [], "lessons": {}} for s in students}
    class_started = time.perf_counter()
    print(f"grading {len(students)} submission(s), {args.workers} at once", flush=True)
    for lesson in lessons:
        started = time.perf_counter()
        problems = {student: intake_problem(student, lesson) for student in students}
        to_grade = [s for s in students if problems[s][0] != term.MISSING]
        graded = grade_lesson_of_class(lesson, to_grade, out, args.timeout, args.workers,
                                       args.exercise) if to_grade else {}
        for student in students:
            record = results[student.name]
            where = out / student.name / f"lesson{lesson}"
            kind, problem = problems[student]
            if kind == term.MISSING:
                record["lessons"][str(lesson)] = term.lesson_record(missing=problem)
                where.mkdir(parents=True, exist_ok=True)
                (where / "junit.xml").unlink(missing_ok=True)
                (where / "results.json").write_text(json.dumps(
                    {"finished": True, "tests": {}, "scores": {}, "refused": {},
                     "missing": {str(lesson): problem}, "retries": [],
                     "graded_at": term.now()}, indent=1))
                print(f"{student.name}: lesson {lesson}: missing ({problem})")
                continue
            tests, why = graded[student]
            if why:
                record["not_graded"].append(f"lesson {lesson}: {why}")
                record["lessons"][str(lesson)] = term.lesson_record(not_graded=why)
                print(f"{student.name}: lesson {lesson} not graded: {why}")
                continue
            lesson_scores = summarise(tests)
            record["scores"].update({e: s["earned"] for e, s in lesson_scores.items()})
            saved = where / "results.json"
            refused = json.loads(saved.read_text()).get("refused", {}) if saved.exists() else {}
            record.setdefault("refused", []).extend(
                f"lesson {n} refused: {why}" for n, why in refused.items())
            record["lessons"][str(lesson)] = term.lesson_record(
                tests, refused=refused.get(str(lesson), ""),
                submitted_at=term.newest_mtime(student, lesson))
            print(f"{student.name}: lesson {lesson}: "
                  f"{sum(s['earned'] for s in lesson_scores.values()):g} of "
                  f"{sum(s['possible'] for s in lesson_scores.values()):g} points"
                  + "".join(f" (refused: {why})" for why in refused.values()))
        elapsed = time.perf_counter() - started
        print(f"lesson {lesson}: {len(students)} submissions in {elapsed:.0f} s "
              f"({elapsed / len(students):.1f} s each)", flush=True)
    elapsed = time.perf_counter() - class_started
    print(f"{len(students)} submissions, {len(lessons)} lesson{'s' * (len(lessons) > 1)}, in "
          f"{elapsed:.0f} s ({elapsed / len(students) / len(lessons):.1f} s per submission "
          "per lesson)")
    return results


def lesson_points(lesson: int) -> dict[str, float]:
    """{exercise: points} of a lesson's grading tests, from collecting them (no test runs):
    what a missing or not graded lesson was worth when no student of the run was graded."""
    with tempfile.TemporaryDirectory() as scratch:
        collected = Path(scratch) / "results.json"
        subprocess.run([sys.executable, "-m", "pytest", *grading_targets(lesson), "-q",
                        "--collect-only", "-p", "no:cacheprovider"], cwd=ROOT,
                       env=dict(os.environ, COURSE_RESULTS=str(collected)),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
        if not collected.exists():
            return {}
        tests = json.loads(collected.read_text())["tests"]
    return {e: s["possible"] for e, s in summarise(tests).items()}


def class_cells(results: dict[str, dict], lessons: list[int],
                known: dict[int, dict[str, float]]) -> dict[tuple[str, int], dict[str, dict]]:
    """{(student, lesson): {exercise: cell}} of a class run's results (grade_students, or a
    SLURM task's), for term.merge. A lesson missing or not graded gets a cell per exercise,
    its points possible from the students graded in this run, else from the term record
    (`known`), else from collecting the lesson's tests."""
    records = {}
    for name, result in results.items():
        for lesson in lessons:
            record = result.get("lessons", {}).get(str(lesson)) or term.lesson_record(
                not_graded="; ".join(result.get("not_graded", [])) or "no results came back")
            records[(name, lesson)] = record
    for lesson in lessons:
        possible: dict[str, float] = {}
        for (_, n), record in records.items():
            if n == lesson and record["status"] not in (term.MISSING, term.NOT_GRADED):
                for e, s in record["scores"].items():
                    possible[e] = max(possible.get(e, 0.0), s["possible"])
        possible = possible or dict(known.get(lesson, {}))
        emptied = [r for (_, n), r in records.items() if n == lesson and not r["scores"]]
        if emptied and not possible:
            possible = lesson_points(lesson)
        for record in emptied:
            earned = None if record["status"] == term.NOT_GRADED else 0.0
            record["scores"] = {e: {"earned": earned, "possible": p} for e, p in possible.items()}
    return {key: term.cells_of(record) for key, record in records.items()}


def write_class_results(results: dict[str, dict], lessons: list[int], csv_path: Path,
                        term_path: Path | None = None, out: Path | None = None,
                        roster: str | None = None, policy: str | None = None,
                        gradebook: str | None = None, anonymous: bool = False,
                        exercise: str | None = None) -> dict:
    """Merge a class run's results into the term record (term_path, default term.json beside
    the CSV): only the (student, lesson) cells graded now are replaced. Then, from the whole
    record: the class's CSV (a column per exercise, the total, the status, then the maximum,
    the late penalty, the percentage and the roster's columns) and the same as JSON beside
    it; each graded student's feedback.md under out; a gradebook CSV if asked. A lesson not
    graded leaves its cells and the total empty, never 0; a missing one says what was
    expected where. With `exercise`, only that exercise's cells are replaced."""
    term_path = Path(term_path) if term_path else Path(csv_path).with_name("term.json")
    with term.locked(term_path):  # two classes graded at once: each merge sees the other's
        record = term.load_term(term_path)
        listed = term.roster_of(record, roster)
        if policy:
            record["policy"] = term.read_policy(policy).as_dict()
        cells = class_cells(results, lessons, term.lesson_maxima(record))
        term.merge(record, cells, whole_lessons=exercise is None)
        term.apply_policy(record, listed)
        term.save_term(record, term_path)
    print(f"term record: {term_path} ({len(cells)} student-lessons merged)")
    if out is not None:
        for (name, lesson) in cells:
            term.write_feedback(name, lesson, Path(out) / name / f"lesson{lesson}",
                                record["students"][name]["lessons"][str(lesson)])
        print(f"feedback: {Path(out)}/<student>/lesson<N>/feedback.md")
    rows = term.write_class_csv(record, csv_path, listed)
    if gradebook:
        term.write_gradebook(record, gradebook, listed, anonymous)
    return rows


def task_results_path(out: Path, task: int) -> Path:
    return out / "tasks" / f"task{task}.json"


def grade_class_on_slurm(base: Path, students: list[Path], lessons: list[int],
                         args) -> dict[str, dict]:
    """Submit one array job (tests/grading/grade_class.sbatch) of args.tasks tasks to the
    SLURM cluster this machine is on, wait for it, and merge what its tasks wrote. The
    students of a task that left no results are not graded, with the reason, never 0."""
    out = Path(args.out).resolve()
    tasks = max(1, min(args.tasks, len(students)))
    shutil.rmtree(out / "tasks", ignore_errors=True)  # no results from an earlier run
    (out / "slurm").mkdir(parents=True, exist_ok=True)
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise SystemExit("error: SLURM=1 needs sbatch on this machine (a cluster's login node)")
    venv = Path(sys.prefix)  # the tasks use this Python environment: it must be on shared disk
    command = [sbatch, "--wait", f"--array=0-{tasks - 1}",
               f"--output={out / 'slurm' / 'task-%a.out'}", *args.sbatch_args.split(),
               str(GRADING_TESTS / "grade_class.sbatch"), str(base.resolve()),
               "--out", str(out), "--timeout", str(args.timeout),
               *(["--lesson", str(args.lesson)]
                                                 if args.lesson else []),
               *(f"--only={names}" for names in args.only),  # the same slices as here
               *([f"--exercise={args.exercise}"] if args.exercise else []),
               *(["--allow-unisolated"] if args.allow_unisolated else [])]
    print("$ " + " ".join(command), flush=True)
    started = time.perf_counter()
    ended = subprocess.run(command, cwd=ROOT, env=dict(os.environ, COURSE_VENV=str(venv)))
    print(f"SLURM array of {tasks} task(s) ended with exit status {ended.returncode} after "
          f"{time.perf_counter() - started:.0f} s", flush=True)
    results = {}
    for task in range(tasks):
        share = students[task::tasks]
        saved = task_results_path(out, task)
        if saved.exists():
            results.update(json.loads(saved.read_text()))
            continue
        log = out / "slurm" / f"task-{task}.out"
        last = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
        why = (f"SLURM array task {task} ended without results ({log}"
               + (f": {last[0][:200]}" if last else "") + ")")
        print(f"task {task}: {why}; {len(share)} student(s) not graded", file=sys.stderr)
        results.update({s.name: {"scores": {}, "not_graded": [why]} for s in share})
    return {s.name: results[s.name] for s in students}


def cmd_class(args) -> int:
    base = Path(args.submissions)
    if not base.is_dir():
        print(f"error: {base} is not a folder of submissions", file=sys.stderr)
        return 2
    students = submission_folders(base)
    if not students:
        print(f"error: {base} holds no submission folders", file=sys.stderr)
        return 2
    if args.only:
        wanted = {name for names in args.only for name in names.split(",") if name}
        unknown = sorted(wanted - {s.name for s in students})
        if unknown:
            print(f"error: --only {', '.join(unknown)}: no such folder under {base}",
                  file=sys.stderr)
            return 2
        students = [s for s in students if s.name in wanted]
    if args.exercise:
        exercise_lesson = registered_exercises().get(args.exercise)
        if exercise_lesson is None or args.lesson not in (None, exercise_lesson):
            where = f"lesson {args.lesson}'s" if args.lesson else "any lesson's"
            print(f"error: EXERCISE={args.exercise}: not one of {where} exercises (each "
                  "lesson.toml's [exercises] lists them)", file=sys.stderr)
            return 2
        args.lesson = exercise_lesson
    lessons = [args.lesson] if args.lesson else graded_lessons()
    grading_targets(args.lesson)  # a lesson without grading tests: one line, before any work
    if args.slice:  # one task of a SLURM array: its share of the class, for the merge
        task, tasks = args.slice
        results = grade_students(students[task::tasks], lessons, args)
        saved = task_results_path(Path(args.out), task)
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps(results, indent=1))
        print(f"task {task} of {tasks}: results in {saved}")
        return 0
    if args.slurm:
        results = grade_class_on_slurm(base, students, lessons, args)
    else:
        results = grade_students(students, lessons, args)
    write_class_results(results, lessons, Path(args.csv), args.term, Path(args.out),
                        args.roster, args.policy, args.gradebook, args.anonymous,
                        args.exercise)
    return 0


def task_slice(text: str) -> tuple[int, int]:
    """'2/5' -> (2, 5): task 2 of 5 takes every fifth submission from the third."""
    match = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not match or not int(match.group(1)) < int(match.group(2)):
        raise argparse.ArgumentTypeError(f"--slice {text!r}: give TASK/TASKS, 0 <= TASK < TASKS")
    return int(match.group(1)), int(match.group(2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Grade the course's exercises.")
    sub = parser.add_subparsers(dest="command", required=True)
    grade = sub.add_parser("grade", help="grade one copy of the exercises")
    grade.add_argument("--impl", choices=IMPLS, default="student")
    grade.add_argument("--submission", default=None, help="a student's folder to grade")
    grade.add_argument("--out", default="build/grades")
    grade.set_defaults(func=cmd_grade)
    klass = sub.add_parser("class", help="grade every submission folder under a directory")
    klass.add_argument("submissions")
    klass.add_argument("--csv", default="build/grades/class.csv")
    klass.add_argument("--out", default="build/grades/class")
    klass.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1),
                       help="students whose grading tests run at once (default: the cores, "
                            "at most 8)")
    klass.add_argument("--slurm", action="store_true",
                       help="grade as one SLURM array job on this machine's cluster")
    klass.add_argument("--tasks", type=int, default=4,
                       help="with --slurm: array tasks, each a slice of the class (default 4)")
    klass.add_argument("--sbatch-args", default="",
                       help="with --slurm: more sbatch options, e.g. '--partition=cpu'")
    klass.add_argument("--slice", type=task_slice, default=None,
                       help="TASK/TASKS: grade only that slice (what an array task runs)")
    klass.add_argument("--only", action="append", default=[], metavar="STUDENT",
                       help="grade only this student's folder (again: merged into the term "
                            "record); repeat it, or give several separated by commas")
    klass.add_argument("--exercise", default=None, metavar="EXERCISE",
                       help="grade only this exercise (l1_identity): its cells of the term "
                            "record are replaced, the lesson's others kept")
    klass.add_argument("--term", default=None,
                       help="the term record to merge into (default: term.json beside --csv, "
                            "build/grades/term.json)")
    klass.add_argument("--roster", default=None,
                       help="a roster CSV: folder (or login), student_id, name, email")
    klass.add_argument("--policy", default=None,
                       help="a late policy (TOML: due, penalty_per_day)")
    klass.add_argument("--gradebook", default=None,
                       help="also write a gradebook CSV here (student_id, points per lesson, "
                            "maximum, percentage)")
    klass.add_argument("--allow-unisolated", action="store_true",
                       help="grade even where nothing isolates the students' code")
    klass.add_argument("--anonymous", action="store_true",
                       help="the gradebook without names or e-mails")
    klass.set_defaults(func=cmd_class)
    for p in (grade, klass):
        p.add_argument("--lesson", type=lesson_number, default=None)
        p.add_argument("--timeout", type=float, default=900,
                       help="seconds for one submission's whole grading run")
    args = parser.parse_args(argv)
    if getattr(args, "submission", None) == "":
        args.submission = None
    print(isolation(), flush=True)
    print(hidden_cases(), flush=True)
    if args.func is cmd_class and not is_root() and not user_namespaces() and \
            not args.allow_unisolated:
        print("error: no isolation here for a class's code (neither root nor user namespaces); "
              "grade as root, or pass --allow-unisolated (make grade-class "
              "ALLOW_UNISOLATED=1) to grade it anyway", file=sys.stderr)
        return 2
    with zygote_for_this_process():  # every sandbox of this grading forks from one template
        return args.func(args)


def hidden_cases() -> str:
    """One seed for every submission this grading run grades (ddpcourse/course/hidden.py draws
    each test's hidden cases from it): the instructor's COURSE_HIDDEN_SEED, or one drawn now,
    said so that a re-grade can use it again."""
    if os.environ.get("COURSE_HIDDEN_SEED", "").strip():
        return "hidden cases: from COURSE_HIDDEN_SEED"
    os.environ["COURSE_HIDDEN_SEED"] = secrets.token_hex(8)
    return (f"hidden cases: drawn from seed {os.environ['COURSE_HIDDEN_SEED']} (give it as "
            "COURSE_HIDDEN_SEED to grade the same cases again)")


def lesson_number(text: str) -> int | None:
    if str(text).strip() == "":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"LESSON={text!r} is not a lesson number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"LESSON={value} is not a lesson number")
    return value


if __name__ == "__main__":
    sys.exit(main())
