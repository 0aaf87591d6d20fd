"""Internal links, images and cross-references of the built book resolve (run after `jupyter-book build book`)."""

import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

HTML = Path(__file__).resolve().parent.parent / "book" / "_build" / "html"
pytestmark = pytest.mark.skipif(
    not (HTML / "intro.html").is_file(),
    reason="the book is not built: run `jupyter-book build book` first (.ci/run does, then runs this test)",
)


class Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[tuple[str, str]] = []  # (tag, url)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("href"):
            self.links.append(("a", attrs["href"]))
        if tag in ("img", "script") and attrs.get("src"):
            self.links.append((tag, attrs["src"]))
        if tag == "link" and attrs.get("href"):
            self.links.append(("link", attrs["href"]))


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def book_pages() -> list[Path]:
    return sorted(p for p in HTML.glob("*.html") if p.name not in {"genindex.html", "search.html"})


def test_every_internal_link_image_and_anchor_resolves():
    parsed = {path: parse(path) for path in book_pages()}
    broken = []
    for path, page in parsed.items():
        for tag, url in page.links:
            parts = urlsplit(url)
            if parts.scheme or url.startswith("//") or url.startswith("mailto:"):
                continue  # external: checked by the separate, non-blocking link check (README)
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if not target.exists():
                broken.append(f"{path.name}: <{tag}> {url} -> missing file")
                continue
            if parts.fragment and target.suffix == ".html":
                ids = parsed[target].ids if target in parsed else parse(target).ids
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{path.name}: <{tag}> {url} -> no element with id {parts.fragment!r}")
    assert not broken, "\n".join(broken)


def test_every_chapter_page_was_built():
    names = {p.stem for p in book_pages()}
    for notebook in (HTML.parent.parent).glob("[0-9][0-9]_*.ipynb"):
        assert notebook.stem in names, f"{notebook.name} has no page in the built book"


class VisibleText(HTMLParser):
    """The text a reader sees on a page (no scripts, styles or attributes), and the classes of its output boxes."""

    SKIP = {"script", "style", "noscript", "template"}

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.classes: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skipping += 1
        self.classes.append(dict(attrs).get("class") or "")

    def handle_endtag(self, tag):
        if tag in self.SKIP and self.skipping:
            self.skipping -= 1

    def handle_data(self, data):
        if not self.skipping:
            self.parts.append(data)


# An absolute path of the machine that built the book: a home, root's home, a temporary folder, a work folder, a
# system prefix, a Windows drive, or the repository's own folder. Written in prose as code (`/usr/bin/chromium`) none
# of these would be legitimate on a reader's page either, so the check has no exceptions; it looks at visible text
# only, so that links (https://...) and the pages' own URLs do not count.
MACHINE_PATH = re.compile(r"(?<![\w.:/~-])(?:/home/|/root/|/tmp/|/work/|/usr/|/opt/|/var/|/private/|/Users/"
                          r"|\b[A-Za-z]:\\[\w .-]+\\|" + re.escape(str(HTML.parent.parent.parent)) + r")")
TRACEBACK = re.compile(r"Traceback \(most recent call last\)|^\s*Cell In\[\d+\], line \d+|^-{20,}\s*\n?\w+Error",
                       re.M)


def test_no_page_shows_a_traceback_or_a_path_of_the_build_machine():
    """An error output shows a traceback with the path of each file it passes through, grader code included (an
    exercise stub's NotImplementedError did on every chapter), and a warning printed while a notebook runs carries
    the path of the file that raised it (tqdm.auto's "IProgress not found" put `.../site-packages/tqdm/auto.py` on
    every page). No page may show either, in the book or in the student edition (tests/test_student_edition.py)."""
    assert not pages_with_machine_paths_or_tracebacks(HTML), "pages that show what only the build machine should"


def pages_with_machine_paths_or_tracebacks(html: Path) -> list[str]:
    found = []
    for path in sorted(html.glob("*.html")):
        if path.name in {"genindex.html", "search.html"}:
            continue
        page = VisibleText()
        page.feed(path.read_text(encoding="utf-8"))
        text = "".join(page.parts)
        for match in MACHINE_PATH.finditer(text):
            found.append(f"{path.name}: a path of the build machine: {text[max(0, match.start() - 60):match.end() + 60]!r}")
            break
        if TRACEBACK.search(text) or any("traceback" in c.split() or "site-packages" in c for c in page.classes):
            found.append(f"{path.name}: a traceback")
        if "site-packages" in text:
            found.append(f"{path.name}: a path into site-packages")
    print("\n".join(found))
    return found
