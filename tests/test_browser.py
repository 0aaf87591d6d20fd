"""Open the built book in headless Chromium, as a reader would, and check every page (run after the build).

Skipped, with the reason and the fix, where Chromium or the built book is missing, and where no MathJax can be had:
neither a local one (TRANSFORMER_BOOK_MATHJAX, or one fetched once with npm into book/_build/mathjax) nor MathJax's
CDN. With local copies the test lets no request beyond the local files through: it answers the pages' CDN requests
from npm's packages (tests/offline_cdn.py), MathJax's and, for the interactive figures, Vega's
(TRANSFORMER_BOOK_VEGA, or fetched once with npm into book/_build/vega). Every page is also checked for its layout at a desktop (1280 px) and a phone (390 px) width: the page never
scrolls sideways, and whatever is wider than the column (code, printed output, equations, tables) scrolls inside
its own box. Screenshots of every page land in book/_build/screenshots for review.
"""

import functools
import urllib.request
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "book" / "_build" / "html"
SHOTS = ROOT / "book" / "_build" / "screenshots"
CDN = "https://cdn.jsdelivr.net/npm/mathjax@3/"
MATHJAX_FIX = ("export TRANSFORMER_BOOK_MATHJAX=$(mkdir -p /tmp/mj && cd /tmp/mj && npm pack --silent mathjax@3 && "
               "tar xzf mathjax-*.tgz && pwd)/package")


@functools.cache
def mathjax_missing() -> str | None:
    """Why the maths cannot be checked here, with the one-line fix, or None."""
    if local_mathjax():
        return None
    try:
        urllib.request.urlopen(urllib.request.Request(CDN + "es5/tex-mml-chtml.js", method="HEAD"), timeout=5)
        return None
    except OSError:
        return (f"no MathJax: its CDN ({CDN}) cannot be reached from here, TRANSFORMER_BOOK_MATHJAX is not set and "
                f"npm could not fetch it. Fix: {MATHJAX_FIX}")


import colab
import offline_cdn
from offline_cdn import local_mathjax, local_vega


def serve_offline(page) -> list[str]:
    """Answer the page's CDN requests from the local copies and refuse every other request; the refused, listed."""
    offline_cdn.MATHJAX, offline_cdn.VEGA = local_mathjax(), local_vega()
    refused: list[str] = []
    offline_cdn.serve_locally(page, [], refused)
    return refused

pytestmark = [
    pytest.mark.skipif(offline_cdn.CHROMIUM is None,
                       reason="Chromium is not installed (Debian: apt-get install chromium)"),
    pytest.mark.skipif(not (HTML / "intro.html").is_file(), reason="the book is not built: run `jupyter-book build book`"),
]
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')")


def pages() -> list[str]:
    toc = yaml.safe_load((ROOT / "book" / "_toc.yml").read_text())
    return [toc["root"]] + [chapter["file"] for part in toc["parts"] for chapter in part["chapters"]]


def page_has_maths(name: str) -> bool:
    return 'class="math' in (HTML / f"{name}.html").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", pages())
