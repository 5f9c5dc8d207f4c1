"""What the grader takes from a submission folder (ddpcourse/course/intake.py): its own plain
files, never what a link, a pipe or a hard link leads to, and never more than its limits.

Each shape below is a way a student (or a collected repository: git keeps links) could hand
in the reference, a classmate's work or a file only root can read without writing any code;
each is refused with one line, and a class graded with such folders scores them 0 with that
line in their status, beside an honest student who keeps full marks.
"""

import os
import subprocess
from pathlib import Path

import pytest
import torch
from util import ROOT, grade_class_of

from ddpcourse.course import intake
from ddpcourse.course.gradescope import SubmissionError as UploadError
from ddpcourse.course.gradescope import staged_submission
from ddpcourse.course.sandbox import SubmissionError, from_data, remove_tree

SOLUTION = ROOT / "solutions" / "lesson1" / "exercises.py"
needs_solutions = pytest.mark.skipif(not SOLUTION.exists(),
                                     reason="this copy of the course has no solutions/")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the grader drops to an unprivileged "
                             "reader only as root (CI and Gradescope run as root)")


def lesson_folder(base: Path) -> Path:
    (base / "lesson1").mkdir(parents=True, exist_ok=True)
    return base / "lesson1"


def shaped(base: Path, shape: str, outside: Path) -> Path:
    """A submission folder under `base` of the given shape; `outside` is a folder that is no
    part of any submission (a copy of the reference lives there)."""
    reference = outside / "reference.py"
    if not reference.exists():
        outside.mkdir(parents=True, exist_ok=True)
        reference.write_text(SOLUTION.read_text() if SOLUTION.exists() else "x = 1\n")
    folder = base / shape
    if shape == "file_links_to_the_reference":
        (lesson_folder(folder) / "exercises.py").symlink_to(SOLUTION)
    elif shape == "folder_links_to_the_reference":
        folder.mkdir(parents=True)
        (folder / "lesson1").symlink_to(SOLUTION.parent, target_is_directory=True)
    elif shape == "lessons_links_to_the_reference":
        (folder / "lessons").mkdir(parents=True)
        (folder / "lessons" / "lesson1").symlink_to(SOLUTION.parent, target_is_directory=True)
    elif shape == "relative_link_out":
        target = os.path.relpath(reference, lesson_folder(folder))
        (folder / "lesson1" / "exercises.py").symlink_to(target)
    elif shape == "helper_module_links_out":
        (lesson_folder(folder) / "exercises.py").write_text("from helper import *\n")
        (folder / "lesson1" / "helper.py").symlink_to(reference)
    elif shape == "hard_link":
        os.link(reference, lesson_folder(folder) / "exercises.py")
    elif shape == "pipe":
        os.mkfifo(lesson_folder(folder) / "exercises.py")
    elif shape == "too_large":
        (lesson_folder(folder) / "exercises.py").write_text(
            "x = 1\n" + "#" * (intake.MAX_FILE_BYTES + 1) + "\n")
    elif shape == "too_many_files":
        for i in range(intake.MAX_FILES + 1):
            (lesson_folder(folder) / f"part{i}.py").write_text("x = 1\n")
        (folder / "lesson1" / "exercises.py").write_text("x = 1\n")
    elif shape == "root_only_file":
        (lesson_folder(folder) / "exercises.py").write_text("x = 1\n")
        os.chmod(folder / "lesson1" / "exercises.py", 0o600)
    else:
        raise ValueError(shape)
    return folder


REFUSED = {  # shape -> words its one-line reason must hold
    "file_links_to_the_reference": "lesson1/exercises.py is a symbolic link",
    "folder_links_to_the_reference": "lesson1 is a symbolic link",
    "lessons_links_to_the_reference": "lessons/lesson1 is a symbolic link",
    "relative_link_out": "lesson1/exercises.py is a symbolic link",
    "helper_module_links_out": "lesson1/helper.py is a symbolic link",
    "hard_link": "hard link",
    "pipe": "is a pipe",
    "too_large": "more than",
    "too_many_files": "more than",
}


@pytest.mark.parametrize("shape", REFUSED)
def test_a_folder_that_is_not_its_own_plain_files_is_refused_in_one_line(tmp_path, shape):
    folder = shaped(tmp_path / "class", shape, tmp_path / "elsewhere")
    with pytest.raises(intake.Refused) as refused:
        intake.take(folder, 1)
    assert REFUSED[shape] in str(refused.value) and "\n" not in str(refused.value)


@as_root
def test_a_file_only_root_could_read_is_not_read(tmp_path):
    folder = shaped(tmp_path / "class", "root_only_file", tmp_path / "elsewhere")
    with pytest.raises(intake.Refused, match="cannot be read by other users"):
        intake.take(folder, 1)


