"""The error index, lessons/errors.md: every entry complete, and every error made on demand.

An entry is a `### ` section of the page (the "Under the hood" section apart): its heading
names the message, as a code span where it has one; a fenced block shows the message as the
learner sees it; a list gives

- **Means:** what it means;
- **Explained in:** a link to the section of the course that explains it (it must resolve,
  file and heading), or **Explained here:** two to four sentences;
- **Reproduce:** `python scripts/experiments/error_index.py NAME` ends in `Class` (and any
  `make` target that shows it), or **Reading only:** why the course cannot run it;
- **Fix:** what to do.

The fast tests read the page and the script as text. The slow one runs every entry of the
script once (`error_index.py all`: a few seconds each, about half a minute in all) and checks
that each failed the way its entry says: the class the page names, and the heading's own short
words (its first code span), not torch's full wording.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from util import PYTHON, ROOT, anchors, machine_load, run

from ddpcourse.course.lessons import all_targets
from ddpcourse.course.readings import MARKDOWN_FENCE, MARKDOWN_HEADING

PAGE = ROOT / "lessons" / "errors.md"
SCRIPT = ROOT / "scripts" / "experiments" / "error_index.py"
COMMAND = "python scripts/experiments/error_index.py"

CODE_SPAN = re.compile(r"`([^`]+)`")
LINK = re.compile(r"\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]*)>?\s*\)")
ITEM = re.compile(r"^- \*\*(Means|Explained in|Explained here|Reproduce|Reading only|Fix):\*\*"
                  r"\s*(.*)$")
REPRODUCE = re.compile(re.escape(COMMAND) + r" ([\w-]+)`(?:(?!error_index\.py).)*?"
                       r"\bends\s+in\s+`(\w+)`")
MAKE = re.compile(r"`make ([a-z][\w-]*)")


def entries() -> list[dict]:
    """Each `### ` section of the page: heading, its code spans, fenced blocks, list items."""
    found, current, in_code, block = [], None, False, []
    for line in PAGE.read_text().splitlines():
        if MARKDOWN_FENCE.match(line):
            if in_code and current is not None:
                current["blocks"].append("\n".join(block))
            in_code, block = not in_code, []
            continue
        if in_code:
            block.append(line)
            continue
        heading = MARKDOWN_HEADING.match(line)
        if heading:
            level, title = len(heading.group(1)), heading.group(2)
            current = None
            if level == 3:
                current = {"title": title, "spans": CODE_SPAN.findall(title), "blocks": [],
                           "items": {}, "last": None}
                found.append(current)
            continue
        if current is None:
            continue
        item = ITEM.match(line)
        if item:
            current["last"] = item.group(1)
            current["items"][item.group(1)] = item.group(2)
        elif line.startswith("  ") and current["last"]:  # an item's continuation line
            current["items"][current["last"]] += " " + line.strip()
        elif not line.strip():
            current["last"] = None
    return found


ENTRIES = entries()
SCRIPT_ENTRIES = re.findall(r'^    Entry\("([\w-]+)"', SCRIPT.read_text(), re.M)


def reproduced() -> list[tuple[str, str, str]]:
    """(the page's entry, the script's entry name, the class it ends in) for each
    reproduction the page names."""
    return [(entry["title"], name, cls) for entry in ENTRIES
            for name, cls in REPRODUCE.findall(entry["items"].get("Reproduce", ""))]


def test_the_page_has_the_entries_the_course_promises():
    titles = " ".join(e["title"] for e in ENTRIES).lower()
    for message in ("timed out waiting", "watchdog", "finished reduction",
                    "mark a variable ready only once", "default process group",
                    "--local-rank", "'distributedDataParallel' object has no attribute".lower(),
                    "address already in use", "childfailederror", "error_file: <n/a>",
                    "detected mismatch between collectives", "duplicate gpu detected",
                    "bus error", "all_gather", "libuv", "peer-to-peer"):
        assert message in titles, f"lessons/errors.md has no entry for {message!r}"


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e["title"][:50])
def test_every_entry_has_a_message_a_meaning_a_section_a_reproduction_and_a_fix(entry):
    items = entry["items"]
    assert entry["blocks"], "the message as the learner sees it, in a fenced block"
    if entry["spans"]:
        shown = entry["spans"][0].lower()
        assert any(shown in block.lower() for block in entry["blocks"]), (
            f"the heading's {shown!r} is not in the message shown")
    assert items.get("Means"), "a **Means:** item"
    assert items.get("Fix"), "a **Fix:** item"
    if "Explained in" in items:
        assert LINK.search(items["Explained in"]), "**Explained in:** links a section"
    else:
        here = items.get("Explained here", "")
        sentences = len(re.findall(r"[.!?](?:[)\"']*)(?=\s|$)", CODE_SPAN.sub("x", here)))
        assert 2 <= sentences <= 4, (
            "no **Explained in:** link, so **Explained here:** explains it in 2-4 sentences")
    if "Reading only" in items:
        assert items["Reading only"], "**Reading only:** says why"
    else:
        assert REPRODUCE.search(items.get("Reproduce", "")), (
            f"**Reproduce:** `{COMMAND} NAME` ends in `Class`, or the label **Reading only:**")


def prose(page: Path) -> str:
    """The page without its fenced blocks (program output is not links)."""
    return re.sub(r"(?ms)^\s*```.*?^\s*```", "", page.read_text())


def test_every_link_of_the_page_resolves_file_and_heading():
    broken = []
    for target in (m.group(2) for m in LINK.finditer(prose(PAGE))):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        page = (PAGE.parent / path).resolve() if path else PAGE
        if not page.exists():
            broken.append(f"{target}: no file {page.relative_to(ROOT)}")
        elif anchor and page.suffix == ".md" and anchor not in anchors(page):
            broken.append(f"{target}: no heading #{anchor} in {page.relative_to(ROOT)}")
    assert not broken, "links that do not resolve:\n" + "\n".join(broken)


def test_every_make_target_and_script_entry_named_exists():
    missing = sorted(set(MAKE.findall(prose(PAGE))) - set(all_targets()))
    assert not missing, f"make targets that no lesson.toml has: {missing}"
    named = [name for _, name, _ in reproduced()]
    assert sorted(set(named) - set(SCRIPT_ENTRIES)) == [], "entries the script does not have"
    assert sorted(set(SCRIPT_ENTRIES) - set(named)) == [], "script entries the page never names"
    assert len(named) == len(set(named)), "a script entry named by two entries"


def test_the_page_is_linked_from_the_readme_and_the_site():
    assert "(lessons/errors.md)" in (ROOT / "README.md").read_text()
    from ddpcourse.course.site import nav_files, site_nav

    assert "lessons/errors.md" in nav_files(site_nav())


@pytest.fixture(scope="module")
def lines():
    """{entry: its one line} from one run of every entry of the script."""
    result = run([PYTHON, str(SCRIPT), "all"], timeout=240)
    found = dict(re.findall(r"^([\w-]+): (.*)$", result.stdout, re.M))
    assert found, f"no entry printed a line ({machine_load()}):\n{result.stdout}\n{result.stderr}"
    return found


@pytest.mark.slow
@pytest.mark.drills
@pytest.mark.timeout(300)
@pytest.mark.parametrize("title, name, cls",
                         [pytest.param(*r, id=r[1]) for r in reproduced()])
def test_every_reproduction_fails_the_way_its_entry_says(lines, title, name, cls):
    assert name in lines, f"{name} printed nothing"
    line = lines[name]
    if line.startswith("skipped: "):
        pytest.skip(f"{name}: {line}")
    assert "UNEXPECTED" not in line, f"{name} did not end as its entry says: {line}"
    assert re.search(rf"\b{cls}\b", line), f"{name}: no {cls} in: {line}"
    spans = CODE_SPAN.findall(title)
    if spans:
        assert spans[0].lower() in line.lower(), f"{name}: no {spans[0]!r} in: {line}"
