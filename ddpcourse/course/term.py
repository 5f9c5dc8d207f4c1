"""A term's grades: one record, merged run after run, and what is exported from it.

`grading class` (`make grade-class`) grades some students and some lessons, then merges what
it graded into the term record (build/grades/term.json unless `--term`): one cell per
(student, lesson, exercise), each with its points earned and possible, its status and the
time it was graded. A run replaces only the (student, lesson) cells it graded, so re-grading
one student (`--only alice`, or a folder holding only alice) or one lesson (`--lesson 3`)
leaves every other cell as it was. class.csv, class.json, the gradebook CSV and each
student's feedback.md are then written from the record.

A cell's status is one of:
  graded      the grading tests ran;
  late        graded, handed in after the policy's due date: its points lose the penalty;
  missing     nothing of the lesson was handed in (and where it was looked for), or the
              roster names a student with no folder: 0 points, never "0 of 20, graded";
  refused     the intake would not read the lesson's files (ddpcourse/course/intake.py): 0
              points, with the intake's reason;
  not graded  the grader's own fault: no points at all (empty, never 0); grade again.

The roster (`--roster`, a CSV: `folder` or `login`, `student_id`, `name`, `email`, optionally
`submitted_at` or `submitted_at_lessonN`) joins every export. The late policy (`--policy`, a
TOML file) is

    due = 2025-10-01T23:59:00+02:00   # or a string; without a zone: this machine's time
    penalty_per_day = 0.1             # a fraction of the points, per day or part of one
    max_penalty = 1.0                 # optional: the most a submission can lose
    [lessons.3]                       # optional: another due date (or penalty) for lesson 3
    due = 2025-10-15T23:59:00+02:00

A submission's time is the roster's `submitted_at` (or `submitted_at_lessonN`) where given,
else the newest modification time of the files in its lesson folder. The record remembers the
roster's path and the policy last given, so a later run without them exports the same way.

    python -m ddpcourse.course.term export [--term T] [--csv C] [--roster R] [--policy P]
                                           [--gradebook G] [--anonymous]
    python -m ddpcourse.course.term feedback OUT     # feedback.md again for every cell in OUT
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as dt
import fcntl
import hashlib
import json
import math
import os
import re
import stat
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ddpcourse.course.lessons import all_lessons
from ddpcourse.course.readings import ROOT, headings

GRADED, LATE, MISSING, REFUSED, NOT_GRADED = "graded", "late", "missing", "refused", "not graded"
STATUSES = (GRADED, LATE, MISSING, REFUSED, NOT_GRADED)
FORMAT = 1


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def lesson_of(exercise: str) -> int:
    return int(re.match(r"l(\d+)_", exercise).group(1))


def reading_for(exercise: str) -> str:
    """The reading a student should go back to for an exercise: the section its lesson.toml's
    [readings] names, or the lesson's README (for a lesson as a whole, `l{n}_`)."""
    number = lesson_of(exercise)
    for lesson in all_lessons():
        if lesson.number == number and exercise in lesson.readings:
            return f"lessons/lesson{number}/{lesson.readings[exercise]}"
    return f"lessons/lesson{number}/README.md"


def read_again(exercise: str) -> str:
    """The feedback's pointer: the section's title in words, then where it is."""
    where = reading_for(exercise)
    page, _, anchor = where.partition("#")
    title = headings(ROOT / page).get(anchor) if anchor else None
    return f"Read again: section \"{title}\" of {where}" if title else f"Read again: {where}"


# --- the roster -----------------------------------------------------------------------------

@dataclass
class Student:
    folder: str
    student_id: str = ""
    name: str = ""
    email: str = ""
    submitted_at: dict[int | None, str] = field(default_factory=dict)  # None: every lesson


