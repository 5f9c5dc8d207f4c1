"""The course's website (`make site`, in build/site) read in a real browser: `make site-test`.

Headless Chromium from the distribution's packages, driven by Playwright, opens the home page
served on 127.0.0.1 and follows every link inside the site. Each page must load without a
console error, show all its images, and fetch nothing from the network; every link inside the
site must lead somewhere, anchors included; the readings show their code and the notebooks
their outputs. Screenshots of the home page and of lesson 3 go to build/site-screenshots.

Skipped, saying why, where Chromium or Playwright is missing (`make site-test` installs
Playwright; Chromium comes from `apt-get install chromium`). Not part of `make test`.
"""

import functools
import http.server
import re
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse

import pytest

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "build" / "site"
SCREENSHOTS = ROOT / "build" / "site-screenshots"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="Playwright is not installed (make site-test installs it)")
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="no Chromium here: apt-get install chromium"),
    pytest.mark.timeout(600),
]

# What a page tells about itself, read in the browser once it has loaded.
PAGE_FACTS = """() => ({
    images: Array.from(document.images).map(img => img.src),
    broken_images: Array.from(document.images)
        .filter(img => !(img.complete && img.naturalWidth > 0)).map(img => img.src),
    links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
    ids: Array.from(document.querySelectorAll('[id]')).map(e => e.id),
    code_blocks: document.querySelectorAll('article pre > code').length,
    outputs: document.querySelectorAll('.jp-OutputArea-output').length,
    output_images: document.querySelectorAll('.jp-OutputArea-output img').length,
    executed_prompts: Array.from(document.querySelectorAll('.jp-InputPrompt'))
        .filter(p => /\\[\\d+\\]/.test(p.textContent)).length,
    network_references: [
        ...Array.from(document.querySelectorAll('script[src]')).map(s => s.src),
        ...Array.from(document.querySelectorAll('link[href]'))
            .filter(l => !['prev', 'next', 'canonical'].includes(l.rel)).map(l => l.href),
        ...Array.from(document.querySelectorAll('script:not([src])'))
            .flatMap(s => s.textContent.match(/(import\\(|src=)["'`]https?:[^"'`]*/g) || []),
        ...Array.from(document.styleSheets).flatMap(sheet => {
            try { return Array.from(sheet.cssRules).map(rule => rule.cssText); }
            catch (error) { return [`unreadable stylesheet ${sheet.href}`]; }
        }).flatMap(css => css.match(/url\\(["']?https?:[^)]*\\)/g) || []),
    ].filter(url => /^https?:/.test(url) && new URL(url).origin !== location.origin),
})"""


@dataclass
class Crawl:
    origin: str
    pages: dict[str, dict] = field(default_factory=dict)        # path -> PAGE_FACTS
    console_errors: list[str] = field(default_factory=list)
    bad_responses: list[str] = field(default_factory=list)      # status >= 400 or failed
    network_requests: list[str] = field(default_factory=list)   # to anywhere but the server
    other_files: dict[str, int] = field(default_factory=dict)   # path -> HTTP status
    links: list[tuple[str, str]] = field(default_factory=list)  # (from page, to url)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


@pytest.fixture(scope="module")
def server():
    if not (SITE / "index.html").exists():
        pytest.fail(f"{SITE.relative_to(ROOT)}/index.html is missing: run `make site` first")
    handler = functools.partial(QuietHandler, directory=str(SITE))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as httpd:
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
        httpd.shutdown()


@pytest.fixture(scope="module")
def crawl(server):
    """Every page reached from index.html over the site's own links, with what it showed."""
    found = Crawl(origin=server)
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        context = browser.new_context(viewport={"width": 1280, "height": 900})

        def keep_local(route):
            if route.request.url.startswith(server):
                route.continue_()
            else:
                found.network_requests.append(route.request.url)
                route.abort()

        context.route("**/*", keep_local)
        page = context.new_page()
        page.on("console", lambda m: m.type == "error" and found.console_errors.append(
            f"{page.url}: {m.text}"))
        page.on("pageerror", lambda e: found.console_errors.append(f"{page.url}: {e}"))
        page.on("requestfailed", lambda r: r.url.startswith(server) and found.bad_responses
                .append(f"{r.url}: {r.failure}"))
        page.on("response", lambda r: r.status >= 400 and found.bad_responses.append(
            f"{r.url}: HTTP {r.status}"))
        queue = ["/index.html"]
        while queue:
            path = queue.pop()
            if path in found.pages:
                continue
            response = page.goto(server + path)
            page.wait_for_load_state("networkidle")
            facts = found.pages[path] = page.evaluate(PAGE_FACTS)
            facts["status"] = response.status
            for url in facts["links"]:
                found.links.append((path, url))
                target = urldefrag(url).url
                if not target.startswith(server):
                    continue  # a link out of the site (Material's credit): not followed
                target_path = urlparse(target).path
                if target_path.endswith(".html"):
                    queue.append(target_path)
                elif target_path not in found.other_files:  # a figure, a source, a notebook
                    found.other_files[target_path] = context.request.get(target).status
            if path in ("/index.html", "/lessons/lesson3/index.html"):
                SCREENSHOTS.mkdir(parents=True, exist_ok=True)
                name = "home.png" if path == "/index.html" else "lesson3.png"
                page.screenshot(path=SCREENSHOTS / name)
        browser.close()
    return found


