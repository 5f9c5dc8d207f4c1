"""The course as a static website: `make site` writes it into build/site.

The pages are the files GitHub shows, unchanged: the README (the home page, with the syllabus),
every lesson's readings and grading.md, the glossary, the appendix, the instructor's guide to
the grader (tests/grading/README.md) and CONTRIBUTING.md. They are copied into build/site-src at
the same relative paths, with every local file they link to (figures, the sources the appendix
points at), so their relative links work on the site as they do on GitHub; MkDocs turns
README.md into its folder's index.html and every link to a .md file into a link to its page.
Each notebook is executed from the repository root, as `make notebooks` and the tests run it,
and the executed copy, outputs included, becomes a page through mkdocs-jupyter.

    python -m ddpcourse.course.site [--no-execute]   lay out build/site-src (--no-execute: the
                                                     notebooks without outputs, in seconds),
                                                     then build build/site
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import yaml
from nbclient import NotebookClient

from ddpcourse.course.lessons import all_lessons

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"
SOURCE = BUILD / "site-src"
SITE = BUILD / "site"
CONFIG = BUILD / "mkdocs.yml"
NOTEBOOK_TIMEOUT = 600  # seconds a cell may run

LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)


def is_local(target: str) -> bool:
    return not re.match(r"[a-z]+:", target) and not target.startswith(("#", "/"))


def linked_files(page: Path) -> list[Path]:
    """The files of the repository that a Markdown page links to."""
    targets = (t.split("#")[0] for t in LINK.findall(page.read_text()) if is_local(t))
    found = [(page.parent / t).resolve() for t in targets if t]
    return [path for path in found if path.is_file() and ROOT in path.parents]


def copy_into_source(path: Path) -> None:
    destination = SOURCE / path.relative_to(ROOT)
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, destination)


def page_url(target: str) -> str:
    """Where a link to a .md file goes on the site: README.md is its folder's index.html."""
    path, hash_, anchor = target.partition("#")
    if path.endswith(".md"):
        folder, slash, name = path.rpartition("/")
        path = folder + slash + ("index.html" if name == "README.md" else name[:-3] + ".html")
    return path + hash_ + anchor


def without_build_paths(nb: nbformat.NotebookNode, root: Path = ROOT) -> None:
    """Outputs as a reader's own run would show them: the building machine's course folder
    left out of every path (/home/ci/course/.venv/bin/python is .venv/bin/python there)."""
    def relative(text: str) -> str:
        return text.replace(f"{root}/", "").replace(str(root), ".")

    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if "text" in output:
                output["text"] = relative(output["text"])
            for kind, value in output.get("data", {}).items():
                if kind.startswith("text/") and isinstance(value, str):
                    output["data"][kind] = relative(value)
            if "traceback" in output:
                output["traceback"] = [relative(line) for line in output["traceback"]]


def notebook_page(path: Path, execute: bool) -> nbformat.NotebookNode:
    """The notebook, run from the repository root (a cell that raises stops the build)."""
    nb = nbformat.read(path, as_version=4)
    if execute:
        # store_widget_state=False: widget state would make the page load the widgets'
        # scripts from a CDN.
        NotebookClient(nb, timeout=NOTEBOOK_TIMEOUT, kernel_name="python3",
                       store_widget_state=False,
                       resources={"metadata": {"path": str(ROOT)}}).execute()
        without_build_paths(nb)
    for cell in nb.cells:
        # mkdocs-jupyter leaves a notebook's links as they are: point those to readings at
        # their pages, as MkDocs does in the readings.
        if cell.cell_type == "markdown":
            cell.source = LINK.sub(
                lambda m: f"]({page_url(m.group(1)) if is_local(m.group(1)) else m.group(1)})",
                cell.source)
    return nb


def lesson_nav(lesson) -> dict:
    folder = lesson.folder.relative_to(ROOT).as_posix()
    extra = sorted(p.name for p in lesson.folder.glob("*.md")
                   if p.name not in ("README.md", "grading.md"))
    pages = [f"{folder}/README.md", *(f"{folder}/{name}" for name in extra)]
    notebook = ROOT / "notebooks" / f"lesson{lesson.number}.ipynb"
    if notebook.exists():
        pages.append({f"Lesson {lesson.number} notebook": notebook.relative_to(ROOT).as_posix()})
    if (lesson.folder / "grading.md").exists():
        pages.append({"Grading": f"{folder}/grading.md"})
    return {f"{lesson.number}. {lesson.title}": pages}


def site_nav() -> list:
    """The nav: the home page, each lesson's pages, the glossary, the appendix and the
    instructor's doc."""
    return [{"Home": "README.md"}, *(lesson_nav(lesson) for lesson in all_lessons()),
            {"Glossary": "lessons/glossary.md"},
            {"Error messages": "lessons/errors.md"},
            {"Appendix": "lessons/appendix.md"},
            {"Instructors: the grader": "tests/grading/README.md"},
            {"Contributing": "CONTRIBUTING.md"}]


def nav_files(nav) -> list[str]:
    """Every file the nav names, in its order."""
    if isinstance(nav, str):
        return [nav]
    entries = nav.values() if isinstance(nav, dict) else nav
    return [name for entry in entries for name in nav_files(entry)]


def lay_out(execute: bool = True) -> list[Path]:
    """Copy the nav's pages and what they link to into build/site-src, executing the
    notebooks; write build/mkdocs.yml."""
    nav = site_nav()
    sources = [ROOT / name for name in nav_files(nav)]
    shutil.rmtree(SOURCE, ignore_errors=True)
    for source in sources:
        if source.suffix == ".ipynb":
            started = time.monotonic()
            destination = SOURCE / source.relative_to(ROOT)
            destination.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(notebook_page(source, execute), destination)
            if execute:
                print(f"executed {source.relative_to(ROOT)} in "
                      f"{time.monotonic() - started:.0f} s", flush=True)
        else:
            copy_into_source(source)
            for linked in linked_files(source):
                copy_into_source(linked)
    config = {"INHERIT": "../mkdocs.yml", "docs_dir": SOURCE.name, "site_dir": SITE.name,
              "nav": nav}
    CONFIG.write_text("# Written by ddpcourse/course/site.py: `make site` rewrites it.\n"
                      + yaml.safe_dump(config, sort_keys=False))
    return sources


def build() -> int:
    # Not --quiet: MkDocs would then not count the warnings that --strict turns into errors.
    # NO_MKDOCS_2_WARNING: Material for MkDocs' banner about MkDocs 2 and its own end of life,
    # on every build; requirements-site.txt records both.
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "--config-file", str(CONFIG)], cwd=ROOT,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1")).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the course's website into build/site.")
    parser.add_argument("--no-execute", action="store_true",
                        help="render the notebooks without running them (no outputs)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    sources = lay_out(execute=not args.no_execute)
    rc = build()
    if rc == 0:
        pages = len(list(SITE.rglob("*.html")))
        print(f"{SITE.relative_to(ROOT)}: {pages} pages from {len(sources)} sources in "
              f"{time.monotonic() - started:.0f} s; to read it: "
              f"python3 -m http.server -d {SITE.relative_to(ROOT)}, or open "
              f"{SITE.relative_to(ROOT)}/index.html")
    return rc


if __name__ == "__main__":
    sys.exit(main())
