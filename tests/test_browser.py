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


def open_at_width(browser, name: str, width: int):
    """The built page `name` in a new browser page `width` px wide, its maths served offline when it must be (skipped,
    saying why, when a page with maths cannot get MathJax)."""
    if page_has_maths(name) and mathjax_missing():
        pytest.skip(mathjax_missing())
    page = browser.new_page(viewport={"width": width, "height": 1000})
    if local_mathjax():
        serve_offline(page)
    page.goto((HTML / f"{name}.html").as_uri(), wait_until="load")
    return page


@pytest.mark.parametrize("width", [1280, 390])
@pytest.mark.parametrize("name", pages())
def test_layout_fits_at_desktop_and_phone_width(browser, name, width):
    page = open_at_width(browser, name, width)
    if page.locator(".math").count():  # display equations have their width once MathJax has typeset them
        page.wait_for_function("document.querySelectorAll('mjx-container').length > 0", timeout=30_000)
    problems = page.evaluate(LAYOUT_JS)
    if width != 1280:
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"{name}-{width}px.png"))
    page.close()
    assert not problems, f"{name} at {width} px:\n" + "\n".join(problems[:20])


# ---- legibility at a desktop and a phone width (issue 52): the pages a reviewer read on a 390 px phone ----

# The smallest text a figure may show, in CSS px. The prose is 16 px; a figure's labels are secondary text and may be
# smaller, but not below half of it: 8 px. Below that readers could not read them: Fig. 1.1's token text at about 6 px
# on a 1280 px desktop, chapter 3's twin plots at 4 to 5.5 px on a phone (the round-5 review).
MIN_TEXT_PX = 8
# Matplotlib's plots in the book use seaborn's "notebook" context (sns.set_theme), whose smallest text is 11 points
# (tick labels, legends); the cells checked here set no smaller size (test_the_checked_plots_set_no_smaller_font).
SMALLEST_PLOT_PT = 11
PHONE_PAGES = ["intro", "01_text_to_tensors", "03_attention", "08_translation", "09_attention_heatmaps",
               "appendix_ablations", "instructor_guide"]
# Figures on those pages that are not drawn for a phone yet, held to MIN_TEXT_PX at 1280 px only; the test fails when
# one becomes legible at 390 px, so that it leaves this set. Empty since every figure of those pages was redrawn
# 5.2 inches wide with 9-point text (issue 52; CONTRIBUTING.md, 'Adding a chapter', item 9).
NOT_YET_FOR_A_PHONE: set[str] = set()

IMAGES_JS = """() => [...document.querySelectorAll('article.bd-article img')].filter(i => i.offsetParent !== null)
  .map(i => ({src: i.getAttribute('src'), width: i.getBoundingClientRect().width, natural: i.naturalWidth,
              paired: !!i.closest('div.cell.tag_side-by-side')}))"""


def svg_smallest_text(path: Path) -> float:
    """The smallest text of a figure drawn by tools/figures.py, as a share of the figure's width (its viewBox).
    Matplotlib writes each glyph as a path scaled by the font size over 100: `scale(0.09 -0.09)` is 9 points."""
    import re

    svg = path.read_text(encoding="utf-8")
    width = float(re.search(r'viewBox="0 0 ([\d.]+) [\d.]+"', svg).group(1))
    sizes = [100 * float(s) for s in re.findall(r"scale\(([\d.]+) -\1\)", svg)]
    assert sizes, f"{path.name}: no text found"
    return min(sizes) / width


def png_dpi(path: Path) -> float:
    """The dots per inch that matplotlib wrote into a PNG's pHYs chunk."""
    import struct

    data = path.read_bytes()
    at = data.find(b"pHYs")
    assert at > 0, f"{path.name}: no pHYs chunk, so no dpi to read the font size from"
    per_metre, _, unit = struct.unpack(">IIB", data[at + 4 : at + 13])
    assert unit == 1, f"{path.name}: pHYs unit {unit}, expected 1 (metre)"
    return per_metre * 0.0254


def test_the_checked_plots_set_no_smaller_font():
    """SMALLEST_PLOT_PT holds for chapter 3's side-by-side cells: none asks for a smaller font."""
    import json
    import re

    cells = json.loads((ROOT / "book" / "03_attention.ipynb").read_text(encoding="utf-8"))["cells"]
    paired = ["".join(c["source"]) for c in cells if "side-by-side" in c.get("metadata", {}).get("tags", [])]
    assert len(paired) == 2, "chapter 3 has two cells of side-by-side plots"
    for source in paired:
        assert not re.search(r"fontsize|font_scale|(?<![a-z])size=", source), source


