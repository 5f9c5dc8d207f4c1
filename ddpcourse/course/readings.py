"""How long each lesson's reading is for a newcomer: its core path and its optional parts.

The core path is every word of lessons/lessonN/README.md outside fenced code blocks and
outside sections whose heading begins "Under the hood" (such a section runs to the next
heading of its level or higher). Extra pages of a lesson (lessons/lessonN/*.md besides the
README and grading.md) are optional by design and are counted apart.

    python -m ddpcourse.course.readings        # a table: lesson, core words, optional words

A lesson's core path is at most CORE_LIMIT words (tests/project/test_readings.py).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OPTIONAL = re.compile(r"under the hood", re.I)
# Every run of letters, digits and underscores is a word, so `torch.distributed` counts two:
# the strictest of the usual counts, so a page within the limit here is within it for any.
WORD = re.compile(r"\w+")
CORE_LIMIT = 2000

MARKDOWN_FENCE = re.compile(r"^\s*(```|~~~)")
MARKDOWN_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")  # level, text
MARKDOWN_LINK = re.compile(
    r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading (mkdocs.yml makes the site's the same): lower case, code
    marks and punctuation dropped, each space a hyphen ("W = 4" gives "w--4")."""
    text = MARKDOWN_LINK.sub(lambda m: m.group(1), heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def headings(page: Path) -> dict[str, str]:
    """{anchor: heading text} of a Markdown page (fenced code left out; repeats get -1, -2)."""
    found: dict[str, str] = {}
    in_code = False
    for line in page.read_text().splitlines():
        if MARKDOWN_FENCE.match(line):
            in_code = not in_code
            continue
        heading = None if in_code else MARKDOWN_HEADING.match(line)
        if heading:
            base = name = slug(heading.group(2))
            n = 0
            while name in found:
                n += 1
                name = f"{base}-{n}"
            found[name] = heading.group(2)
    return found


def split_words(markdown: str) -> tuple[int, int]:
    """(core words, words in "Under the hood" sections) of one page, code blocks left out."""
    core = optional = 0
    in_code = False
    optional_level = 0  # the level of the "Under the hood" heading we are inside; 0: none
    for line in markdown.splitlines():
        if MARKDOWN_FENCE.match(line):
            in_code = not in_code
            continue
        if in_code:
            continue
        heading = MARKDOWN_HEADING.match(line)
        if heading:
            level = len(heading.group(1))
            if optional_level and level <= optional_level:
                optional_level = 0
            if not optional_level and OPTIONAL.match(heading.group(2).strip()):
                optional_level = level
        words = len(WORD.findall(line))
        if optional_level:
            optional += words
        else:
            core += words
    return core, optional


def lesson_words(folder: Path) -> tuple[int, int, int]:
    """(core words, optional words in the README, words on the lesson's extra pages)."""
    core, optional = split_words((folder / "README.md").read_text())
    extra = sum(sum(split_words(page.read_text()))
                for page in folder.glob("*.md") if page.name not in ("README.md", "grading.md"))
    return core, optional, extra


def main() -> None:
    folders = sorted((ROOT / "lessons").glob("lesson*/"), key=lambda p: int(p.name[6:]))
    print(f"{'lesson':<9}{'core':>7}{'under the hood':>16}{'extra pages':>13}")
    for folder in folders:
        core, optional, extra = lesson_words(folder)
        print(f"{folder.name:<9}{core:>7}{optional:>16}{extra:>13}")
    sys.exit(0)


if __name__ == "__main__":
    main()
