"""A term's record of grades (ddpcourse/course/term.py, merged by `grading class`): re-grading
replaces only its own cells; a roster joins the exports; every cell has a status (graded,
missing, refused, late, not graded); the gradebook's percentages carry the late penalty and
can leave out every name; each student's feedback.md says what was checked and what went wrong
without the grader's traceback. The fast tests build per-student results as a grading run
writes them (results.json, junit.xml) and call the functions directly; one slow test grades a
class of lesson 1 for real, then one student again."""

import csv
import json
import os
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from util import PYTHON, ROOT, anchors, run

from ddpcourse.course import grading, term
from ddpcourse.course.grading import junit_address
from ddpcourse.course.lessons import all_lessons

LESSON1 = {  # nodeid -> (exercise, points, what its docstring says)
    "tests/grading/test_lesson1.py::test_global_rank_two_nodes_of_four":
        ("l1_global_rank", 2.0, "Global ranks on two nodes of four processes."),
    "tests/grading/test_lesson1.py::test_global_rank_every_rank_once":
        ("l1_global_rank", 2.0, ""),
    "tests/grading/test_lesson1.py::test_layout_one_gpu_per_process":
        ("l1_rank_layout", 6.0, ""),
    "tests/grading/test_lesson1.py::test_node_groups": ("l1_node_groups", 4.0, ""),
    "tests/grading/test_lesson1.py::test_identity_from_torchrun_env":
        ("l1_identity", 6.0, ""),
}

# What pytest's --tb=short says of a failed test graded through the sandbox.
TRACEBACK = """tests/grading/test_lesson1.py:35: in test_global_rank_two_nodes_of_four
    assert [ex.global_rank(0, g, 4) for g in range(4)] == [0, 1, 2, 3]
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
/work/main/ddpcourse/course/sandbox.py:611: in call
    return self._request({"op": "call", "name": name, "args": to_judge(args),
ddpcourse/course/sandbox.py:542: in _request
    raise self._exception(reply["raised"])
E   NotImplementedError: l1_global_rank: compute the global rank"""


def fake_run(lesson_dir: Path, failed=(), refused: str = "", missing: str = "",
             graded_at: str = "2025-10-02T10:00:00+00:00") -> dict[str, dict]:
    """results.json and junit.xml in lesson_dir as run_grading writes them: every test of
    LESSON1 passed but `failed` (test names), with TRACEBACK as their failure."""
    lesson_dir.mkdir(parents=True, exist_ok=True)
    tests = {nodeid: {"exercise": e, "points": p, "checks": doc,
                      "outcome": "failed" if nodeid.split("::")[1] in failed or refused
                      else "passed"}
             for nodeid, (e, p, doc) in LESSON1.items()}
    if missing:
        tests = {}
    (lesson_dir / "results.json").write_text(json.dumps({
        "finished": True, "tests": tests, "scores": grading.summarise(tests),
        "refused": {"1": refused} if refused else {}, "missing": {"1": missing} if missing
        else {}, "retries": [], "graded_at": graded_at}))
    suite = ET.Element("testsuite", name="grading")
    for nodeid, test in tests.items():
        classname, name = junit_address(nodeid)
        case = ET.SubElement(suite, "testcase", classname=classname, name=name)
        if test["outcome"] == "failed":
            failure = ET.SubElement(case, "failure", message="NotImplementedError")
            failure.text = TRACEBACK
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(lesson_dir / "junit.xml", encoding="utf-8", xml_declaration=True)
    return tests


def cells_from(lesson_dir: Path, lesson: int = 1, possible=None, submitted_at=None):
    record = term.lesson_record_from_results(lesson_dir, lesson, possible)
    if submitted_at:
        record["submitted_at"] = submitted_at
    return term.cells_of(record)


POSSIBLE = {"l1_global_rank": 4.0, "l1_rank_layout": 6.0, "l1_node_groups": 4.0,
            "l1_identity": 6.0}