def test_page_as_a_reader_sees_it(browser, name):
    page = browser.new_page(viewport={"width": 1280, "height": 1600})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    if page_has_maths(name) and mathjax_missing():
        pytest.skip(mathjax_missing())
    refused = serve_offline(page) if local_mathjax() else []  # no internet here: fail fast, never hang
    response = page.goto((HTML / f"{name}.html").as_uri(), wait_until="load")
    assert response is None or response.ok
    if page.locator('[id^="altair-viz-"]').count():  # an interactive figure (CONTRIBUTING.md, 'Interactive figures')
        if local_mathjax() and not local_vega():
            pytest.skip("this page has an interactive figure, and no local Vega: set TRANSFORMER_BOOK_VEGA to copies "
                        "of vega, vega-lite and vega-embed fetched with `npm pack` (.ci/run shows how)")
        page.locator('[id^="altair-viz-"] svg').first.wait_for(timeout=30_000)
    assert "Transformer, Piece by Piece" in page.title()

    if page.locator(".math").count():
        page.wait_for_function("document.querySelectorAll('mjx-container').length > 0", timeout=30_000)
        assert page.locator("mjx-merror").count() == 0, "MathJax could not typeset some maths"
        assert page.locator("mjx-container").count() >= page.locator("span.math, div.math").count()

    sizes = page.eval_on_selector_all("img", "imgs => imgs.map(i => [i.src, i.complete, i.naturalWidth, i.naturalHeight])")
    for src, complete, width, height in sizes:
        assert complete and width > 0 and height > 0, f"image {src} did not load"

    url, branch = colab.repository()
    repo_path = url.split("github.com/", 1)[1]
    assert page.locator(f'a[href="{url}"]').count() >= 1, "no repository button"
    if (ROOT / "book" / f"{name}.ipynb").exists():
        colab_link = f"colab.research.google.com/github/{repo_path}/blob/{branch}/book/{name}.ipynb"
        assert page.locator(f'a[href*="{colab_link}"]').count() >= 1, "no Colab launch button for this notebook"
        figures = [s for s in sizes if "_images/" in s[0]]
        notebook = (ROOT / "book" / f"{name}.ipynb").read_text(encoding="utf-8")
        executed = name not in {"08_translation", "09_attention_heatmaps"} or '"image/png"' in notebook
        if executed and "plt.show()" in notebook:
            assert figures, "the chapter draws figures but the page shows none"

    dropdowns = page.locator(".solution.dropdown")
    if dropdowns.count():
        first = dropdowns.first
        body = first.locator(":scope > *:not(.admonition-title)").first
        first.scroll_into_view_if_needed()
        assert not body.is_visible(), "a solution is open before the reader asks for it"
        first.locator("button.toggle-button").click()
        body.wait_for(state="visible", timeout=5_000)

    SHOTS.mkdir(parents=True, exist_ok=True)
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(SHOTS / f"{name}.png"))
    # sphinx-thebe 0.3 writes its one-line settings script twice into every page; the second copy fails to
    # redeclare a constant. The book does not use Thebe (no live kernels), so that error alone is tolerated.
    errors = [e for e in errors if "'THEBE_JS_URL' has already been declared" not in e]
    assert not errors, f"JavaScript errors: {errors}"
    assert not refused, f"requests with no local copy to answer them: {refused}"
    page.close()


# What is wider than its box, in the article: the first box that can scroll it sideways must hold it, lie inside the
# article, and reach its right end (a table's last column, a code line's end) by scrolling.
LAYOUT_JS = """() => {
  const problems = [];
  const doc = document.documentElement;
  if (doc.scrollWidth > window.innerWidth + 1) {
    problems.push(`the page scrolls sideways: ${doc.scrollWidth} px of content in a ${window.innerWidth} px window`);
  }
  const article = document.querySelector('article.bd-article') || document.querySelector('.bd-article');
  if (!article) return problems;
  const edge = article.getBoundingClientRect().right + 1;
  const wide = article.querySelectorAll('pre, div.math, mjx-container[display="true"], table');
  for (const el of wide) {
    if (el.offsetParent === null) continue;  // hidden, e.g. inside a closed solution
    const rect = el.getBoundingClientRect();
    const overflowing = el.scrollWidth > el.clientWidth + 1 || rect.right > edge;
    if (!overflowing) continue;
    let box = el;
    while (box && box !== article && !['auto', 'scroll'].includes(getComputedStyle(box).overflowX)) {
      box = box.parentElement;
    }
    const what = `${el.tagName.toLowerCase()}.${el.className || ''}`.slice(0, 60) + ` "${(el.textContent || '').trim().slice(0, 40)}"`;
    if (!box || box === article) { problems.push(`${what} is cut off: no box scrolls it`); continue; }
    const boxRect = box.getBoundingClientRect();
    if (boxRect.right > edge) problems.push(`${what}: its scrolling box runs past the article (${boxRect.right} > ${edge})`);
    if (box.scrollWidth + 1 < el.scrollWidth) problems.push(`${what}: its end cannot be scrolled to`);
  }
  return problems;
}"""


@pytest.mark.parametrize("width", [1280, 390])
@pytest.mark.parametrize("name", pages())
def test_layout_fits_at_desktop_and_phone_width(browser, name, width):
    if page_has_maths(name) and mathjax_missing():
        pytest.skip(mathjax_missing())
    page = browser.new_page(viewport={"width": width, "height": 1000})
    if local_mathjax():
        serve_offline(page)
    page.goto((HTML / f"{name}.html").as_uri(), wait_until="load")
    if page.locator(".math").count():  # display equations have their width once MathJax has typeset them
        page.wait_for_function("document.querySelectorAll('mjx-container').length > 0", timeout=30_000)
    problems = page.evaluate(LAYOUT_JS)
    if width != 1280:
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"{name}-{width}px.png"))
    page.close()
    assert not problems, f"{name} at {width} px:\n" + "\n".join(problems[:20])
