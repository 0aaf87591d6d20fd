"""Open the built book in headless Chromium, as a reader would, and check every page (run after the build).

Skipped, with the reason, where Chromium or the built book is missing; .ci/run installs Debian's chromium, builds the
book, then runs this file. Where neither MathJax's CDN nor a local MathJax (TRANSFORMER_BOOK_MATHJAX) can be had, a
page with maths fails at once with that reason instead of waiting for maths that never typesets. With a local MathJax,
the test lets no request beyond the local files through: it answers the pages' CDN requests from local npm copies
(tests/offline_cdn.py), MathJax's and, for the interactive figures, Vega's (TRANSFORMER_BOOK_VEGA). Screenshots of
every page land in book/_build/screenshots for review.
"""

import functools
import os
import shutil
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "book" / "_build" / "html"
SHOTS = ROOT / "book" / "_build" / "screenshots"
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
# A folder holding MathJax 3 (its es5/ bundle, e.g. from `npm pack mathjax@3`): served in place of the CDN copy the
# pages load, so that the maths can be checked on a machine without internet. Without it the CDN is used.
MATHJAX = os.environ.get("TRANSFORMER_BOOK_MATHJAX")
CDN = "https://cdn.jsdelivr.net/npm/mathjax@3/"


@functools.cache
def mathjax_missing() -> str | None:
    """Why the maths cannot be checked here, or None: a local MathJax is given, or MathJax's CDN answers."""
    if MATHJAX:
        return None
    try:
        urllib.request.urlopen(urllib.request.Request(CDN + "es5/tex-mml-chtml.js", method="HEAD"), timeout=5)
        return None
    except OSError:
        return (f"MathJax's CDN ({CDN}) cannot be reached from here and TRANSFORMER_BOOK_MATHJAX is not set: point "
                "it at a local MathJax 3 package (.ci/run shows how, with `npm pack mathjax@3`)")


sys.path.insert(0, str(ROOT / "tools"))
import colab  # noqa: E402
import offline_cdn  # noqa: E402

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium)"),
    pytest.mark.skipif(not (HTML / "intro.html").is_file(), reason="the book is not built: run `jupyter-book build book`"),
]
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')")


def pages() -> list[str]:
    toc = yaml.safe_load((ROOT / "book" / "_toc.yml").read_text())
    return [toc["root"]] + [chapter["file"] for part in toc["parts"] for chapter in part["chapters"]]


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"],
        )
        yield browser
        browser.close()


@pytest.mark.parametrize("name", pages())
def test_page_as_a_reader_sees_it(browser, name):
    page = browser.new_page(viewport={"width": 1280, "height": 1600})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    refused: list[str] = []
    if MATHJAX:  # no internet here: answer from the local copies, refuse the rest (fail fast, never hang)
        offline_cdn.serve_locally(page, [], refused)
    response = page.goto((HTML / f"{name}.html").as_uri(), wait_until="load")
    assert response is None or response.ok
    if page.locator('[id^="altair-viz-"]').count():  # an interactive figure (CONTRIBUTING.md, 'Interactive figures')
        if MATHJAX and not offline_cdn.VEGA:
            pytest.fail("this page has an interactive figure and TRANSFORMER_BOOK_VEGA is not set: point it at local "
                        "copies of vega, vega-lite and vega-embed (.ci/run shows how, with `npm pack`)")
        page.locator('[id^="altair-viz-"] svg').first.wait_for(timeout=30_000)
    assert "Transformer, Piece by Piece" in page.title()

    if page.locator(".math").count():
        if mathjax_missing():
            pytest.fail(mathjax_missing())
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