def test_a_regrade_replaces_only_its_own_cells(tmp_path):
    out, record = tmp_path / "class", term.empty_term()
    fake_run(out / "ann" / "lesson1", failed=["test_node_groups"], graded_at="2025-10-02T10:00")
    fake_run(out / "bob" / "lesson1", graded_at="2025-10-02T10:00")
    fake_run(out / "bob" / "lesson3", graded_at="2025-10-02T10:00")
    term.merge(record, {(s, n): cells_from(out / s / f"lesson{n}", n)
                        for s, n in (("ann", 1), ("bob", 1), ("bob", 3))})
    before = json.loads(json.dumps(record))
    assert record["students"]["ann"]["lessons"]["1"]["l1_node_groups"]["earned"] == 0
    # ann again, alone, now with every test passed; then bob's lesson 3 again
    fake_run(out / "ann" / "lesson1", graded_at="2025-10-05T09:00")
    term.merge(record, {("ann", 1): cells_from(out / "ann" / "lesson1")})
    ann = record["students"]["ann"]["lessons"]["1"]
    assert ann["l1_node_groups"] == {**ann["l1_node_groups"], "earned": 4.0,
                                     "possible": 4.0, "status": "graded"}
    assert {c["graded_at"] for c in ann.values()} == {"2025-10-05T09:00"}
    assert record["students"]["bob"] == before["students"]["bob"]  # untouched
    fake_run(out / "bob" / "lesson3", failed=["test_identity_from_torchrun_env"],
             graded_at="2025-10-06T09:00")
    term.merge(record, {("bob", 3): cells_from(out / "bob" / "lesson3", 3)})
    assert record["students"]["bob"]["lessons"]["1"] == before["students"]["bob"]["lessons"]["1"]
    assert record["students"]["bob"]["lessons"]["3"]["l1_identity"]["earned"] == 0
    assert record["students"]["ann"]["lessons"]["1"] == ann
    # saved and loaded again: the same record
    term.save_term(record, tmp_path / "term.json")
    assert term.load_term(tmp_path / "term.json")["students"] == record["students"]


def test_grade_class_merges_runs_into_one_term_record(monkeypatch, tmp_path):
    """`grading class` twice, the second time --only bob: class.csv still has ann's first
    scores, and bob's new ones; the term record beside the CSV keeps both."""
    klass = tmp_path / "class"
    for student in ("ann", "bob"):
        (klass / student / "lesson1").mkdir(parents=True)
        (klass / student / "lesson1" / "exercises.py").write_text("")
    runs = iter([{"ann": ["test_node_groups"], "bob": ["test_layout_one_gpu_per_process"]},
                 {"bob": []}])

    def graded(lesson, students, out, timeout, workers, exercise=None):
        failing = next(runs)
        assert sorted(s.name for s in students) == sorted(failing)
        return {s: (fake_run(out / s.name / "lesson1", failing[s.name]), "") for s in students}

    monkeypatch.setattr(grading, "grade_lesson_of_class", graded)
    out_csv, out = tmp_path / "grades" / "class.csv", tmp_path / "grades" / "class"
    common = ["--lesson", "1", "--csv", str(out_csv), "--out", str(out)]
    assert grading.main(["class", str(klass), *common]) == 0
    assert grading.main(["class", str(klass), *common, "--only", "bob"]) == 0
    rows = {row["student"]: row for row in csv.DictReader(out_csv.open())}
    assert (rows["ann"]["l1_node_groups"], rows["ann"]["total"]) == ("0", "16")
    assert (rows["bob"]["l1_rank_layout"], rows["bob"]["total"]) == ("6", "20")
    assert rows["ann"]["status"] == rows["bob"]["status"] == "graded"
    assert rows["ann"]["maximum"] == "20" and rows["ann"]["percentage"] == "80"
    saved = json.loads((tmp_path / "grades" / "term.json").read_text())
    assert set(saved["students"]) == {"ann", "bob"}
    assert (out / "ann" / "lesson1" / "feedback.md").exists()
    assert grading.main(["class", str(klass), *common, "--only", "nobody"]) == 2


def roster_file(tmp_path, rows, header="folder,student_id,name,email") -> Path:
    path = tmp_path / "roster.csv"
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return path


