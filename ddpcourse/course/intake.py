"""Taking in a submission's files: the one place the grader reads what a student handed in.

Every way of submitting (`make grade SUBMISSION=`, `grade-class`, its SLURM array, Gradescope,
GitHub Classroom) ends here. The grader opens the folder it was given, the last step of that
path not followed if it is a link; everything below is read by another process that runs as
an unprivileged user of its own (when the grader is root), so a file only root could read
stays unread. That reader takes a lesson's `*.py` files from `lessonN/` or
`lessons/lessonN/` (or, for a single-lesson upload, the folder itself) and refuses, with
one line saying why:
  - a link anywhere on the way (no step is followed: O_NOFOLLOW, one folder at a time);
  - anything that is not a plain file (a pipe, a device, a socket), or a file with another
    name elsewhere (a hard link), or one on another file system (a mount);
  - more than MAX_FILES files, a file over MAX_FILE_BYTES, or over MAX_TOTAL_BYTES in all.
Files of other kinds of name (notes, data) are never opened.

    python -m ddpcourse.course.intake FOLDER --lesson N    # what the grader would take
"""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

MAX_FILE_BYTES = 1 << 20
MAX_TOTAL_BYTES = 4 << 20
MAX_FILES = 32
INTAKE_UID = 61999          # the reader's own user: no grader, no sandbox, no student
READ_TIMEOUT = 30.0


class Missing(Exception):
    """The folder holds no exercises of this lesson."""


class Refused(Exception):
    """The folder holds something the grader will not read: the message says what and why."""


def _open_dir(name: str, dir_fd: int, shown: str) -> int:
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                       dir_fd=dir_fd)
    except OSError as error:
        if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            raise Refused(f"{shown} is a symbolic link: the grader follows no link") from None
        if isinstance(error, PermissionError):
            raise Refused(f"{shown} cannot be read by other users (the grader reads a "
                          "submission as an unprivileged user: chmod -R a+rX it)") from None
        raise


def _entry(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _lesson_folder(root_fd: int, lesson: int, loose: bool) -> tuple[int, str]:
    """(a descriptor of the folder holding the lesson's exercises.py, its name as shown)."""
    device = os.fstat(root_fd).st_dev
    for parts in ((f"lesson{lesson}",), ("lessons", f"lesson{lesson}"), *([()] if loose else [])):
        fd, shown = os.dup(root_fd), ""
        try:
            for part in parts:
                shown = f"{shown}{part}/"
                found = _entry(part, fd)
                if found is None:
                    break
                if not stat.S_ISDIR(found.st_mode) and not stat.S_ISLNK(found.st_mode):
                    break
                inner = _open_dir(part, fd, shown.rstrip("/"))
                os.close(fd)
                fd = inner
                if os.fstat(fd).st_dev != device:
                    raise Refused(f"{shown.rstrip('/')} is another file system mounted there")
            else:
                if _entry("exercises.py", fd) is not None:
                    return fd, shown
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    where = f"lesson{lesson}/exercises.py or lessons/lesson{lesson}/exercises.py"
    raise Missing(f"no {where}" + (" or exercises.py" if loose else ""))


def _read_file(name: str, dir_fd: int, shown: str, device: int) -> bytes:
    found = _entry(name, dir_fd)
    if found is None:
        raise Refused(f"{shown} vanished while it was read")
    kinds = {stat.S_ISLNK: "a symbolic link: the grader follows no link",
             stat.S_ISFIFO: "a pipe", stat.S_ISSOCK: "a socket",
             stat.S_ISCHR: "a device", stat.S_ISBLK: "a device", stat.S_ISDIR: "a folder"}
    for is_kind, what in kinds.items():
        if is_kind(found.st_mode):
            raise Refused(f"{shown} is {what}")
    if not stat.S_ISREG(found.st_mode):
        raise Refused(f"{shown} is not a plain file")
    if found.st_nlink != 1:
        raise Refused(f"{shown} is a hard link ({found.st_nlink} names for one file): "
                      "hand in a copy")
    if found.st_dev != device:
        raise Refused(f"{shown} is on another file system")
    if found.st_size > MAX_FILE_BYTES:
        raise Refused(f"{shown} is {found.st_size} bytes, more than {MAX_FILE_BYTES}")
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                     | os.O_CLOEXEC, dir_fd=dir_fd)
    except PermissionError:
        raise Refused(f"{shown} cannot be read by other users (the grader reads a "
                      "submission as an unprivileged user: chmod -R a+rX it)") from None
    with os.fdopen(fd, "rb") as f:
        opened = os.fstat(f.fileno())
        if (opened.st_ino, opened.st_dev) != (found.st_ino, found.st_dev) or \
                not stat.S_ISREG(opened.st_mode):
            raise Refused(f"{shown} was replaced while it was read")
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise Refused(f"{shown} is more than {MAX_FILE_BYTES} bytes")
    return data


