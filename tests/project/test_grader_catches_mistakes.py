"""Wrong-but-plausible submissions lose the points their mistake is worth: no more, no less.

Each file in wrong_submissions/lessonN/ replaces one function of the reference solution. Its
docstring opens with the exercise and the exact score it must get, e.g.
`l4_ring_allreduce: 4 of 10.`; a few are right answers written another way, which must keep
full marks. The files of a lesson are packed into as few submission folders as possible,
at most one per exercise in a folder, and every exercise a folder leaves alone must keep
its full marks: so a mistake costs its own exercise only. A file named
*_beside_the_reference.py (a mistake in a function another exercise builds on) gets a folder
of its own, so the exercise that builds on it is the reference's and must keep full marks.

To stay fast, each grading worker is launched once per world size for all the folders of a
lesson (--submissions A,B,...), and then the real grading tests score each folder from its
share of those jobs (COURSE_GRADING_JOBS: see ddpcourse/course/jobs.py) instead of launching
their own: ddpcourse/course/batched_jobs.py, which `make grade-class` uses too.
"""

import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from util import PYTHON, ROOT, by_lesson, group_fails, run

from ddpcourse.course.batched_jobs import launch_jobs_for_all
from ddpcourse.course.grading import summarise
from ddpcourse.course.lessons import exercise_markers
from ddpcourse.course.sandbox_child import FORM_TRIES

pytestmark = pytest.mark.skipif(not (ROOT / "solutions").is_dir(),
                                reason="this copy of the course has no solutions/")

WRONG = ROOT / "tests" / "project" / "wrong_submissions"
HEADER = re.compile(r'^"""(l\d+_\w+): (\d+) of (\d+)\.')


ENDS_ITS_PROCESS = "_ends_its_process.py"  # a mistake that ends the process it runs in
# A mistake in a function another exercise's reference builds on (global_rank, which
# rank_layout calls), graded in a folder of its own beside the reference's every other
# function: the exercise that builds on it, graded with the grader's own version of it
# (tests/grading/README.md), keeps full marks.
BESIDE_THE_REFERENCE = "_beside_the_reference.py"


def mistakes(lesson, which=lambda path: True):
    """exercise -> [(file, points earned, points possible)] of the files `which` takes, in
    name order."""
    found = {}
    for path in sorted(p for p in (WRONG / f"lesson{lesson}").glob("*.py") if which(p)):
        header = HEADER.match(path.read_text())
        assert header, f"{path.name} must open with '\"\"\"<exercise>: <n> of <m>.'"
        exercise, earned, possible = header.group(1), int(header.group(2)), int(header.group(3))
        found.setdefault(exercise, []).append((path, earned, possible))
    return found


def build_folders(lesson, base, which):
    """Folder k holds the k-th mistake (of the files `which` takes) of every exercise that has
    one, and each file named *_beside_the_reference.py a folder of its own after them;
    returns [(folder, {exercise: (earned, possible, file name)})]."""
    solution = (ROOT / "solutions" / f"lesson{lesson}" / "exercises.py").read_text()
    by_exercise = mistakes(lesson, lambda path: which(path) and
                           not path.name.endswith(BESIDE_THE_REFERENCE))
    packs = [{ex: v[k] for ex, v in by_exercise.items() if k < len(v)}
             for k in range(max((len(v) for v in by_exercise.values()), default=0))]
    packs += [{ex: found} for ex, files in mistakes(lesson, lambda path: which(path) and
                                                    path.name.endswith(BESIDE_THE_REFERENCE)
                                                    ).items() for found in files]
    folders = []
    for k, chosen in enumerate(packs):
        folder = base / f"lesson{lesson}_{k}"
        (folder / f"lesson{lesson}").mkdir(parents=True)
        (folder / f"lesson{lesson}" / "exercises.py").write_text(solution + "".join(
            f"\n\n# --- from {path.name}\n{path.read_text()}" for path, _, _ in chosen.values()))
        folders.append((folder, {ex: (earned, possible, path.name)
                                 for ex, (path, earned, possible) in chosen.items()}))
    return folders


def grade(lesson, folder, base):
    """The real grading of one folder (its jobs replayed): points per exercise, and the
    grading's report (for a failure message)."""
    results = base / "results" / f"{folder.name}.json"
    report = run([PYTHON, "-m", "pytest", f"tests/grading/test_lesson{lesson}.py", "-q",
                  "--tb=line", "-p", "no:cacheprovider"],
                 env={"COURSE_SUBMISSION": str(folder), "COURSE_RESULTS": str(results),
                      "COURSE_GRADING_JOBS": str(base / "jobs" / folder.name)}, timeout=200)
    assert results.exists(), report.stdout[-3000:] + report.stderr[-2000:]
    tests = json.loads(results.read_text())["tests"]
    scores = {name: (s["earned"], s["possible"]) for name, s in summarise(tests).items()}
    return scores, report.stdout


LESSONS = sorted(int(p.name[len("lesson"):]) for p in WRONG.glob("lesson*"))