def test_the_submission_folder_itself_may_not_be_a_link(tmp_path):
    honest = lesson_folder(tmp_path / "alice")
    (honest / "exercises.py").write_text("x = 1\n")
    (honest / "helper.py").write_text("y = 2\n")
    (honest / "notes.txt").write_text("never read\n")
    assert intake.take(tmp_path / "alice", 1) == {"exercises.py": b"x = 1\n",
                                                  "helper.py": b"y = 2\n"}
    (tmp_path / "mallory").symlink_to(tmp_path / "alice", target_is_directory=True)
    with pytest.raises(intake.Refused, match="mallory is a symbolic link"):
        intake.take(tmp_path / "mallory", 1)
    with pytest.raises(intake.Missing):
        intake.take(tmp_path / "alice", 3)


def test_every_layout_a_student_uses_is_taken(tmp_path):
    for layout, place in (("lesson1", "lesson1/"), ("lessons/lesson1", "lessons/lesson1/")):
        folder = tmp_path / place.replace("/", "_")
        (folder / layout).mkdir(parents=True)
        (folder / layout / "exercises.py").write_text(f"# {layout}\n")
        assert intake.take_placed(folder, 1) == ({"exercises.py": f"# {layout}\n".encode()},
                                                 place)
    (tmp_path / "loose").mkdir()
    (tmp_path / "loose" / "exercises.py").write_text("# alone\n")
    assert intake.take_placed(tmp_path / "loose", 1, loose=True)[1] == ""
    with pytest.raises(intake.Missing):
        intake.take(tmp_path / "loose", 1)


def test_gradescope_refuses_an_upload_of_links_with_its_reason(tmp_path):
    upload = tmp_path / "submission"
    upload.mkdir()
    (upload / "exercises.py").symlink_to(SOLUTION)
    with pytest.raises(UploadError, match="0 points: exercises.py is a symbolic link"):
        staged_submission(upload, 1, tmp_path / "stage")


def test_a_tensor_view_larger_than_its_storage_is_refused_before_it_is_touched():
    """torch.load(weights_only=True) rebuilds a view of 64 KiB of storage that stands for 1 GiB
    of elements; the judge refuses it instead of materialising it."""
    import io

    for view in (torch.zeros(16384).as_strided((1 << 28,), (0,)),
                 torch.zeros(16384).as_strided((4096, 4096), (1, 1))):
        buffer = io.BytesIO()
        torch.save({"value": view}, buffer)
        assert len(buffer.getvalue()) < 100_000
        loaded = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
        with pytest.raises(SubmissionError, match="strides"):
            from_data(loaded)
    plain = {"t": torch.arange(12.0).reshape(3, 4).t(), "slice": torch.arange(6)[2:]}
    assert torch.equal(from_data(plain)["t"], plain["t"])


def test_no_folder_shape_defeats_the_clean_up(tmp_path):
    """A chain of folders deeper than shutil.rmtree's recursion, and a folder without
    permissions, are removed all the same."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    folder = os.open(scratch, os.O_RDONLY)
    for _ in range(1200):  # deeper than shutil.rmtree's recursion can go
        os.mkdir("x", dir_fd=folder)
        deeper = os.open("x", os.O_RDONLY, dir_fd=folder)
        os.close(folder)
        folder = deeper
    os.close(folder)
    (scratch / "shut").mkdir()
    (scratch / "shut" / "f").write_text("x")
    os.chmod(scratch / "shut", 0)
    try:
        remove_tree(scratch)
        assert not os.path.lexists(scratch)
    finally:  # pytest's own clean-up of old temporary folders would trip over the chain
        subprocess.run(["rm", "-rf", str(scratch)], check=False)


@pytest.mark.slow
@pytest.mark.grading_heavy
@needs_solutions
@pytest.mark.timeout(300)
def test_a_class_with_linked_folders_scores_them_zero_with_the_reason(tmp_path):
    klass = tmp_path / "class"
    (lesson_folder(klass / "honest") / "exercises.py").write_text(SOLUTION.read_text())
    shaped(klass, "file_links_to_the_reference", tmp_path / "elsewhere")
    (klass / "zz_copies_honest").symlink_to(klass / "honest", target_is_directory=True)
    students = grade_class_of(1, klass, tmp_path / "grades", timeout=280)
    assert students["honest"]["total"] == 20 and students["honest"]["status"] == "graded"
    for name, why in (("file_links_to_the_reference", "lesson1/exercises.py is a symbolic link"),
                      ("zz_copies_honest", "zz_copies_honest is a symbolic link")):
        assert students[name]["total"] == 0, students[name]
        assert students[name]["status"] == f"graded; lesson 1 refused: {why}: the grader " \
                                           "follows no link", students[name]