def read_roster(path: str | Path) -> dict[str, Student]:
    """{folder: Student} from a roster CSV. Its header names `folder` (or `login`: the folder
    is named after the login), `student_id`, `name`, `email`; `submitted_at` and
    `submitted_at_lessonN` are optional (ISO date-times)."""
    path = Path(path)
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        header = [h.strip().lower() for h in reader.fieldnames or []]
        key = "folder" if "folder" in header else "login" if "login" in header else None
        if key is None:
            raise SystemExit(f"error: roster {path}: its header has neither `folder` nor "
                             f"`login` (it has {', '.join(header) or 'nothing'})")
        roster = {}
        for number, row in enumerate(reader, start=2):
            row = {(k or "").strip().lower(): (v or "").strip() for k, v in row.items()}
            folder = row.get(key, "")
            if not folder:
                continue
            if folder in roster:
                raise SystemExit(f"error: roster {path}, line {number}: {folder} again")
            times = {}
            for column, value in row.items():
                found = re.fullmatch(r"submitted_at(?:_lesson(\d+))?", column)
                if found and value:
                    parse_time(value, f"roster {path}, line {number}, {column}")
                    times[int(found.group(1)) if found.group(1) else None] = value
            roster[folder] = Student(folder, row.get("student_id", ""), row.get("name", ""),
                                     row.get("email", ""), times)
    return roster


def parse_time(value, where: str) -> dt.datetime:
    """An ISO date-time (or a TOML one) as an aware datetime; without a zone, local time."""
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        value = dt.datetime.combine(value, dt.time(23, 59, 59))
    if not isinstance(value, dt.datetime):
        try:
            value = dt.datetime.fromisoformat(str(value).strip())
        except ValueError:
            raise SystemExit(f"error: {where}: {value!r} is not an ISO date-time "
                             "(2025-10-01T23:59:00+02:00)") from None
    return value if value.tzinfo else value.astimezone()


# --- the late policy -----------------------------------------------------------------------