def test_the_roster_joins_every_export_and_names_the_strays(tmp_path):
    out, record = tmp_path / "class", term.empty_term()
    for student in ("alice", "dave"):
        fake_run(out / student / "lesson1")
        term.merge(record, {(student, 1): cells_from(out / student / "lesson1")})
    roster = term.read_roster(roster_file(tmp_path, [
        "alice,s001,Alice Liddell,alice@uni.example", "carol,s003,Carol Ann,carol@uni.example"],
        header="login,student_id,name,email"))
    said = []
    rows = term.write_class_csv(record, tmp_path / "class.csv", roster, say=said.append)
    assert said[0] == "not in the roster (kept, with no student ID): dave"
    assert list(rows) == ["alice", "carol", "dave"]
    table = {row["student"]: row for row in csv.DictReader((tmp_path / "class.csv").open())}
    assert (table["alice"]["student_id"], table["alice"]["email"]) == ("s001",
                                                                        "alice@uni.example")
    assert table["alice"]["status"] == "graded" and table["alice"]["percentage"] == "100"
    # carol is on the roster and handed in nothing: missing, not 0 of 20 graded
    assert table["carol"]["status"] == "missing: lesson 1: no folder carol/ was handed in"
    assert table["carol"]["l1_identity"] == table["carol"]["total"] == ""
    assert table["carol"]["percentage"] == "0" and table["carol"]["maximum"] == "20"
    assert table["dave"]["student_id"] == "" and table["dave"]["total"] == "20"
    term.write_gradebook(record, tmp_path / "gb.csv", roster, say=said.append)
    book = list(csv.DictReader((tmp_path / "gb.csv").open()))
    assert [(r["student_id"], r["name"]) for r in book] == [
        ("s001", "Alice Liddell"), ("s003", "Carol Ann"), ("", "")]
    assert book[1]["status"] == "lesson 1 missing"


def test_a_roster_without_a_folder_column_is_refused_in_one_line(tmp_path):
    with pytest.raises(SystemExit) as refused:
        term.read_roster(roster_file(tmp_path, ["x,1"], header="who,student_id"))
    assert "neither `folder` nor `login`" in str(refused.value)


def test_missing_and_refused_say_what_and_why(tmp_path):
    klass = tmp_path / "class"
    (klass / "empty").mkdir(parents=True)
    (klass / "loose").mkdir()
    (klass / "loose" / "exercises.py").write_text("")  # Gradescope's way, not a class folder's
    (klass / "linked" / "lesson1").mkdir(parents=True)
    (klass / "linked" / "lesson1" / "exercises.py").symlink_to(
        ROOT / "lessons" / "lesson1" / "exercises.py")
    assert grading.intake_problem(klass / "empty", 1) == (
        "missing", "no lesson1/exercises.py (nor lessons/lesson1/exercises.py) under empty/ "
        "(the folder is empty)")
    kind, why = grading.intake_problem(klass / "loose", 1)
    assert kind == "missing" and "loose/exercises.py is at the folder's root: put it in " \
                                 "loose/lesson1/" in why
    kind, why = grading.intake_problem(klass / "linked", 1)
    assert (kind, why) == ("refused", "lesson1/exercises.py is a symbolic link: the grader "
                                      "follows no link")
    # in the record and class.csv
    out, record = tmp_path / "out", term.empty_term()
    fake_run(out / "empty" / "lesson1", missing=grading.intake_problem(klass / "empty", 1)[1])
    fake_run(out / "linked" / "lesson1", refused=why)
    term.merge(record, {
        ("empty", 1): cells_from(out / "empty" / "lesson1", possible=POSSIBLE),
        ("linked", 1): cells_from(out / "linked" / "lesson1")})
    cells = record["students"]["empty"]["lessons"]["1"]
    assert {c["status"] for c in cells.values()} == {"missing"}
    assert sum(c["possible"] for c in cells.values()) == 20
    term.write_class_csv(record, tmp_path / "c.csv", say=lambda line: None)
    rows = {r["student"]: r for r in csv.DictReader((tmp_path / "c.csv").open())}
    assert rows["empty"]["status"].startswith("missing: lesson 1: no lesson1/exercises.py")
    assert rows["empty"]["total"] == "" and rows["empty"]["l1_identity"] == ""
    assert rows["linked"]["status"] == f"graded; lesson 1 refused: {why}"
    assert rows["linked"]["total"] == "0" and rows["linked"]["l1_identity"] == "0"


