"""The interactive figure of chapter 4 in headless Chromium: tick the masks, pick a sentence, hover cells, read them.

The figure is a Vega-Lite chart written by Altair into the built page (CONTRIBUTING.md, 'Interactive figures').
This test opens the built chapter with every request beyond the local files answered from local npm copies of
MathJax and Vega (tests/offline_cdn.py) and none let through, drives the chart's checkboxes, radio buttons and
tooltips as a reader would, and compares what is drawn with weights it computes itself with transformer_lib, from
the chapter's example. Skipped, with the reason, where Chromium, the built chapter or the local copies are missing;
.ci/run fetches the copies, builds the book, then runs this file. Screenshots at 1280 and 390 pixels land in
book/_build/screenshots for review.
"""

import re
from pathlib import Path

import pytest
import torch

import offline_cdn
import transformer_lib as tl

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "book" / "_build" / "html" / "04_masking.html"
SHOTS = ROOT / "book" / "_build" / "screenshots"

pytestmark = [
    pytest.mark.skipif(offline_cdn.CHROMIUM is None,
                       reason="Chromium is not installed (Debian: apt-get install chromium)"),
    pytest.mark.skipif(not PAGE.is_file(), reason="chapter 4 is not built: run `jupyter-book build book`"),
]


@pytest.fixture(autouse=True, scope="module")
def local_copies():
    """The local npm copies of MathJax and Vega the pages' CDN requests are answered from: TRANSFORMER_BOOK_MATHJAX
    and TRANSFORMER_BOOK_VEGA, or the copies the browser tests fetched (or fetch now) with npm beside the build."""
    offline_cdn.MATHJAX, offline_cdn.VEGA = offline_cdn.local_mathjax(), offline_cdn.local_vega()
    if not (offline_cdn.MATHJAX and offline_cdn.VEGA):
        pytest.skip("no local copies of Vega and MathJax: set TRANSFORMER_BOOK_VEGA and TRANSFORMER_BOOK_MATHJAX "
                    "(.ci/run shows how, with `npm pack`), or let npm fetch them: this test lets no request through")
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')")

# Messages every page of the book logs, whatever its figures: sphinx-thebe 0.3 writes its settings script twice
# (the second copy fails to redeclare a constant), and the theme, opened from file://, finds no stored light/dark
# mode and says that it falls back to "auto".
KNOWN = ("'THEBE_JS_URL' has already been declared", "Got invalid theme mode")

# The chapter's example, computed again here: the decoder inputs of 'Combining the two by broadcasting' and the
# queries, keys and values of 'Masks inside attention' (drawn after torch.manual_seed(29)).
WORDS = "<pad> <bos> <eos> the a cat dog sat barked on mat birds sing".split()
PAD = WORDS.index("<pad>")
SENTENCES = ["<bos> the cat sat on the mat", "<bos> a dog barked"]
SEED, D_K = 29, 4


def expected() -> tuple[torch.Tensor, dict[tuple[bool, bool], tuple[torch.Tensor, torch.Tensor]]]:
    """The target batch (B, T) and, for each (padding on, causal on), the weights (B, h, T, T) and where allowed."""
    tgt = tl.pad_batch([[WORDS.index(w) for w in s.split()] for s in SENTENCES], pad_id=PAD)  # (2, 7)
    T = tgt.size(1)
    torch.manual_seed(SEED)
    q, k, v = torch.randn(3, 2, 2, T, D_K).unbind(0)  # each (B, h, T, d_k)
    masks = {(False, False): None, (True, False): tl.padding_mask(tgt, PAD), (False, True): tl.causal_mask(T),
             (True, True): tl.target_mask(tgt, PAD)}
    result = {}
    for on, mask in masks.items():
        weights = tl.scaled_dot_product_attention(q, k, v, mask=mask)[1]  # (B, h, T, T)
        result[on] = weights, torch.ones_like(weights, dtype=torch.bool) if mask is None else mask.expand_as(weights)
    return tgt, result


def names(tgt: torch.Tensor, b: int) -> list[str]:
    """The chart's labels of sentence b: position and word, '2 dog'."""
    return [f"{i} {WORDS[t]}" for i, t in enumerate(tgt[b].tolist())]