def read_lesson(root_fd: int, lesson: int, loose: bool = False) -> tuple[dict[str, bytes], str]:
    """({file name: bytes} of the lesson's *.py files under the folder open as root_fd, the
    folder they are in: "lessonN/", "lessons/lessonN/" or "" for the folder itself).
    Raises Missing or Refused. Runs in the reader process."""
    folder, shown = _lesson_folder(root_fd, lesson, loose)
    try:
        device = os.fstat(folder).st_dev
        names = sorted(entry.name for entry in os.scandir(folder)
                       if entry.name.endswith(".py"))
        if len(names) > MAX_FILES:
            raise Refused(f"{shown or './'} holds {len(names)} .py files, more than {MAX_FILES}")
        files, total = {}, 0
        for name in names:
            files[name] = _read_file(name, folder, shown + name, device)
            total += len(files[name])
            if total > MAX_TOTAL_BYTES:
                raise Refused(f"{shown or './'}: its .py files are more than "
                              f"{MAX_TOTAL_BYTES} bytes in all")
        return files, shown
    finally:
        os.close(folder)


def open_submission(folder: Path) -> int:
    """The submission folder, opened by the grader: the path up to it is the instructor's
    (followed), the folder itself must not be a link."""
    folder = Path(folder).expanduser()
    parent = os.open(folder.absolute().parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return _open_dir(folder.absolute().name, parent, folder.name)
    except FileNotFoundError:
        raise Missing(f"{folder} does not exist") from None
    except NotADirectoryError:
        raise Missing(f"{folder} is not a folder") from None
    finally:
        os.close(parent)


def take(folder: Path, lesson: int, loose: bool = False) -> dict[str, bytes]:
    """{file name: bytes} of `lesson`'s *.py files in a submission folder, read as above.
    Raises Missing (nothing of this lesson there) or Refused (the one-line reason)."""
    return take_placed(folder, lesson, loose)[0]


def take_placed(folder: Path, lesson: int, loose: bool = False) -> tuple[dict[str, bytes], str]:
    """take(), and the folder under `folder` the files were in (see read_lesson)."""
    root_fd = open_submission(folder)
    try:
        if os.geteuid() != 0:  # the grader's own user already: nothing to drop
            return read_lesson(root_fd, lesson, loose)
        return _read_as_reader(root_fd, lesson, loose)
    finally:
        os.close(root_fd)


def _read_as_reader(root_fd: int, lesson: int, loose: bool) -> tuple[dict[str, bytes], str]:
    """read_lesson in a process that becomes INTAKE_UID before it reads anything, handed
    only the folder's descriptor (started as root: the interpreter may live where only root
    can reach)."""
    source = Path(__file__).read_text()
    try:
        reader = subprocess.run(
            [sys.executable, "-I", "-S", "-c", source, "--read-fd", str(root_fd),
             "--lesson", str(lesson), *(["--loose"] if loose else [])],
            pass_fds=(root_fd,), cwd="/", env={}, stdin=subprocess.DEVNULL, capture_output=True,
            timeout=READ_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise Refused(f"reading it took more than {READ_TIMEOUT:g} s") from None
    try:
        answer = json.loads(reader.stdout)
    except ValueError:
        raise RuntimeError("the grader's file reader failed: "
                           + reader.stderr.decode(errors="replace")[-500:]) from None
    if "missing" in answer:
        raise Missing(answer["missing"])
    if "refused" in answer:
        raise Refused(answer["refused"])
    return ({name: base64.b64decode(data) for name, data in answer["files"].items()},
            answer["place"])


def _reader_main(argv: list[str]) -> int:
    os.setgroups([])
    os.setresgid(INTAKE_UID, INTAKE_UID, INTAKE_UID)
    os.setresuid(INTAKE_UID, INTAKE_UID, INTAKE_UID)
    fd = int(argv[argv.index("--read-fd") + 1])
    lesson = int(argv[argv.index("--lesson") + 1])
    try:
        files, place = read_lesson(fd, lesson, "--loose" in argv)
        answer = {"files": {n: base64.b64encode(d).decode() for n, d in files.items()},
                  "place": place}
    except Missing as error:
        answer = {"missing": str(error)}
    except Refused as error:
        answer = {"refused": str(error)}
    except OSError as error:
        answer = {"refused": f"cannot be read: {error.strerror}"}
    sys.stdout.write(json.dumps(answer))
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="What the grader would take from a folder.")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--lesson", type=int, required=True)
    args = parser.parse_args(argv)
    try:
        files = take(args.folder, args.lesson)
    except (Missing, Refused) as error:
        print(f"{args.folder}: lesson {args.lesson}: {error}", file=sys.stderr)
        return 1
    for name, data in files.items():
        print(f"{name}: {len(data)} bytes")
    return 0


if __name__ == "__main__":
    if "--read-fd" in sys.argv:
        sys.exit(_reader_main(sys.argv))
    sys.exit(main())