# Every box that scrolls sideways and cannot show all it holds: it must have a visible cue above it saying so. Returns
# what lacks one, and for each wide chart its legend's right edge against the window's.
SCROLL_JS = """() => {
  const problems = [];
  const boxes = [...document.querySelectorAll('.bd-article table.table, .bd-article .table-wrapper, '
                                              + '.bd-article div.cell_output .output.text_html')]
    .filter(b => b.offsetParent !== null && !b.querySelector('table.table, .table-wrapper'));
  for (const box of boxes) {
    if (box.scrollWidth <= box.clientWidth + 1) continue;
    const cue = box.previousElementSibling;
    const what = (box.querySelector('caption, th') || box).textContent.trim().slice(0, 50);
    if (!cue || !cue.classList.contains('scroll-cue') || cue.offsetParent === null || !/scroll/.test(cue.textContent)) {
      problems.push(`"${what}" scrolls sideways (${box.scrollWidth} px in ${box.clientWidth}) and no cue says so`);
    }
    const caption = box.querySelector('caption');
    if (caption && caption.getBoundingClientRect().right > box.getBoundingClientRect().right + 1) {
      problems.push(`the caption "${caption.textContent.trim().slice(0, 40)}" is cut at the box's edge`);
    }
  }
  for (const legend of document.querySelectorAll('.bd-article .vega-embed g.role-legend')) {
    const box = legend.closest('.output.text_html');
    const right = legend.getBoundingClientRect().right;
    const cue = box && box.previousElementSibling && box.previousElementSibling.classList.contains('scroll-cue');
    if (right > window.innerWidth && !cue) problems.push(`a chart's legend ends at ${right} px, off the screen, and no cue says it scrolls`);
  }
  return problems;
}"""

# Names in code in a table (a module, a class) broken inside a word: `transformer_lib.trainin|g`. A break after a
# hyphen, a dot, an underscore or a slash is allowed; so is any break in prose, where a long name must wrap on a phone.
BROKEN_NAMES_JS = """() => {
  const broken = [];
  for (const code of document.querySelectorAll('.bd-article table code.literal')) {
    if (code.offsetParent === null) continue;
    const text = code.textContent;
    const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
    const chars = [];
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (let i = 0; i < node.length; i++) chars.push([node, i]);
    }
    let top = null;
    for (let j = 0; j < chars.length; j++) {
      const range = document.createRange();
      range.setStart(chars[j][0], chars[j][1]);
      range.setEnd(chars[j][0], chars[j][1] + 1);
      const rect = range.getClientRects()[0];
      if (!rect) continue;
      if (top !== null && rect.top > top + 1) {
        const before = chars[j - 1][0].data[chars[j - 1][1]], after = chars[j][0].data[chars[j][1]];
        if (/[A-Za-z0-9]/.test(before) && /[A-Za-z0-9]/.test(after)) { broken.push(text.trim()); break; }
      }
      top = rect.top;
    }
  }
  return broken;
}"""


@pytest.mark.parametrize("width", [1280, 390])
@pytest.mark.parametrize("name", PHONE_PAGES)
def test_figures_tables_and_charts_read_at_desktop_and_phone_width(browser, name, width):
    """Every figure's smallest text at least MIN_TEXT_PX as shown (SVG diagrams: read from the file; chapter 3's
    plots: 11 points at the PNG's dpi, as shown); every box that scrolls sideways says so, its caption whole; the
    charts' legends on the screen or a cue that they scroll; no name in code broken across lines."""
    page = open_at_width(browser, name, width)
    if page.locator('[id^="altair-viz-"]').count():
        if not local_vega():
            pytest.skip("this page has an interactive figure, and no local Vega: set TRANSFORMER_BOOK_VEGA (.ci/run)")
        page.locator('[id^="altair-viz-"] svg').first.wait_for(timeout=30_000)
    if page.locator(".math").count():
        page.wait_for_function("document.querySelectorAll('mjx-container').length > 0", timeout=30_000)
    page.wait_for_timeout(300)  # the scroll cues follow the last change of layout by a frame
    problems = []
    for image in page.evaluate(IMAGES_JS):
        file = (HTML / f"{name}.html").parent / image["src"]
        if file.suffix == ".svg":
            if width != 1280 and file.name in NOT_YET_FOR_A_PHONE:
                px = svg_smallest_text(file) * image["width"]
                assert px < MIN_TEXT_PX, f"{file.name} reads at {px:.1f} px at {width} px now: take it off NOT_YET_FOR_A_PHONE"
                continue
            px = svg_smallest_text(file) * image["width"]
        elif image["paired"]:
            px = SMALLEST_PLOT_PT * png_dpi(file) / 72 * image["width"] / image["natural"]
        else:
            continue
        if px < MIN_TEXT_PX:
            problems.append(f"{file.name}: its smallest text is {px:.1f} px as shown, {image['width']:.0f} px wide")
    problems += page.evaluate(SCROLL_JS)
    problems += [f"`{n}` is broken across lines" for n in page.evaluate(BROKEN_NAMES_JS)]
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}-{width}px-legibility.png"), full_page=True)
    page.close()
    assert not problems, f"{name} at {width} px:\n" + "\n".join(problems[:20])