def test_every_page_of_the_site_is_reached_and_loads(crawl):
    on_disk = {"/" + p.relative_to(SITE).as_posix() for p in SITE.rglob("*.html")}
    assert set(crawl.pages) == on_disk - {"/404.html"}
    course = {"/index.html", "/lessons/appendix.html", "/tests/grading/index.html"}
    course |= {f"/lessons/{p.name}/index.html" for p in (ROOT / "lessons").glob("lesson*")
               if (p / "lesson.toml").exists()}
    course |= {f"/notebooks/{p.stem}.html" for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert course <= set(crawl.pages), "the readings, notebooks, appendix or instructor doc"
    assert {path: facts["status"] for path, facts in crawl.pages.items()
            if facts["status"] != 200} == {}
    assert crawl.bad_responses == []


def test_pages_log_no_console_errors(crawl):
    assert crawl.console_errors == []


def test_every_image_loads_and_every_figure_is_shown(crawl):
    broken = {path: facts["broken_images"] for path, facts in crawl.pages.items()
              if facts["broken_images"]}
    assert broken == {}
    shown = {urlparse(src).path for facts in crawl.pages.values() for src in facts["images"]}
    drawn = {"/" + (page.parent / target).resolve().relative_to(ROOT).as_posix()
             for page in [ROOT / "README.md", *(ROOT / "lessons").rglob("*.md")]
             for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", page.read_text())}
    assert drawn, "the readings show figures"
    assert drawn - shown == set(), "figures the readings show but the site does not"


def test_every_link_inside_the_site_resolves_anchors_included(crawl):
    missing = []
    for source, url in crawl.links:
        if not url.startswith(crawl.origin):
            continue
        target, anchor = urldefrag(url)
        path = urlparse(target).path
        if path.endswith(".html"):
            if path not in crawl.pages:
                missing.append(f"{source} -> {url}")
            elif anchor and unquote(anchor) not in crawl.pages[path]["ids"]:
                missing.append(f"{source} -> {url} (no such anchor)")
        elif crawl.other_files.get(path) != 200:
            missing.append(f"{source} -> {url} (HTTP {crawl.other_files.get(path)})")
    assert missing == []


def test_nothing_is_fetched_from_the_network(crawl):
    assert crawl.network_requests == []
    references = {path: facts["network_references"] for path, facts in crawl.pages.items()
                  if facts["network_references"]}
    assert references == {}, "a script, stylesheet or font from outside the site"


def test_readings_show_their_code(crawl):
    readings = [path for path in crawl.pages
                if path.startswith("/lessons/lesson") and path.endswith("/index.html")]
    assert readings
    assert {path: crawl.pages[path]["code_blocks"] for path in readings
            if crawl.pages[path]["code_blocks"] == 0} == {}


def test_notebook_pages_show_executed_outputs(crawl):
    notebooks = [path for path in crawl.pages if path.startswith("/notebooks/")]
    assert notebooks
    for path in notebooks:
        facts = crawl.pages[path]
        assert facts["executed_prompts"] > 0, f"{path}: not executed ([ ]: prompts)"
        assert facts["outputs"] > 0, f"{path}: no outputs"
        assert facts["output_images"] > 0, f"{path}: no diagram among its outputs"


def test_no_page_shows_the_folder_the_site_was_built_in(crawl):
    # The notebooks ran in this checkout: their outputs name paths inside it relative to it.
    shown = [str(page.relative_to(SITE)) for page in SITE.rglob("*.html")
             if str(ROOT) in page.read_text(errors="replace")]
    assert shown == []


def test_screenshots_of_the_home_page_and_lesson_3(crawl):
    for name in ("home.png", "lesson3.png"):
        assert (SCREENSHOTS / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
