"""MkDocs hooks for the course's website (mkdocs.yml names this file; `make site` builds it).

Two fixes to the notebook pages mkdocs-jupyter renders:

- Its template brings MathJax (with no URL given, an empty <script src="">) and a script that
  would import mermaid.js from a CDN. The notebooks use neither math nor mermaid diagrams, and
  the site fetches nothing from the network when a page is read, so both go.
- Its table of contents slugs the headings its own way, so an entry for a heading with code in
  it ("4. A real job: `scripts/lesson1_whoami.py` under torchrun") points at an id the page
  does not have. The table of contents is rebuilt from the headings as the page has them.

tests/site/test_site.py fails if a page still refers to the network or an anchor is missing.
"""

from __future__ import annotations

import re

from mkdocs.structure.toc import get_toc

MATHJAX = re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->", re.S)
SCRIPT = re.compile(r"<script\b[^>]*>.*?</script>", re.S)
HEADING = re.compile(r'<h([1-6]) id="([^"]+)"[^>]*>(.*?)</h\1>', re.S)


def headings_as_toc_tokens(html: str) -> list[dict]:
    """The page's headings, nested by level, as mkdocs.structure.toc.get_toc reads them."""
    top: list[dict] = []
    open_sections: list[dict] = []  # the last heading of each level above the next one
    for level, id_, inner in HEADING.findall(html):
        name = re.sub(r"<[^>]+>", "", inner).replace("¶", "").strip()
        token = {"level": int(level), "id": id_, "name": name, "children": []}
        while open_sections and open_sections[-1]["level"] >= token["level"]:
            open_sections.pop()
        (open_sections[-1]["children"] if open_sections else top).append(token)
        open_sections.append(token)
    return top


def on_page_content(html: str, page, **kwargs) -> str:
    if not page.file.src_uri.endswith(".ipynb"):
        return html
    html = MATHJAX.sub("", html)
    html = SCRIPT.sub(lambda m: "" if re.search(r"https?://", m.group(0)) else m.group(0), html)
    page.toc = get_toc(headings_as_toc_tokens(html))
    return html