def open_chapter(browser, width: int):
    """The built chapter in a new page of the given width, with its errors, requests and answered CDN files."""
    return offline_cdn.open_offline(browser, PAGE.as_uri(), width, 900)


def cells(page) -> dict[tuple[str, str], dict[str, str]]:
    """Every rect drawn: (query, key) -> the fields of its aria-label (Vega writes the tooltip's fields there)."""
    labels = page.eval_on_selector_all('.vega-embed path[aria-roledescription="rect mark"]',
                                       "paths => paths.map(p => p.getAttribute('aria-label'))")
    drawn = {}
    for label in labels:
        fields = dict(part.split(": ", 1) for part in label.split("; "))
        drawn[fields["query"], fields["key"]] = fields
    return drawn


def hover(page, query: str, key: str) -> dict[str, str]:
    """Move the mouse over the cell (query, key) and return the tooltip that appears, as {field: shown text}."""
    cell = page.locator(f'.vega-embed path[aria-roledescription="rect mark"][aria-label*="; query: {query};"]'
                        f'[aria-label^="key: {key};"]')
    assert cell.count() == 1, f"no single cell for query {query!r}, key {key!r}"
    cell.scroll_into_view_if_needed()
    box = cell.bounding_box()
    page.mouse.move(0, 0)  # leave the chart first, so that the tooltip is drawn anew
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_function(
        "([q, k]) => { const t = document.getElementById('vg-tooltip-element');"
        " return t && t.classList.contains('visible') && t.textContent.includes(q) && t.textContent.includes(k); }",
        arg=[query, key], timeout=5_000)
    rows = page.eval_on_selector_all("#vg-tooltip-element tr",
                                     "rows => rows.map(r => [r.cells[0].textContent, r.cells[1].textContent])")
    return dict(rows)


def check_drawn(page, tgt, weights, allowed, b: int) -> None:
    """Wait (5 s at most) for the chart to show sentence b under these masks, as check_drawn_now describes."""
    for _ in range(50):
        try:
            return check_drawn_now(page, tgt, weights, allowed, b)
        except AssertionError:  # Vega redraws asynchronously after a control changes: look again
            page.wait_for_timeout(100)
    check_drawn_now(page, tgt, weights, allowed, b)


def check_drawn_now(page, tgt, weights, allowed, b: int) -> None:
    """What is drawn is sentence b under these masks: every weight, grey exactly where masked, numbers elsewhere."""
    drawn = cells(page)
    labels = names(tgt, b)
    assert set(drawn) == {(q, k) for q in labels for k in labels}, "the chart does not show the chosen sentence"
    for (query, key), fields in drawn.items():
        i, j = labels.index(query), labels.index(key)
        w = weights[b, 0, i, j].item()
        assert abs(float(fields["weight"]) - w) <= 5e-5 + 1e-7, (query, key, fields["weight"], w)  # stored to 4 places
        assert fields["may be attended to"] == str(bool(allowed[b, 0, i, j])).lower(), (query, key)
    grey = page.eval_on_selector_all('.vega-embed path[aria-roledescription="rect mark"]',
                                     "paths => paths.filter(p => p.getAttribute('fill') === '#eeeeee').length")
    assert grey == int((~allowed[b, 0]).sum()), "the masked cells are not the grey ones"
    numbers = page.locator('.vega-embed [aria-roledescription="text mark"]').count()
    assert numbers == int(allowed[b, 0].sum()), "a number is written on each allowed cell and on no other"


def tooltip_weight(tip: dict[str, str]) -> float:
    assert re.fullmatch(r"\d\.\d{4}", tip["weight"]), f"the tooltip shows the weight {tip['weight']!r}, not to 4 places"
    return float(tip["weight"])