def test_the_policy_makes_a_late_cell_and_the_gradebook_carries_the_penalty(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text('due = 2025-10-01T23:59:00+00:00\npenalty_per_day = 0.1\n'
                      '[lessons.3]\ndue = "2025-10-20T23:59:00+00:00"\n')
    read = term.read_policy(policy)
    assert read.lateness(1, "2025-10-01T23:00:00+00:00") == (0, 0.0)
    assert read.lateness(1, "2025-10-02T00:30:00+00:00") == (1, 0.1)  # a part of a day: one
    assert read.lateness(1, "2025-10-03T12:00:00+00:00") == (2, 0.2)
    assert read.lateness(1, "2025-11-30T12:00:00+00:00") == (60, 1.0)  # never below 0 points
    assert read.lateness(3, "2025-10-03T12:00:00+00:00") == (0, 0.0)  # its own due date
    bad = tmp_path / "bad.toml"
    bad.write_text("due = 2025-10-01\npenalty_per_day = 5\n")
    with pytest.raises(SystemExit, match="penalty_per_day"):
        term.read_policy(bad)

    klass, out, record = tmp_path / "class", tmp_path / "out", term.empty_term()
    for student in ("ann", "bob", "cy"):
        (klass / student / "lesson1").mkdir(parents=True)
        (klass / student / "lesson1" / "exercises.py").write_text("")
    # ann's newest file is 2 days late; bob's roster time is on time; cy's is 1 day late
    late = term.parse_time("2025-10-03T12:00:00+00:00", "").timestamp()
    os.utime(klass / "ann" / "lesson1" / "exercises.py", (late, late))
    assert term.newest_mtime(klass / "ann", 1) == "2025-10-03T12:00:00+00:00"
    fake_run(out / "ann" / "lesson1", failed=["test_node_groups"])  # 16 of 20
    fake_run(out / "bob" / "lesson1")
    fake_run(out / "cy" / "lesson1")
    term.merge(record, {
        ("ann", 1): cells_from(out / "ann" / "lesson1",
                               submitted_at=term.newest_mtime(klass / "ann", 1)),
        ("bob", 1): cells_from(out / "bob" / "lesson1", submitted_at="2025-10-09T00:00+00:00"),
        ("cy", 1): cells_from(out / "cy" / "lesson1")})
    roster = term.read_roster(roster_file(tmp_path, [
        "ann,s1,Ann,ann@x.example,", "bob,s2,Bob,bob@x.example,2025-10-01T20:00:00+00:00",
        "cy,s3,Cy,cy@x.example,2025-10-02T08:00:00+00:00"],
        header="folder,student_id,name,email,submitted_at"))
    record["policy"] = read.as_dict()
    term.apply_policy(record, roster)
    assert {c["status"] for c in record["students"]["ann"]["lessons"]["1"].values()} == {"late"}
    assert {c["status"] for c in record["students"]["bob"]["lessons"]["1"].values()} == {
        "graded"}
    book = {r["student_id"]: r for r in term.write_gradebook(record, tmp_path / "gb.csv",
                                                              roster, say=lambda line: None)}
    # ann: 16 points, 2 days late at 10% a day -> 12.8 of 20
    assert (book["s1"]["lesson1"], book["s1"]["points"], book["s1"]["maximum"],
            book["s1"]["percentage"]) == ("12.8", "12.8", "20", "64")
    assert book["s1"]["status"] == "lesson 1 late 2d -20%"
    assert (book["s2"]["points"], book["s2"]["percentage"], book["s2"]["status"]) == (
        "20", "100", "graded")
    assert (book["s3"]["points"], book["s3"]["percentage"]) == ("18", "90")
    term.write_class_csv(record, tmp_path / "c.csv", roster, say=lambda line: None)
    rows = {r["student"]: r for r in csv.DictReader((tmp_path / "c.csv").open())}
    assert rows["ann"]["total"] == "16" and rows["ann"]["after_penalty"] == "12.8"
    assert rows["ann"]["status"] == "graded; lesson 1 late: 2 days, -20% (3.2 points)"
    assert rows["ann"]["late_penalty"] == "3.2" and rows["ann"]["percentage"] == "64"


def test_a_not_graded_lesson_leaves_the_percentage_empty(tmp_path):
    record = term.empty_term()
    term.merge(record, {("ann", 1): term.cells_of(term.lesson_record(
        not_graded="job lesson1_W4 stopped", possible=POSSIBLE))})
    (book,) = term.write_gradebook(record, tmp_path / "gb.csv", say=lambda line: None)
    assert (book["lesson1"], book["points"], book["percentage"], book["status"]) == (
        "", "", "", "lesson 1 not graded")


def test_the_anonymous_gradebook_holds_no_name(tmp_path):
    out, record = tmp_path / "class", term.empty_term()
    for student in ("alice_w", "bob_k"):
        fake_run(out / student / "lesson1")
        term.merge(record, {(student, 1): cells_from(out / student / "lesson1")})
    fake_run(out / "carol_x" / "lesson1", missing="no lesson1/exercises.py under carol_x/")
    term.merge(record, {("carol_x", 1): cells_from(out / "carol_x" / "lesson1",
                                                   possible=POSSIBLE)})
    roster = term.read_roster(roster_file(tmp_path, ["alice_w,s001,Alice Wonder,aw@uni.example"]))
    path = tmp_path / "gradebook.csv"
    term.write_gradebook(record, path, roster, anonymous=True, say=lambda line: None)
    text = path.read_text()
    for name in ("alice", "Alice", "Wonder", "aw@uni", "bob", "carol", "@"):
        assert name not in text, name
    book = list(csv.DictReader(path.open()))
    assert list(book[0]) == ["student_id", "lesson1", "points", "maximum", "percentage",
                             "status"]
    ids = {r["student_id"] for r in book}
    assert "s001" in ids and term.anonymous_id("bob_k") in ids
    assert term.anonymous_id("bob_k") == term.anonymous_id("bob_k") != term.anonymous_id("bob")
    # without a roster: every id a hash of the folder, the same each export
    term.write_gradebook(record, tmp_path / "again.csv", anonymous=True, say=lambda line: None)
    again = {r["student_id"] for r in csv.DictReader((tmp_path / "again.csv").open())}
    assert again == {term.anonymous_id(s) for s in ("alice_w", "bob_k", "carol_x")}


def test_feedback_says_what_was_checked_and_what_went_wrong_without_the_grader(tmp_path):
    out, record = tmp_path / "class", term.empty_term()
    lesson_dir = out / "ann" / "lesson1"
    fake_run(lesson_dir, failed=["test_global_rank_two_nodes_of_four",
                                 "test_global_rank_every_rank_once"])
    term.merge(record, {("ann", 1): cells_from(lesson_dir)})
    written = term.write_feedback("ann", 1, lesson_dir, record["students"]["ann"]["lessons"]["1"])
    text = written.read_text()
    assert written == lesson_dir / "feedback.md"
    assert "tests/grading/" not in text and "ddpcourse/course/" not in text
    assert "sandbox.py" not in text and "_request" not in text
    assert "Points: **16 of 20**" in text
    assert "## l1_global_rank: 0 of 4 points" in text
    assert "## l1_identity: 6 of 6 points" in text and "Every test passed." in text
    # what it checked: the docstring where there is one, the test's name in words else
    assert "(2 points lost): it checks global ranks on two nodes of four processes." in text
    assert "- **global rank every rank once** (2 points lost).\n" in text
    # on which input, what was expected, and what came back
    assert "The check: assert [ex.global_rank(0, g, 4) for g in range(4)] == [0, 1, 2, 3]" \
        in text
    assert "NotImplementedError: l1_global_rank: compute the global rank" in text
    # the reading's section, by its title and its link
    assert ('Read again: section "3. World size and ranks" of '
            "lessons/lesson1/README.md#3-world-size-and-ranks") in text
    assert term.reading_for("l3_ddp_step") == "lessons/lesson3/README.md#5-the-ddp-wrapper"
    # a missing lesson's feedback says what was expected where
    fake_run(out / "bo" / "lesson1", missing="no lesson1/exercises.py under bo/")
    term.merge(record, {("bo", 1): cells_from(out / "bo" / "lesson1", possible=POSSIBLE)})
    written = term.write_all_feedback(record, out)
    assert len(written) == 2
    missing = (out / "bo" / "lesson1" / "feedback.md").read_text()
    assert "**Missing**: no lesson1/exercises.py under bo/." in missing
    assert "the lesson's 20 points are not earned" in missing


def test_a_student_frame_stays_in_the_feedback():
    message = ("tests/grading/test_lesson1.py:73: in test_layout_one_gpu_per_process\n"
               "    assert as_tuples(ex.rank_layout(2, 4, 1)) == as_tuples(ONE_GPU_EACH)\n"
               "ddpcourse/course/sandbox.py:542: in _request\n"
               "    raise self._exception(reply['raised'])\n"
               "/submission/lesson1/exercises.py:40: in rank_layout\n"
               "    return [x[0] for x in []]\n"
               "E   IndexError: list index out of range\n"
               "E   (raised in /work/main/ddpcourse/course/sandbox_child.py)")
    said = term.for_a_student(message)
    assert said.splitlines() == [
        "The check: assert as_tuples(ex.rank_layout(2, 4, 1)) == as_tuples(ONE_GPU_EACH)",
        "/submission/lesson1/exercises.py:40: in rank_layout",
        "    return [x[0] for x in []]",
        "IndexError: list index out of range"]


@pytest.mark.slow
@pytest.mark.grading_heavy  # make test-grading: a class of lesson 1 graded, one student again
@pytest.mark.timeout(300)
@pytest.mark.skipif(not (ROOT / "solutions").is_dir(),
                    reason="this copy of the course has no solutions/")
def test_a_class_graded_then_one_student_and_one_exercise_regraded_merge_into_the_term(
        tmp_path):
    klass, grades = tmp_path / "class", tmp_path / "grades"
    for student, source in (("ann", ROOT / "solutions"), ("ben", ROOT / "lessons")):
        (klass / student / "lesson1").mkdir(parents=True)
        shutil.copy(source / "lesson1" / "exercises.py", klass / student / "lesson1")
    (klass / "cat").mkdir()  # hands in nothing
    roster = roster_file(tmp_path, ["ann,s1,Ann A,ann@uni.example", "ben,s2,Ben B,ben@uni.example",
                                    "cat,s3,Cat C,cat@uni.example", "dan,s4,Dan D,dan@uni.example"])
    policy = tmp_path / "policy.toml"
    policy.write_text('due = "2025-06-01T00:00:00+00:00"\npenalty_per_day = 0.25\n')
    on_time = term.parse_time("2025-05-01T12:00:00+00:00", "").timestamp()
    for student in ("ann", "ben"):
        os.utime(klass / student / "lesson1" / "exercises.py", (on_time, on_time))

    def grade_class(*more):
        result = run([PYTHON, "-m", "ddpcourse.course.grading", "class", str(klass), "--lesson",
                      "1", "--csv", str(grades / "class.csv"), "--out", str(grades / "class"),
                      "--workers", "2", "--gradebook", str(grades / "gradebook.csv"), *more],
                     timeout=280)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return result.stdout, json.loads((grades / "term.json").read_text())

    said, first = grade_class("--roster", str(roster), "--policy", str(policy))
    assert "cat: lesson 1: missing (no lesson1/exercises.py" in said
    assert "3 submissions, 1 lesson, in " in said
    rows = {r["student"]: r for r in csv.DictReader((grades / "class.csv").open())}
    assert list(rows) == ["ann", "ben", "cat", "dan"]
    assert (rows["ann"]["total"], rows["ann"]["status"], rows["ann"]["student_id"]) == (
        "20", "graded", "s1")
    assert (rows["ben"]["total"], rows["ben"]["status"]) == ("0", "graded")
    assert rows["cat"]["status"].startswith("missing: lesson 1: no lesson1/exercises.py")
    assert rows["cat"]["total"] == "" and "cat/ (the folder is empty)" in rows["cat"]["status"]
    assert rows["dan"]["status"] == "missing: lesson 1: no folder dan/ was handed in"
    book = {r["student_id"]: r for r in csv.DictReader((grades / "gradebook.csv").open())}
    assert [book[s]["percentage"] for s in ("s1", "s2", "s3", "s4")] == ["100", "0", "0", "0"]
    feedback = (grades / "class" / "ben" / "lesson1" / "feedback.md").read_text()
    assert "Points: **0 of 20**" in feedback and "tests/grading/" not in feedback
    assert "NotImplementedError" in feedback
    assert "Read again: section \"6. What the launcher tells each process\" of " in feedback
    assert "**Missing**" in (grades / "class" / "cat" / "lesson1" / "feedback.md").read_text()

    # ben hands in the reference, 3 days late; re-graded alone, without the roster and the
    # policy given again (the term record remembers them)
    shutil.copy(ROOT / "solutions" / "lesson1" / "exercises.py", klass / "ben" / "lesson1")
    late = term.parse_time("2025-06-03T12:00:00+00:00", "").timestamp()
    os.utime(klass / "ben" / "lesson1" / "exercises.py", (late, late))
    said, second = grade_class("--only", "ben")
    assert "1 submissions, 1 lesson, in " in said
    for student in ("ann", "cat"):  # not graded again: their cells as they were
        assert second["students"][student] == first["students"][student], student
    ben, ben_before = (record["students"]["ben"]["lessons"]["1"] for record in (second, first))
    assert sum(c["earned"] for c in ben.values()) == 20
    assert {(c["status"], c["days_late"], c["penalty"]) for c in ben.values()} == {
        ("late", 3, 0.75)}
    assert all(c["graded_at"] > ben_before[e]["graded_at"] for e, c in ben.items())
    rows = {r["student"]: r for r in csv.DictReader((grades / "class.csv").open())}
    assert list(rows) == ["ann", "ben", "cat", "dan"]  # all students, not only ben
    assert (rows["ben"]["total"], rows["ben"]["after_penalty"], rows["ben"]["percentage"]) == (
        "20", "5", "25")
    assert rows["ben"]["status"] == "graded; lesson 1 late: 3 days, -75% (15 points)"
    assert rows["ann"]["total"] == "20" and rows["ann"]["student_id"] == "s1"  # roster kept
    book = {r["student_id"]: r for r in csv.DictReader((grades / "gradebook.csv").open())}
    assert (book["s2"]["lesson1"], book["s2"]["percentage"]) == ("5", "25")
    assert "late" in (grades / "class" / "ben" / "lesson1" / "feedback.md").read_text()

    # ann's l1_identity breaks (the rank read from LOCAL_RANK: 1 of 6); that exercise alone is
    # re-graded: its cell replaced with the time it was graded, her other cells and ben's kept
    wrong = ROOT / "tests" / "project" / "wrong_submissions" / "lesson1"
    (klass / "ann" / "lesson1" / "exercises.py").write_text(  # the mistake over the reference
        (ROOT / "solutions" / "lesson1" / "exercises.py").read_text() + "\n\n"
        + (wrong / "identity_rank_from_local_rank.py").read_text())
    os.utime(klass / "ann" / "lesson1" / "exercises.py", (on_time, on_time))
    said, third = grade_class("--only", "ann", "--exercise", "l1_identity")
    ann, ann_before = (record["students"]["ann"]["lessons"]["1"] for record in (third, second))
    assert (ann["l1_identity"]["earned"], ann["l1_identity"]["possible"]) == (1, 6), ann
    assert ann["l1_identity"]["graded_at"] > ann_before["l1_identity"]["graded_at"]
    assert {e: c for e, c in ann.items() if e != "l1_identity"} == {
        e: c for e, c in ann_before.items() if e != "l1_identity"}
    assert third["students"]["ben"] == second["students"]["ben"]
    rows = {r["student"]: r for r in csv.DictReader((grades / "class.csv").open())}
    assert (rows["ann"]["total"], rows["ann"]["l1_identity"]) == ("15", "1"), rows["ann"]
    feedback = (grades / "class" / "ann" / "lesson1" / "feedback.md").read_text()
    assert "## l1_identity: 1 of 6 points" in feedback  # the new result, with what it said
    assert "## l1_global_rank: 4 of 4 points" in feedback  # the others, as last graded
    refused = run([PYTHON, "-m", "ddpcourse.course.grading", "class", str(klass), "--exercise",
                   "l3_ddp_step", "--lesson", "1", "--csv", str(grades / "class.csv")], timeout=60)
    assert refused.returncode == 2 and refused.stderr.strip().count("\n") == 0, refused.stderr
    assert "EXERCISE=l3_ddp_step: not one of lesson 1's exercises" in refused.stderr


def test_every_exercise_sends_its_feedback_to_a_section_that_exists():
    """lesson.toml's [readings]: each exercise names a heading its page has, so a student's
    feedback links to the part of the reading that teaches what was lost."""
    missing, broken = [], []
    for lesson in all_lessons():
        for exercise in lesson.exercises:
            if exercise not in lesson.readings:
                missing.append(exercise)
                continue
            page, _, anchor = lesson.readings[exercise].partition("#")
            if not (lesson.folder / page).is_file() or anchor not in anchors(lesson.folder / page):
                broken.append(f"{exercise}: {lesson.readings[exercise]}")
    assert not missing, f"exercises without a [readings] entry: {missing}"
    assert not broken, f"[readings] entries naming no heading: {broken}"
