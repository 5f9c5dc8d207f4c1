"""Terms before use: no reading leans on a word that only a later lesson explains.

The glossary, lessons/glossary.md, has one `## <term>` heading per term, and under it a line
`- Taught in: [lesson N §x](lessonN/README.md#...)`: the lesson that teaches the term. A reading
of lesson L (lessons/lessonL/README.md, its extra pages lessons/lessonL/*.md except grading.md,
and the markdown cells of notebooks/lessonL.ipynb, each one page) that uses a term taught in a
later lesson must explain it where the page first uses it. What counts, exactly:

- A *use* is the term as a whole word in the page's prose, in any case (a term written with
  capitals, an acronym such as DDP or ZeRO, only in that case), its words joined by a space, a
  hyphen or an underscore (all-reduce, all reduce, all_reduce), in the singular or the plural
  (-s, -es), or one of the spellings its entry lists on its `Also written:` line. Prose is the
  page less its headings, fenced and indented code blocks, inline code spans, HTML tags and
  comments, link targets and bare URLs: `dist.all_reduce(x)` is code, not a use.
- A *paragraph* is a block of lines between blank lines: a table, or a list written without
  blank lines, is one paragraph.
- The page's first use of the term is explained when
  1. that paragraph, or any paragraph before it on the page, links to the term's glossary entry
     (`glossary.md#all-reduce`) or to the section that teaches it (its "Taught in" link); or
  2. that paragraph links to a page of the teaching lesson (`../lesson4/README.md`, any
     section, or its extra pages or notebook); or
  3. that paragraph glosses it: the term itself in bold or italics (`**all-reduce** (a sum
     over all ranks)`), which is how the readings mark the sentence that defines a word.
  Later uses on the same page need nothing more.

BEING_REWRITTEN lists lessons whose readings are being rewritten: their check is skipped, and
says so, until the set is emptied. No torch, no jobs: the pages are read as text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from util import ROOT, anchors, slug

GLOSSARY = ROOT / "lessons" / "glossary.md"
BEING_REWRITTEN: set[int] = set()

# The terms the glossary must have at least (the words the course's first lessons rest on).
REQUIRED = {"node", "process", "world", "world size", "rank", "local rank", "node rank",
            "process group", "collective", "all-reduce", "backend", "store", "rendezvous",
            "launcher", "bucket", "shard", "mesh", "data parallelism", "DDP", "FSDP", "sampler",
            "epoch", "micro-batch", "gradient accumulation", "checkpoint",
            "tensor parallelism", "pipeline parallelism", "context parallelism",
            "expert parallelism"}

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
HTML = re.compile(r"<!--.*?-->|</?[A-Za-z][^>]*>", re.S)
URL = re.compile(r"\b(?:https?|file|ftp)://\S+")


@dataclass(frozen=True)
class Term:
    name: str            # the heading: "all-reduce"
    anchor: str          # its anchor in the glossary: "all-reduce"
    lesson: int          # the lesson that teaches it
    section: Path        # the page of its "Taught in" link
    section_anchor: str  # and the heading there
    pattern: re.Pattern  # a use of it in prose

    def teaches(self, target: Path, anchor: str) -> bool:
        return target == GLOSSARY and anchor == self.anchor or (
            target == self.section and anchor == self.section_anchor)


def spelling(words: str) -> str:
    """A regular expression for one spelling: its words joined by a space, a hyphen or an
    underscore, the last one in the singular or the plural."""
    parts = [re.escape(w) for w in re.split(r"[-_\s]+", words.strip()) if w]
    return r"(?:[-_]|\s+)".join(parts) + r"(?:e?s)?"


def term_pattern(name: str, also: list[str]) -> re.Pattern:
    spellings = [name, *also]
    exact = [s for s in spellings if re.search(r"[A-Z]", s)]  # acronyms keep their case
    loose = [s for s in spellings if not re.search(r"[A-Z]", s)]
    alternatives = [rf"(?-i:{spelling(s)})" for s in exact] + [spelling(s) for s in loose]
    return re.compile(r"(?<![\w])(?:" + "|".join(alternatives) + r")(?![\w])", re.I)


def load_terms(text: str | None = None) -> list[Term]:
    text = GLOSSARY.read_text() if text is None else text
    terms = []
    for entry in re.split(r"^## ", text, flags=re.M)[1:]:
        name, _, body = entry.partition("\n")
        name = name.strip()
        taught = re.search(r"^(?:- )?Taught in: *\[[^\]]*\]\(([^)#\s]+)#([^)\s]+)\)", body, re.M)
        assert taught, f"glossary entry {name!r} has no 'Taught in: [lesson N §x](...#...)' line"
        section = (GLOSSARY.parent / taught.group(1)).resolve()
        lesson = re.search(r"lessons/lesson(\d+)/", section.as_posix())
        assert lesson, f"glossary entry {name!r}: 'Taught in' is not a lesson's page"
        also = re.search(r"^(?:- )?Also written: *(.+?)\.?\s*$", body, re.M)
        spellings = [s.strip() for s in also.group(1).split(",")] if also else []
        terms.append(Term(name, slug(name), int(lesson.group(1)), section, taught.group(2),
                          term_pattern(name, spellings)))
    return terms


def paragraphs(markdown: str):
    """(first line number, prose, [link targets]) of each paragraph: a block of lines between
    blank lines (a table or a list without blank lines is one block), with fenced code,
    indented code (a block whose first line starts with 4 spaces) and headings left out. A
    link keeps its text; its target goes to the list; code spans, HTML and bare URLs become
    spaces."""
    block, start, in_code = [], 0, False

    def done():
        if re.match(r"( {4}|\t)", block[0]):  # indented code: a formula, program output
            return start, "", []
        text = "\n".join(block)
        text = CODE_SPAN.sub(" ", text)
        targets = [m.group(2) for m in LINK.finditer(text)]
        text = LINK.sub(lambda m: f" {m.group(1)} ", text)
        text = URL.sub(" ", HTML.sub(" ", text))
        return start, text, targets

    for n, line in enumerate([*markdown.splitlines(), ""], 1):
        if FENCE.match(line):
            if block:
                yield done()
            block, in_code = [], not in_code
            continue
        if in_code:
            continue
        if HEADING.match(line) or not line.strip():
            if block:
                yield done()
            block = []
            continue
        if not block:
            start = n
        block.append(line)


def resolve(page: Path, target: str) -> tuple[Path, str]:
    path, _, anchor = target.partition("#")
    return ((page.parent / path).resolve() if path else page), anchor


def glossed(text: str, term: Term) -> bool:
    """The term itself in bold or italics: the sentence that defines it."""
    return any(term.pattern.fullmatch(m.group(2).strip())
               for m in re.finditer(r"(\*\*|\*)(?!\s)([^*\n]+?)(?<!\s)\1", text))


def unexplained(markdown: str, page: Path, lesson: int, terms: list[Term]) -> list[str]:
    """Each term of a later lesson that the page first uses without a link or a gloss."""
    later = [t for t in terms if t.lesson > lesson]
    covered: set[str] = set()  # terms whose entry or teaching section an earlier paragraph linked
    seen: set[str] = set()     # terms whose first use has been judged
    found = []
    for line, text, targets in paragraphs(markdown):
        links = [resolve(page, t) for t in targets if not URL.match(t)]
        for term in later:
            if term.name in seen:
                continue
            use = term.pattern.search(text)
            if not use:
                continue
            seen.add(term.name)
            folder = ROOT / "lessons" / f"lesson{term.lesson}"
            notebook = ROOT / "notebooks" / f"lesson{term.lesson}.ipynb"
            to_the_lesson = any(p.parent == folder or p == notebook for p, _ in links)
            if (term.name in covered or to_the_lesson or glossed(text, term)
                    or any(term.teaches(p, a) for p, a in links)):
                continue
            snippet = " ".join(text[max(0, use.start() - 50):use.end() + 50].split())
            found.append(f"{line}: {term.name!r} (taught in lesson {term.lesson}): ...{snippet}...")
        covered |= {t.name for t in later for p, a in links if t.teaches(p, a)}
    return found


def readings(lesson: int):
    """(where, page path, markdown) of every page of a lesson that the check reads."""
    folder = ROOT / "lessons" / f"lesson{lesson}"
    for page in [folder / "README.md", *sorted(p for p in folder.glob("*.md")
                                               if p.name not in ("README.md", "grading.md"))]:
        yield str(page.relative_to(ROOT)), page, page.read_text()
    notebook = ROOT / "notebooks" / f"lesson{lesson}.ipynb"
    if notebook.exists():
        cells = json.loads(notebook.read_text())["cells"]
        markdown = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        yield f"{notebook.relative_to(ROOT)} (markdown cells)", notebook, markdown


LESSONS = sorted(int(p.name[6:]) for p in (ROOT / "lessons").glob("lesson*")
                 if (p / "lesson.toml").exists())


def findings(lesson: int) -> list[str]:
    terms = load_terms()
    return [f"{where}:{problem}" for where, page, markdown in readings(lesson)
            for problem in unexplained(markdown, page, lesson, terms)]


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda n: f"lesson{n}")
def test_a_reading_explains_every_term_a_later_lesson_teaches(lesson):
    if lesson in BEING_REWRITTEN:
        pytest.skip(f"lesson {lesson} is being rewritten")
    found = findings(lesson)
    assert not found, (
        f"lesson {lesson} uses terms that a later lesson teaches, without explaining them; at "
        "the first use, link the glossary (../glossary.md#term) or the teaching lesson, or "
        "gloss the term in bold:\n" + "\n".join(found))


PAGE = ROOT / "lessons" / "lesson2" / "README.md"


@pytest.mark.parametrize("text, refused", [
    # what the check must refuse ...
    ("Only the gradients travel, averaged by an all-reduce.", ["all-reduce"]),
    ("Two All-Reduces per step.", ["all-reduce"]),
    ("The sum comes from all_reduce, written without code marks.", ["all-reduce"]),
    ("Ranks sit on a mesh.", ["mesh"]),
    ("ZeRO-1 splits the optimizer's state.", ["ZeRO"]),
    ("An all-reduce ([lesson 3](../lesson3/README.md)).", ["all-reduce"]),
    ("An all-reduce ([the glossary](../glossary.md#broadcast)).", ["all-reduce"]),
    ("An all-reduce.\n\nSee [the glossary](../glossary.md#all-reduce).", ["all-reduce"]),
    ("An all-reduce, **averaged**.", ["all-reduce"]),
    ("FSDP2 shards the weights.", ["FSDP", "shard"]),
    ("| step | what moves |\n| --- | --- |\n| 1 | an all-reduce |", ["all-reduce"]),
    # ... and what it must let through
    ("Averaged by an [all-reduce](../glossary.md#all-reduce).", []),
    ("See [the glossary](../glossary.md#all-reduce).\n\nLater, two all-reduces.", []),
    ("An all-reduce ([lesson 4](../lesson4/README.md)) averages them.", []),
    ("An all-reduce ([lesson 4, section 2](../lesson4/README.md#all_reduce)).", []),
    ("An **all-reduce** (a sum over all processes) averages them.", []),
    ("Words: an *all-reduce* sums a tensor over the processes.", []),
    ("`dist.all_reduce(x)` sums `x` over the processes.", []),
    ("```python\ndist.all_reduce(x)  # an all-reduce\n```", []),
    ("## The all-reduce\n\nText without the word.", []),
    ("![a figure](../lesson4/figures/all_reduce.png) and [a link](https://x.org/all-reduce)", []),
    ("Zero gradients, and a meshed net.", []),
    ("A formula:\n\n    all-reduce: 2(W-1)/W x n bytes", []),
    ("* first, [FSDP2](../glossary.md#fsdp);\n* then FSDP again, in the same list.", []),
    ("The node, its processes and their ranks.", []),
])
def test_the_check_refuses_a_term_used_before_its_lesson(text, refused):
    found = unexplained(text, PAGE, 2, load_terms())
    assert [re.search(r"'([^']+)'", f).group(1) for f in found] == refused, found


def test_a_term_is_checked_only_before_the_lesson_that_teaches_it():
    terms = load_terms()
    page = ROOT / "lessons" / "lesson4" / "README.md"
    assert unexplained("Averaged by an all-reduce.", page, 4, terms) == []
    assert unexplained("Ranks sit on a mesh.", page, 4, terms) != []


def test_the_glossary_holds_the_course_s_terms_each_taught_by_a_lesson_section():
    terms = load_terms()
    names = [t.name for t in terms]
    assert REQUIRED <= set(names), f"missing from the glossary: {sorted(REQUIRED - set(names))}"
    assert len(names) == len(set(names)), "a term has two entries"
    for term in terms:
        assert term.section.exists(), f"{term.name}: no {term.section}"
        assert term.section_anchor in anchors(term.section), (
            f"{term.name}: 'Taught in' names #{term.section_anchor}, a heading "
            f"{term.section.relative_to(ROOT)} does not have")


def test_every_link_of_the_glossary_and_to_it_resolves():
    """The glossary's links (lessons' sections, figures), and every reading's links into it."""
    entries = anchors(GLOSSARY)
    broken = []
    for _, _, targets in paragraphs(GLOSSARY.read_text()):
        for target in targets:
            path, anchor = resolve(GLOSSARY, target)
            if URL.match(target):
                continue
            if not path.exists() or anchor and anchor not in anchors(path):
                broken.append(f"lessons/glossary.md -> {target}")
    pages = [*(ROOT / "lessons").rglob("*.md"), ROOT / "README.md",
             *(ROOT / "notebooks").glob("*.ipynb")]
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]*glossary\.md[^)\s]*)\)", page.read_text()):
            path, anchor = resolve(page, target)
            if path != GLOSSARY or anchor and anchor not in entries:
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, "links that lead nowhere:\n" + "\n".join(broken)