def test_masks_toggle_and_tooltips_show_the_library_weights(browser):
    tgt, by_masks = expected()
    page, log = open_chapter(browser, 1280)
    dog, bos = names(tgt, 1)[2], names(tgt, 1)[0]  # "2 dog", "0 <bos>"

    # As the page opens: no mask, sentence 1 ("<bos> a dog barked" and three pads). Every cell is drawn in blue.
    weights, allowed = by_masks[False, False]
    check_drawn(page, tgt, weights, allowed, 1)
    tip = hover(page, dog, "5 <pad>")
    assert abs(tooltip_weight(tip) - weights[1, 0, 2, 5].item()) <= 5e-5 + 1e-7 and tip["may be attended to"] == "true"
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.locator(".vega-embed").screenshot(path=str(SHOTS / "04_masking-interactive-none.png"))

    # The causal mask: the upper triangle is 0 and grey, and the weights that remain grow (renormalised).
    page.locator('.vega-bindings input[name="causal"]').check()
    weights, allowed = by_masks[False, True]
    check_drawn(page, tgt, weights, allowed, 1)
    tip = hover(page, bos, "3 barked")
    assert tip["weight"] == "0.0000" and tip["may be attended to"] == "false"
    assert hover(page, bos, bos)["weight"] == "1.0000"  # the first query has only itself left
    tip = hover(page, dog, "1 a")
    assert abs(tooltip_weight(tip) - weights[1, 0, 2, 1].item()) <= 5e-5 + 1e-7
    assert weights[1, 0, 2, 1] > by_masks[False, False][0][1, 0, 2, 1]  # what the reader is meant to see grow

    # Both masks: the pad columns go as well; a padded query still reads the real words.
    page.locator('.vega-bindings input[name="padding"]').check()
    weights, allowed = by_masks[True, True]
    check_drawn(page, tgt, weights, allowed, 1)
    assert hover(page, "6 <pad>", "5 <pad>")["weight"] == "0.0000"
    tip = hover(page, "6 <pad>", dog)
    assert abs(tooltip_weight(tip) - weights[1, 0, 6, 2].item()) <= 5e-5 + 1e-7 and tip["may be attended to"] == "true"
    page.locator(".vega-embed").screenshot(path=str(SHOTS / "04_masking-interactive-both.png"))

    # The other sentence, which has no padding: the padding mask changes nothing there.
    page.locator('.vega-bindings input[name="sentence"][value="0"]').check()
    check_drawn(page, tgt, weights, allowed, 0)
    page.locator('.vega-bindings input[name="padding"]').uncheck()
    check_drawn(page, tgt, *by_masks[False, True], 0)
    tip = hover(page, "5 the", "2 cat")
    assert abs(tooltip_weight(tip) - by_masks[False, True][0][0, 0, 5, 2].item()) <= 5e-5 + 1e-7

    # Every state the controls can reach, each cell of it.
    for b in (0, 1):
        page.locator(f'.vega-bindings input[name="sentence"][value="{b}"]').check()
        for padding_on, causal_on in by_masks:
            page.locator('.vega-bindings input[name="padding"]').set_checked(padding_on)
            page.locator('.vega-bindings input[name="causal"]').set_checked(causal_on)
            check_drawn(page, tgt, *by_masks[padding_on, causal_on], b)

    assert not log["refused"], f"requests beyond the local files: {log['refused']}"
    assert all(url.startswith("file://") or url in log["served"] for url in log["requests"]), log["requests"]
    assert any("vega-embed@" in url for url in log["served"]), "the page did not load Vega-Embed"
    errors = [e for e in log["errors"] if not any(known in e for known in KNOWN)]
    assert not errors, f"errors in the console: {errors}"
    page.close()


@pytest.mark.parametrize("width", [1280, 390])
def test_the_figure_fits_the_page(browser, width):
    page, log = open_chapter(browser, width)
    figure = page.locator(".vega-embed").first
    figure.scroll_into_view_if_needed()
    chart = page.locator(".vega-embed svg").bounding_box()
    assert chart["x"] >= 0 and chart["x"] + chart["width"] <= width, f"the chart overflows a {width}-pixel page"
    for control in ("padding", "causal", "sentence"):
        assert page.locator(f'.vega-bindings input[name="{control}"]').first.is_visible()
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"04_masking-interactive-{width}.png"))
    errors = [e for e in log["errors"] if not any(known in e for known in KNOWN)]
    assert not errors and not log["refused"], (errors, log["refused"])
    page.close()