@dataclass
class Policy:
    due: str | None = None
    penalty_per_day: float = 0.0
    max_penalty: float = 1.0
    lessons: dict[int, dict] = field(default_factory=dict)  # lesson -> its own due/penalty

    def rule(self, lesson: int) -> tuple[str | None, float, float]:
        own = self.lessons.get(lesson, {})
        return (own.get("due", self.due), float(own.get("penalty_per_day", self.penalty_per_day)),
                float(own.get("max_penalty", self.max_penalty)))

    def lateness(self, lesson: int, submitted: str | None) -> tuple[int, float]:
        """(whole days late, counting a part of a day as one; the fraction of points lost)."""
        due, per_day, most = self.rule(lesson)
        if due is None or submitted is None:
            return 0, 0.0
        late = (parse_time(submitted, "submitted_at") - parse_time(due, "policy due")
                ).total_seconds()
        if late <= 0:
            return 0, 0.0
        days = math.ceil(late / 86400)
        return days, min(most, max(0.0, days * per_day))

    def as_dict(self) -> dict:
        return {"due": self.due, "penalty_per_day": self.penalty_per_day,
                "max_penalty": self.max_penalty,
                "lessons": {str(n): rule for n, rule in self.lessons.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> Policy:
        return cls(data.get("due"), float(data.get("penalty_per_day", 0.0)),
                   float(data.get("max_penalty", 1.0)),
                   {int(n): rule for n, rule in data.get("lessons", {}).items()})


def read_policy(path: str | Path) -> Policy:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise SystemExit(f"error: policy {path}: {error}") from None

    def rule(table: dict, where: str) -> dict:
        unknown = set(table) - {"due", "penalty_per_day", "max_penalty", "lessons"}
        if unknown:
            raise SystemExit(f"error: policy {path}: {where}: unknown key(s) "
                             f"{', '.join(sorted(unknown))}")
        out = {}
        if "due" in table:
            out["due"] = parse_time(table["due"], f"policy {path}, {where}due").isoformat()
        for key in ("penalty_per_day", "max_penalty"):
            if key in table:
                value = table[key]
                if not isinstance(value, int | float) or not 0 <= value <= 1:
                    raise SystemExit(f"error: policy {path}: {where}{key} = {value!r}: give a "
                                     "fraction between 0 and 1")
                out[key] = float(value)
        return out

    top = rule(data, "")
    lessons = {}
    for name, table in data.get("lessons", {}).items():
        if not str(name).isdigit() or not isinstance(table, dict):
            raise SystemExit(f"error: policy {path}: [lessons.{name}]: give a lesson number")
        lessons[int(name)] = rule(table, f"[lessons.{name}] ")
    return Policy(top.get("due"), top.get("penalty_per_day", 0.0), top.get("max_penalty", 1.0),
                  lessons)


# --- a submission: what was handed in, and when --------------------------------------------

def missing_reason(folder: Path, lesson: int, why: str = "") -> str:
    """What was expected where, in one line: "no lesson1/exercises.py under alice/"."""
    folder = Path(folder)
    said = (f"no lesson{lesson}/exercises.py (nor lessons/lesson{lesson}/exercises.py) "
            f"under {folder.name}/")
    try:
        entries = [e.name for e in os.scandir(folder)]
    except OSError:
        return why or f"{folder.name}/ could not be opened"
    if not entries:
        said += " (the folder is empty)"
    elif "exercises.py" in entries:
        said += (f" ({folder.name}/exercises.py is at the folder's root: put it in "
                 f"{folder.name}/lesson{lesson}/)")
    return said


def newest_mtime(folder: Path, lesson: int) -> str | None:
    """The newest modification time of the files in the submission's folder for `lesson`
    (lessonN/ or lessons/lessonN/, else the whole folder), no link followed; ISO, or None."""
    folder = Path(folder)
    for place in (folder / f"lesson{lesson}", folder / "lessons" / f"lesson{lesson}", folder):
        if place.is_dir() and not place.is_symlink():
            break
    else:
        return None
    newest = None
    for top, dirs, files in os.walk(place, followlinks=False):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
        for name in files:
            if name.endswith(".pyc"):
                continue
            try:
                info = os.lstat(os.path.join(top, name))
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                newest = info.st_mtime if newest is None else max(newest, info.st_mtime)
    if newest is None:
        return None
    return dt.datetime.fromtimestamp(newest, dt.UTC).isoformat(timespec="seconds")


# --- a lesson's cells ------------------------------------------------------------------------

def lesson_record(tests: dict[str, dict] | None = None, *, missing: str = "", refused: str = "",
                  not_graded: str = "", possible: dict[str, float] | None = None,
                  submitted_at: str | None = None, graded_at: str | None = None) -> dict:
    """One student's lesson as a grading run left it: {"status", "why", "scores": {exercise:
    {"earned", "possible"}}, "submitted_at", "graded_at"}. `tests` are the run's per-test
    records (results.json's "tests"); `possible` gives the lesson's exercises where no test
    ran (missing, not graded)."""
    from ddpcourse.course.grading import summarise

    scores = summarise(tests) if tests else {}
    for exercise, points in (possible or {}).items():
        scores.setdefault(exercise, {"earned": 0.0, "possible": float(points)})
    if not_graded:
        status, why = NOT_GRADED, not_graded
    elif missing:
        status, why = MISSING, missing
    elif refused:
        status, why = REFUSED, refused
    else:
        status, why = GRADED, ""
    if status in (MISSING, REFUSED):
        scores = {e: {"earned": 0.0, "possible": s["possible"]} for e, s in scores.items()}
    if status == NOT_GRADED:
        scores = {e: {"earned": None, "possible": s["possible"]} for e, s in scores.items()}
    return {"status": status, "why": why, "scores": scores, "submitted_at": submitted_at,
            "graded_at": graded_at or now()}


def lesson_record_from_results(lesson_dir: Path, lesson: int | None = None,
                               possible: dict[str, float] | None = None) -> dict:
    """lesson_record() of what a grading run wrote in lesson_dir (results.json): its tests,
    and its "missing", "refused" and "not_graded" notes for this lesson."""
    results = Path(lesson_dir) / "results.json"
    if not results.exists():
        return lesson_record(not_graded="its grading left no results", possible=possible)
    data = json.loads(results.read_text())
    refused = data.get("refused", {})
    missing = data.get("missing", {})

    def pick(notes: dict[str, str]) -> str:
        return notes.get(str(lesson), "") if lesson is not None else "; ".join(notes.values())

    graded_at = data.get("graded_at") or dt.datetime.fromtimestamp(
        results.stat().st_mtime, dt.UTC).isoformat(timespec="seconds")
    return lesson_record(data.get("tests", {}), missing=pick(missing), refused=pick(refused),
                         not_graded=data.get("not_graded", ""), possible=possible,
                         submitted_at=data.get("submitted_at"), graded_at=graded_at)


def cells_of(record: dict) -> dict[str, dict]:
    """{exercise: cell} of a lesson_record: the cells the term record keeps."""
    return {exercise: {"earned": s["earned"], "possible": s["possible"],
                       "status": record["status"], "why": record["why"],
                       "graded_at": record["graded_at"], "submitted_at": record["submitted_at"],
                       "days_late": 0, "penalty": 0.0}
            for exercise, s in record["scores"].items()}


# --- the term record --------------------------------------------------------------------------

def empty_term() -> dict:
    return {"format": FORMAT, "updated": None, "roster": None, "policy": None, "students": {}}


def load_term(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        return empty_term()
    term = json.loads(path.read_text())
    if term.get("format") != FORMAT:
        raise SystemExit(f"error: {path} is not a term record of this course (format "
                         f"{term.get('format')!r}, expected {FORMAT})")
    return term


@contextlib.contextmanager
def locked(path: str | Path):
    """Hold the term record's lock file (path.lock) while reading, merging and saving it."""
    lock = Path(path).with_suffix(".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def save_term(term: dict, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    term["updated"] = now()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(term, indent=1, sort_keys=False))
    tmp.replace(path)


def merge(term: dict, graded: dict[tuple[str, int], dict[str, dict]],
          whole_lessons: bool = True) -> dict:
    """Merge newly graded cells, {(student, lesson): {exercise: cell}}, into the term record.
    Each (student, lesson) graded replaces that student's cells of that lesson (all of them
    when whole_lessons, else only the exercises given); every other cell stays."""
    for (student, lesson), cells in graded.items():
        lessons = term["students"].setdefault(student, {"lessons": {}})["lessons"]
        if whole_lessons or str(lesson) not in lessons:
            lessons[str(lesson)] = {}
        lessons[str(lesson)].update({e: dict(c) for e, c in cells.items()})
    return term


def apply_policy(term: dict, roster: dict[str, Student] | None = None) -> None:
    """Each graded or late cell's status, days late and penalty under the record's policy,
    the submission's time taken from the roster where it gives one."""
    policy = Policy.from_dict(term["policy"]) if term.get("policy") else Policy()
    for student, entry in term["students"].items():
        listed = (roster or {}).get(student)
        for lesson, cells in entry["lessons"].items():
            for cell in cells.values():
                if cell["status"] not in (GRADED, LATE):
                    continue
                submitted = cell.get("submitted_at")
                if listed is not None:
                    submitted = listed.submitted_at.get(int(lesson),
                                                        listed.submitted_at.get(None, submitted))
                days, penalty = policy.lateness(int(lesson), submitted)
                cell.update(status=LATE if days else GRADED, days_late=days, penalty=penalty,
                            submitted_used=submitted)


def term_lessons(term: dict) -> list[int]:
    return sorted({int(n) for e in term["students"].values() for n in e["lessons"]})


def lesson_maxima(term: dict) -> dict[int, dict[str, float]]:
    """{lesson: {exercise: possible}}: the most any student's cell of it was worth."""
    maxima: dict[int, dict[str, float]] = {}
    for entry in term["students"].values():
        for lesson, cells in entry["lessons"].items():
            for exercise, cell in cells.items():
                here = maxima.setdefault(int(lesson), {})
                here[exercise] = max(here.get(exercise, 0.0), float(cell["possible"] or 0))
    return maxima


def ordered_exercises(names) -> list[str]:
    from ddpcourse.course.lessons import exercise_markers

    known = [m for m in exercise_markers() if m in names]
    return known + sorted(set(names) - set(known), key=lambda e: (lesson_of(e), e))


def lesson_summary(cells: dict[str, dict] | None, maximum: dict[str, float]) -> dict:
    """One student's lesson: status, why, earned (None: not graded), penalty in points, the
    points after it (missing and refused: 0), its maximum."""
    possible = sum(maximum.values())
    if not cells:
        return {"status": MISSING, "why": "", "earned": None, "after": 0.0, "penalty": 0.0,
                "possible": possible, "days_late": 0}
    first = next(iter(cells.values()))
    status, why = first["status"], first["why"]
    if status == NOT_GRADED:
        return {"status": status, "why": why, "earned": None, "after": None, "penalty": 0.0,
                "possible": possible, "days_late": 0}
    earned = sum(float(c["earned"] or 0) for c in cells.values())
    lost = sum(float(c["earned"] or 0) * float(c.get("penalty", 0.0)) for c in cells.values())
    return {"status": status, "why": why, "earned": earned, "after": earned - lost,
            "penalty": lost, "possible": possible, "days_late": first.get("days_late", 0),
            "fraction": first.get("penalty", 0.0)}


def status_line(lessons: dict[int, dict]) -> str:
    """class.csv's status: "graded"; "not graded: lesson N: why" first where the grader
    failed; then "lesson N refused: why", "lesson N missing: why", "lesson N late: ..."."""
    not_graded = [f"lesson {n}: {s['why']}" for n, s in lessons.items()
                  if s["status"] == NOT_GRADED]
    others = []
    for n, s in lessons.items():
        if s["status"] in (REFUSED, MISSING):
            others.append(f"lesson {n} {s['status']}: {s['why']}")
        elif s["status"] == LATE:
            others.append(f"lesson {n} late: {s['days_late']} day{'s' * (s['days_late'] > 1)}, "
                          f"-{100 * s['fraction']:g}% ({s['penalty']:g} points)")
    if not_graded:
        return "; ".join(["not graded: " + "; ".join(not_graded), *others])
    if lessons and all(s["status"] == MISSING for s in lessons.values()):
        return "missing: " + "; ".join(f"lesson {n}: {s['why']}" for n, s in lessons.items())
    return "; ".join([GRADED, *others])


def short_status(lessons: dict[int, dict]) -> str:
    """The gradebook's status: no reasons (they may name a folder), only what happened."""
    parts = []
    for n, s in lessons.items():
        if s["status"] == LATE:
            parts.append(f"lesson {n} late {s['days_late']}d -{100 * s['fraction']:g}%")
        elif s["status"] != GRADED:
            parts.append(f"lesson {n} {s['status']}")
    return "; ".join(parts) or GRADED


def class_table(term: dict, roster: dict[str, Student] | None = None,
                say=print) -> tuple[list[int], list[str], dict[str, dict]]:
    """(lessons, exercises, {student: row}) of the whole term: every student graded so far
    and every roster student, every lesson graded so far. A roster student with no cells of a
    lesson is missing it; a folder the roster does not list is said in one line and kept."""
    lessons = term_lessons(term)
    maxima = lesson_maxima(term)
    from ddpcourse.course.lessons import exercise_markers

    exercises = ordered_exercises({e for m in maxima.values() for e in m}
                                  | {e for e in exercise_markers() if lesson_of(e) in lessons})
    names = set(term["students"])
    if roster is not None:
        strays = sorted(names - set(roster))
        if strays:
            say(f"not in the roster (kept, with no student ID): {', '.join(strays)}")
        names |= set(roster)
    rows = {}
    for name in sorted(names):
        cells_by_lesson = term["students"].get(name, {"lessons": {}})["lessons"]
        summaries = {}
        for n in lessons:
            summary = lesson_summary(cells_by_lesson.get(str(n)), maxima[n])
            if not cells_by_lesson.get(str(n)):
                summary["why"] = (f"no folder {name}/ was handed in" if name not in term["students"]
                                  else f"{name}/ was not graded for lesson {n}")
            summaries[n] = summary
        cells = {e: c for n in lessons for e, c in cells_by_lesson.get(str(n), {}).items()}
        scores = {e: c["earned"] for e, c in cells.items()
                  if c["status"] in (GRADED, LATE, REFUSED) and c["earned"] is not None}
        counted = [s for s in summaries.values() if s["status"] in (GRADED, LATE, REFUSED)]
        blocked = any(s["status"] == NOT_GRADED for s in summaries.values())
        total = None if blocked or not counted else sum(s["earned"] for s in counted)
        maximum = sum(s["possible"] for s in summaries.values())
        after = None if blocked else sum(s["after"] or 0.0 for s in summaries.values())
        listed = (roster or {}).get(name)
        rows[name] = {
            "scores": scores, "total": total, "status": status_line(summaries),
            "maximum": maximum,
            "penalty": sum(s["penalty"] for s in summaries.values()),
            "after_penalty": after,
            "percentage": None if after is None or not maximum else round(
                100 * after / maximum, 2),
            "lessons": {str(n): {k: v for k, v in s.items()} for n, s in summaries.items()},
            "cells": cells,
            "student_id": listed.student_id if listed else "",
            "name": listed.name if listed else "", "email": listed.email if listed else "",
            "in_roster": listed is not None,
        }
    return lessons, exercises, rows


def number(value) -> str:
    return "" if value is None else f"{value:g}"


def write_class_csv(term: dict, csv_path: str | Path, roster: dict[str, Student] | None = None,
                    say=print) -> dict[str, dict]:
    """class.csv (and class.json beside it) of the whole term. The columns of before come
    first (student, a column per exercise, total, status); then maximum, late_penalty,
    after_penalty, percentage, student_id, name, email. A missing or not graded lesson leaves
    its cells empty; the total is empty when a lesson is not graded."""
    lessons, exercises, rows = class_table(term, roster, say)
    csv_path = Path(csv_path)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student", *exercises, "total", "status", "maximum", "late_penalty",
                         "after_penalty", "percentage", "student_id", "name", "email"])
        for name, row in rows.items():
            writer.writerow([name, *(number(row["scores"].get(e)) for e in exercises),
                             number(row["total"]), row["status"], number(row["maximum"]),
                             number(round(row["penalty"], 4)), number(row["after_penalty"]),
                             number(row["percentage"]), row["student_id"], row["name"],
                             row["email"]])
    saved = {name: {k: v for k, v in row.items() if k != "cells"} for name, row in rows.items()}
    csv_path.with_suffix(".json").write_text(json.dumps(
        {"lessons": lessons, "exercises": exercises, "students": saved}, indent=1))
    say(f"class results: {csv_path} (and {csv_path.with_suffix('.json').name} beside it): "
        f"{len(rows)} students, lesson{'s' * (len(lessons) != 1)} "
        f"{', '.join(map(str, lessons))}")
    return rows


def anonymous_id(folder: str) -> str:
    """A stable stand-in for a folder's name: the same folder, the same id, every export."""
    return "anon-" + hashlib.sha256(folder.encode()).hexdigest()[:12]


def write_gradebook(term: dict, path: str | Path, roster: dict[str, Student] | None = None,
                    anonymous: bool = False, say=print) -> list[dict]:
    """A gradebook's CSV: student_id (and student, name, email unless anonymous), the points
    of each lesson after the late penalty (missing and refused: 0; not graded: empty), points,
    maximum, percentage, status. Anonymous: the roster's student_id, or anonymous_id of the
    folder where the roster gives none; no name, e-mail or folder anywhere."""
    lessons, _, rows = class_table(term, roster, say=lambda line: None)
    header = ["student_id", *([] if anonymous else ["student", "name", "email"]),
              *(f"lesson{n}" for n in lessons), "points", "maximum", "percentage", "status"]
    lines = []
    for name, row in rows.items():
        student_id = row["student_id"] or (anonymous_id(name) if anonymous else "")
        line = {"student_id": student_id}
        if not anonymous:
            line.update(student=name, name=row["name"], email=row["email"])
        for n in lessons:
            after = row["lessons"][str(n)]["after"]
            line[f"lesson{n}"] = "" if after is None else f"{round(after, 4):g}"
        line.update(points=number(None if row["after_penalty"] is None
                                  else round(row["after_penalty"], 4)),
                    maximum=number(row["maximum"]), percentage=number(row["percentage"]),
                    status=short_status({int(n): s for n, s in row["lessons"].items()}))
        lines.append(line)
    if anonymous:
        lines.sort(key=lambda line: line["student_id"])  # not in the folders' order either
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, header)
        writer.writeheader()
        writer.writerows(lines)
    say(f"gradebook: {path} ({len(lines)} students{', anonymous' if anonymous else ''})")
    return lines


# --- feedback files ---------------------------------------------------------------------------

GRADER_FILE = re.compile(r"(^|[\s/\"'(])(tests/grading/|ddpcourse/course/)\S*")
FRAME = re.compile(r"^(\S[^\n]*?):(\d+): in (\S.*)$")


def for_a_student(message: str) -> str:
    """feedback.explain's text without the grader's traceback: the frames in the grader's own
    files (tests/grading/, ddpcourse/course/) go, and every other line naming one of them; the
    first line of the grading test's own that failed stays, as the check that failed, and so
    does every frame of the student's own code and the error."""
    kept, check, inside_grader = [], None, False
    for line in message.splitlines():
        frame = FRAME.match(line)
        if frame:
            inside_grader = bool(GRADER_FILE.search(" " + frame.group(1)))
            in_test = "tests/grading/" in frame.group(1)
            if inside_grader:
                if in_test and check is None:
                    check = ""  # its source line, next, is the check
                continue
            kept.append(line)
            continue
        if inside_grader and not line.startswith("E "):
            if check == "" and line.strip() and not set(line.strip()) <= {"^", "~"}:
                check = line.strip()
            continue
        if GRADER_FILE.search(line):
            continue
        inside_grader = False
        if set(line.strip()) <= {"^", "~"} and line.strip():
            continue
        kept.append(line[4:] if line.startswith("E   ") else line.removeprefix("E "))
    text = "\n".join(kept).strip()
    if check:
        text = f"The check: {check}\n{text}" if text else f"The check: {check}"
    return text


def in_words(test_name: str) -> str:
    """test_global_rank_two_nodes_of_four[case] -> 'global rank two nodes of four (case)'."""
    base, _, case = test_name.partition("[")
    words = base.removeprefix("test_").replace("_", " ")
    return words + (f" ({case.rstrip(']')})" if case else "")


def lowered(sentence: str) -> str:
    """'The groups ...' -> 'the groups ...' (but 'DDP's mean' stays)."""
    if len(sentence) > 1 and sentence[0].isupper() and sentence[1].islower():
        return sentence[0].lower() + sentence[1:]
    return sentence


def feedback_text(student: str, lesson: int, lesson_dir: Path,
                  cells: dict[str, dict] | None = None) -> str:
    """What the student reads about one lesson: its status, per exercise its points and, for
    each test that did not pass, what it checked and what went wrong, and where to read again."""
    from ddpcourse.course.feedback import graded_tests
    from ddpcourse.course.lessons import exercise_markers

    descriptions = exercise_markers()
    cells = cells or {}
    tests = graded_tests(Path(lesson_dir))
    checks = {}
    results = Path(lesson_dir) / "results.json"
    if results.exists():
        checks = {n: t.get("checks", "") for n, t in
                  json.loads(results.read_text()).get("tests", {}).items()}
    first = next(iter(cells.values()), {})
    status, why = first.get("status", GRADED if tests else MISSING), first.get("why", "")
    lines = [f"# Lesson {lesson}: feedback for {student}", ""]
    earned = sum(float(c["earned"] or 0) for c in cells.values()) if cells else sum(
        t.earned for t in tests)
    possible = sum(float(c["possible"]) for c in cells.values()) if cells else sum(
        t.points for t in tests)
    if status == MISSING:
        lines += [f"**Missing**: {why or 'nothing of this lesson was handed in'}.",
                  f"Nothing was graded: the lesson's {possible:g} points are not earned. Hand "
                  f"in `lesson{lesson}/exercises.py` inside your folder.", ""]
    elif status == REFUSED:
        lines += [f"**Refused**: the grader would not read your files: {why}.",
                  f"The lesson scores 0 of {possible:g}.", ""]
    elif status == NOT_GRADED:
        lines += [f"**Not graded yet**: {why}. This is the grader's fault, not yours: it will "
                  "be graded again.", ""]
    else:
        lines += [f"Points: **{earned:g} of {possible:g}**."]
        if status == LATE:
            fraction = first.get("penalty", 0.0)
            days = first.get("days_late", 0)
            lines += [f"Late by {days} day{'s' * (days > 1)}: the late penalty takes "
                      f"{100 * fraction:g}% of the points, leaving "
                      f"{earned * (1 - fraction):g} of {possible:g}."]
        lines.append("")
    if status in (MISSING, NOT_GRADED):
        lines.append(read_again(f"l{lesson}_"))
        return "\n".join(lines).rstrip() + "\n"
    by_exercise: dict[str, list] = {}
    for test in tests:
        by_exercise.setdefault(test.exercise, []).append(test)
    for exercise in ordered_exercises(set(by_exercise) | set(cells)):
        own = by_exercise.get(exercise, [])
        got = sum(t.earned for t in own)
        worth = sum(t.points for t in own) or float(cells.get(exercise, {}).get("possible", 0))
        what = descriptions.get(exercise, "").split(", ", 1)[-1]
        lines += [f"## {exercise}: {got:g} of {worth:g} points" + (f" ({what})" if what else ""),
                  ""]
        lost = [t for t in own if t.outcome != "passed"]
        if not lost:
            lines += ["Every test passed.", ""]
            continue
        for test in lost:
            checked = checks.get(test.nodeid, "").strip().rstrip(".")
            lines.append(f"- **{in_words(test.name)}** ({test.points:g} point"
                         f"{'s' * (test.points != 1)} lost)"
                         + (f": it checks {lowered(checked)}." if checked else "."))
            said = for_a_student(test.message)
            if said:
                lines += ["", "  ```text", *(f"  {line}" for line in said.splitlines()),
                          "  ```"]
            lines.append("")
        lines += [read_again(exercise), ""]
    return "\n".join(lines).rstrip() + "\n"


def write_feedback(student: str, lesson: int, lesson_dir: Path,
                   cells: dict[str, dict] | None = None) -> Path:
    """lesson_dir/feedback.md (lesson_dir: build/grades/class/<student>/lesson<N>)."""
    lesson_dir = Path(lesson_dir)
    lesson_dir.mkdir(parents=True, exist_ok=True)
    target = lesson_dir / "feedback.md"
    target.write_text(feedback_text(student, lesson, lesson_dir, cells))
    return target


def write_all_feedback(term: dict, out: str | Path) -> list[Path]:
    """feedback.md for every (student, lesson) cell of the term record, under out."""
    written = []
    for student, entry in term["students"].items():
        for lesson, cells in entry["lessons"].items():
            written.append(write_feedback(student, int(lesson),
                                          Path(out) / student / f"lesson{lesson}", cells))
    return written


# --- the command ------------------------------------------------------------------------------

def roster_of(term: dict, given: str | None) -> dict[str, Student] | None:
    """The roster given now (remembered in the record), else the one the record remembers."""
    if given:
        term["roster"] = str(Path(given).absolute())
    if not term.get("roster"):
        return None
    if not Path(term["roster"]).exists():
        print(f"warning: the term's roster {term['roster']} is gone: exported without it",
              file=sys.stderr)
        return None
    return read_roster(term["roster"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Export a term record of grades.")
    sub = parser.add_subparsers(dest="command", required=True)
    export = sub.add_parser("export", help="class.csv and a gradebook from the term record")
    export.add_argument("--term", default="build/grades/term.json")
    export.add_argument("--csv", default=None, help="default: class.csv beside the term record")
    export.add_argument("--roster", default=None)
    export.add_argument("--policy", default=None)
    export.add_argument("--gradebook", default=None)
    export.add_argument("--anonymous", action="store_true")
    again = sub.add_parser("feedback", help="feedback.md again for every cell of the record")
    again.add_argument("out", nargs="?", default="build/grades/class")
    again.add_argument("--term", default="build/grades/term.json")
    args = parser.parse_args(argv)
    if not Path(args.term).exists():
        print(f"error: no term record at {args.term} (grade a class first)", file=sys.stderr)
        return 2
    with locked(args.term):
        return run_command(args)


def run_command(args) -> int:
    term = load_term(args.term)
    if args.command == "feedback":
        written = write_all_feedback(term, args.out)
        print(f"{len(written)} feedback files under {args.out}")
        return 0
    roster = roster_of(term, args.roster)
    if args.policy:
        term["policy"] = read_policy(args.policy).as_dict()
    apply_policy(term, roster)
    save_term(term, args.term)
    write_class_csv(term, args.csv or Path(args.term).with_name("class.csv"), roster)
    if args.gradebook:
        write_gradebook(term, args.gradebook, roster, args.anonymous)
    return 0


if __name__ == "__main__":
    sys.exit(main())