def test_every_graded_exercise_has_wrong_submissions_that_cost_points():
    on_file = {}
    for lesson in LESSONS:
        on_file.update(mistakes(lesson))
    assert set(on_file) == set(exercise_markers()), "exercises without wrong submissions"
    for exercise, found in on_file.items():
        assert any(e < p for _, e, p in found), f"every {exercise} file keeps full marks"
        assert len({p for _, _, p in found}) == 1, f"{exercise}: files disagree on its points"


@pytest.mark.slow
@pytest.mark.timeout(400)
# lessons 6-8's jobs restart, kill and shard (a minute each on a loaded machine), and lesson 4's
# checks are relayed jobs per folder, not shared launches (43 s): make test-grading
@pytest.mark.parametrize("lesson", by_lesson(LESSONS, apart=(4, 6, 7, 8)))
def test_each_mistake_costs_its_own_exercise_what_it_is_worth(tmp_path, lesson):
    costs_only_its_exercise(lesson, tmp_path, lambda path: not path.name.endswith(
        ENDS_ITS_PROCESS))


@pytest.mark.slow
@pytest.mark.timeout(400)
# Each stops every job of its lesson and has it run again without its check: make test-grading
@pytest.mark.parametrize("lesson", by_lesson(
    [n for n in LESSONS if list((WRONG / f"lesson{n}").glob(f"*{ENDS_ITS_PROCESS}"))],
    apart=range(1, 9)))
def test_a_mistake_that_ends_its_process_costs_only_its_exercise(tmp_path, lesson):
    """os._exit in one function (as a crash, an abort or a kill for memory): the check that
    ran it is lost, every other exercise keeps its points (ddpcourse/course/job_checks.py)."""
    costs_only_its_exercise(lesson, tmp_path, lambda path: path.name.endswith(ENDS_ITS_PROCESS),
                            every_exercise=False)


def costs_only_its_exercise(lesson, tmp_path, which, every_exercise=True):
    """The files of `lesson` that `which` takes, packed into folders and graded: each scores
    exactly what its header says and every exercise its folder leaves alone full marks."""
    folders = build_folders(lesson, tmp_path, which)
    relaunches = []  # a folder whose code stops a job is graded alone: right, but slower
    not_graded = launch_jobs_for_all(
        lesson, {folder: tmp_path / "jobs" / folder.name for folder, _ in folders},
        tmp_path / "work", say=relaunches.append)
    assert not not_graded, (not_graded, relaunches)
    with ThreadPoolExecutor(2) as pool:  # the grading runs mostly import torch: two at once
        graded = list(pool.map(lambda f: grade(lesson, f[0], tmp_path), folders))
    problems = []
    for (folder, expected), (got, report) in zip(folders, graded, strict=True):
        assert set(expected) <= set(got), (expected, got)
        before = len(problems)
        for exercise, (earned, possible) in got.items():
            if exercise in expected:
                want_earned, want_possible, name = expected[exercise]
                if (earned, possible) != (want_earned, want_possible):
                    problems.append(f"{name}: {exercise} scored {earned:g} of {possible:g}, "
                                    f"expected {want_earned} of {want_possible}")
            elif earned != possible:
                problems.append(f"{folder.name} ({', '.join(n for *_, n in expected.values())})"
                                f": {exercise}, left alone, scored {earned:g} of {possible:g}")
        if len(problems) > before:
            problems.append(f"grading of {folder.name}:\n{report[-2500:]}")
    assert not problems, "\n".join(problems + relaunches)
    if not every_exercise:
        return
    # Every exercise of the lesson has mistakes on file, and at least one that costs points.
    exercises = set(graded[0][0])
    by_exercise = mistakes(lesson, which)
    assert set(by_exercise) == exercises
    assert all(any(e < p for _, e, p in v) for v in by_exercise.values()), by_exercise


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_batched_job_whose_own_group_fails_is_launched_again(tmp_path):
    """The project's batched grading launches a submission's job alone when it stops; when
    that job's own group still fails to form after every try (gloo once failed to connect in
    CI), it is launched once more from that check, so a right answer keeps its marks."""
    folder = tmp_path / "right"
    marks = group_fails(folder / "lesson1", times=FORM_TRIES, every_launch=False)
    said = []
    try:
        assert not launch_jobs_for_all(1, {folder: tmp_path / "jobs" / folder.name},
                                       tmp_path / "work", say=said.append)
    finally:
        for mark in marks():
            mark.unlink()
    assert any("its process group never formed" in line for line in said), said
    # its share is the second launch's, which graded it: every check observed on every rank
    replay = tmp_path / "jobs" / folder.name
    assert json.loads((replay / "lesson1_W4.json").read_text())["returncode"] == 0
    observed = torch.load(replay / "lesson1_W4.pt", weights_only=True)
    assert set(observed) == {"identity", "node_groups"}
    assert all(len(ranks) == 4 and all("data" in r for r in ranks)
               for ranks in observed.values()), observed
