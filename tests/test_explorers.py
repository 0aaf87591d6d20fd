"""The explorers of chapters 8 and 9 (transformer_lib/explorers.py): the numbers their charts carry, and the charts
themselves in headless Chromium.

The unit tests check that the traced beam search is the library's beam search (its best hypothesis is what
decoding.beam_search returns), that the beam chart's rows are the trace's, and that the attention chart carries the
maps passed in (to 3 decimals, padding left out, layers and heads from 1) and weighs at most 200 KB of chapter 9's
page. The browser tests save each chart as a standalone page, open it with every CDN request answered from local npm
copies of Vega (tests/offline_cdn.py) and none let through, drive its controls as a reader would and compare what is
drawn and the tooltips with the maps and the trace. They skip, with the reason, where Chromium, playwright or the local copies are missing.
"""

import pytest
import torch

import offline_cdn
import transformer_lib as tl
from transformer_lib import explorers
from transformer_lib.attention_maps import collect_attention

LENGTHS = [15, 14, 16, 13]  # four sentences of about 15 pieces, of different lengths: the batch has padding


class DigitTokenizer:
    """The two methods of a tokenizers.Tokenizer that beam_explorer uses, for sources written as numbers "3 1 4"."""

    def encode(self, text: str):
        return type("Encoding", (), {"ids": [tl.BOS_ID] + [4 + int(w) for w in text.split()] + [tl.EOS_ID]})

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(i - 4) for i in ids if i >= 4)


def small_model(seed: int, vocab: int = 14, n_layers: int = 1, n_heads: int = 2) -> tl.Transformer:
    torch.manual_seed(seed)
    cfg = tl.TransformerConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=32, n_heads=n_heads,
                               n_layers=n_layers, d_ff=64, dropout=0.0, max_len=32)
    return tl.Transformer(cfg).eval()


def best_of(trace: list[dict]) -> list[int]:
    """The trace's answer: the last beam's best hypothesis by score / length penalty, ids after <bos>."""
    last = trace[-1]
    return max((last["candidates"][i] for i in last["kept"]), key=lambda c: c["ranked"])["tokens"][1:]


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0, 2.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_traced_beam_search_returns_what_beam_search_returns(seed, alpha):
    model = small_model(seed)
    src = torch.tensor([[tl.BOS_ID, 5, 9, 6, 7, tl.EOS_ID]])  # (1, S)
    for k in (1, 3):
        library = tl.beam_search(model, src, beam_size=k, max_len=10, alpha=alpha)[0].tolist()
        traced = best_of(explorers.trace_beam_search(model, src, k, 10, alpha))
        traced += [tl.PAD_ID] * (len(library) - len(traced))
        assert traced == library, (seed, alpha, k)


def test_trace_records_every_kept_one_and_counts_the_pruned():
    model, vocab, k = small_model(3), 14, 3
    trace = explorers.trace_beam_search(model, torch.tensor([[tl.BOS_ID, 5, 6, tl.EOS_ID]]), k, 6, 0.6)
    assert trace[0]["n_candidates"] == vocab and len(trace[0]["parents"]) == 1  # one beam alive at first
    for step in trace:
        alive = sum(not p["finished"] for p in step["parents"])
        assert step["n_candidates"] == alive * vocab + (len(step["parents"]) - alive)  # a finished one: one way on
        assert len(step["kept"]) == k
        ranked = [step["candidates"][i]["ranked"] for i in step["kept"]]
        assert ranked == sorted(ranked, reverse=True)  # best first, as beam_search orders its beam


def test_beam_rows_are_the_trace():
    model, k = small_model(4), 3
    sources = ["1 2 3 4", "5 6"]
    steps_rows, final_rows = explorers.beam_rows(model, DigitTokenizer(), sources, k, (0.0, 1.0), max_len=7)
    for s, sentence in enumerate(sources):
        src = torch.tensor([DigitTokenizer().encode(sentence).ids])
        for alpha in (0.0, 1.0):
            trace = explorers.trace_beam_search(model, src, k, 7, alpha)
            rows = [r for r in steps_rows if r["sentence"] == s and r["alpha"] == alpha]
            assert {r["step"] for r in rows} == set(range(1, len(trace) + 1))
            for t, step in enumerate(trace, start=1):
                at = [r for r in rows if r["step"] == t]
                kept = [step["candidates"][i] for i in step["kept"]]
                assert sum(r["status"] in ("alive", "finished") for r in at) == k
                assert sum(r["status"] == "finished" for r in at) == sum(c["finished"] for c in kept)
                assert all(r["pruned"] == step["n_candidates"] - k for r in at)
                assert sum(r["status"] == "pruned" for r in at) == min(k, step["n_candidates"] - k)
                assert [r["score"] for r in at[:k]] == [round(c["ranked"], 3) for c in kept]
            final = [r for r in final_rows if r["sentence"] == s and r["alpha"] == alpha]
            chosen = [r for r in final if r["status"] == "chosen"]
            assert len(chosen) == 1 and chosen[0]["rank"] == 1
            library = tl.beam_search(model, src, beam_size=k, max_len=7, alpha=alpha)[0].tolist()
            assert chosen[0]["hypothesis"].startswith("1. " + DigitTokenizer().decode(library))
            assert [r["status"] for r in final].count("greedy") == 1


def example_maps(seed: int = 0):
    """Maps of a 3-layer, 8-head model on four padded sentences, an untrained model's, and the pieces of each."""
    model, untrained = small_model(seed, vocab=40, n_layers=3, n_heads=8), small_model(seed + 100, 40, 3, 8)
    generator = torch.Generator().manual_seed(seed)
    src = tl.pad_batch([[tl.BOS_ID, *torch.randint(4, 40, (n - 2,), generator=generator).tolist(), tl.EOS_ID]
                        for n in LENGTHS], tl.PAD_ID)  # (4, 16)
    tgt = tl.pad_batch([[tl.BOS_ID, *torch.randint(4, 40, (n - 2,), generator=generator).tolist()] for n in LENGTHS],
                       tl.PAD_ID)  # (4, 15)
    src_tokens = [[f"s{t}" for t in row if t != tl.PAD_ID] for row in src.tolist()]
    in_tokens = [[f"t{t}" for t in row if t != tl.PAD_ID] for row in tgt.tolist()]
    out_tokens = [tokens[1:] + ["</s>"] for tokens in in_tokens]
    return collect_attention(model, src, tgt), collect_attention(untrained, src, tgt), src_tokens, in_tokens, out_tokens


def unpacked(packed: str, n_q: int, n_k: int, causal: bool) -> list[torch.Tensor]:
    """The maps a row of attention_rows packs, read back independently of explorers.py: two base-36 digits per
    weight in thousandths, row by row; a causal map holds its lower triangle only."""
    values = torch.tensor([int(packed[i : i + 2], 36) for i in range(0, len(packed), 2)], dtype=torch.float32) / 1000
    size = n_q * (n_q + 1) // 2 if causal else n_q * n_k
    assert len(values) % size == 0
    maps = []
    for start in range(0, len(values), size):
        block = torch.zeros(n_q, n_k)
        if causal:
            rows, columns = torch.tril_indices(n_q, n_k)
            block[rows, columns] = values[start : start + size]
        else:
            block = values[start : start + size].view(n_q, n_k)
        maps.append(block)
    return maps


def test_attention_rows_carry_the_maps_without_padding():
    maps, untrained, src_tokens, in_tokens, out_tokens = example_maps()
    map_rows, label_rows = explorers.attention_rows(maps, src_tokens, in_tokens, out_tokens, untrained)
    assert {r["layer"] for r in map_rows} == {1, 2, 3}
    assert len(map_rows) == 4 * 3 * 3 * 2  # sentences, kinds, layers, models
    labels = {r["grid"]: r for r in label_rows}
    for r in map_rows:
        b, name = r["sentence"], explorers.MODULE_KINDS[r["module"]].format(r["layer"] - 1)
        n_q = len(src_tokens[b]) if r["module"] == "encoder self" else len(in_tokens[b])
        n_k = len(in_tokens[b]) if r["module"] == "decoder self" else len(src_tokens[b])
        label = labels[f"{b}|{r['module']}"]
        assert label["n_keys"] == n_k and len(label["queries"]) == n_q  # padding left out
        assert label["causal"] == (r["module"] == "decoder self")
        block = (maps if r["model"] == "trained" else untrained)[name][b, :, :n_q, :n_k]  # (h, n_q, n_k)
        expected = [block.mean(0), *block] if r["model"] == "trained" else [block.mean(0)]  # untrained: the mean
        stored = unpacked(r["w"], n_q, n_k, label["causal"])
        assert len(stored) == len(expected)
        for got, want in zip(stored, expected):
            assert (got - want).abs().max() <= 5e-4 + 1e-6  # rounded to 3 decimals; 0 above a causal diagonal
    cross = labels["2|cross"]
    assert cross["queries"][0] == f"0 {out_tokens[2][0]}"
    assert cross["keys"][-1] == f"{LENGTHS[2] - 1} {src_tokens[2][-1]}"


def test_a_causal_map_with_weight_above_its_diagonal_is_refused():
    maps, untrained, src_tokens, in_tokens, out_tokens = example_maps()
    leaky = dict(maps, **{"decoder.1.self": maps["decoder.1.self"].flip(-1)})  # weight on future positions
    with pytest.raises(ValueError, match="above its diagonal"):
        explorers.attention_rows(leaky, src_tokens, in_tokens, out_tokens, untrained)


def chapter_sized_maps(src_lengths: list[int], tgt_lengths: list[int], n_layers: int = 3, n_heads: int = 8):
    """Maps as collect_attention returns them for sentences of these lengths (random rows that sum to 1, exact zeros
    on padding and above the decoder's diagonal), and BPE-like pieces for their labels."""
    generator = torch.Generator().manual_seed(0)
    B, S, T = len(src_lengths), max(src_lengths), max(tgt_lengths)
    src_real = (torch.arange(S) < torch.tensor(src_lengths)[:, None])[:, None, None, :]  # (B, 1, 1, S)
    tgt_real = (torch.arange(T) < torch.tensor(tgt_lengths)[:, None])[:, None, None, :]  # (B, 1, 1, T)
    allowed = {"encoder.{}.self": src_real.expand(B, 1, S, S), "decoder.{}.self": tgt_real & tl.causal_mask(T),
               "decoder.{}.cross": src_real.expand(B, 1, T, S)}
    maps = {}
    for i in range(n_layers):
        for name, mask in allowed.items():
            scores = 3 * torch.randn(B, n_heads, *mask.shape[-2:], generator=generator)
            maps[name.format(i)] = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    src_tokens = [["<bos>", *[f"\u2581Wort{j}" for j in range(n - 2)], "<eos>"] for n in src_lengths]
    in_tokens = [["<bos>", *[f"\u2581word{j}" for j in range(n - 1)]] for n in tgt_lengths]
    out_tokens = [tokens[1:] + ["<eos>"] for tokens in in_tokens]
    return maps, src_tokens, in_tokens, out_tokens


def test_attention_explorer_page_weight():
    """The page weight of chapter 9's explorer: the HTML that its cell stores and the page inlines, at most 200 KB.
    Chapter 9's four test sentences have 17, 14, 10 and 10 source pieces; the stored run's decoder read 18, 16, 10
    and 10 (the page then weighed 127,053 bytes, against 537,288 when every untrained head and a JSON list of
    thousandths were stored). The check allows each translation 5 pieces more, about 2 kB of the page each."""
    maps, src_tokens, in_tokens, out_tokens = chapter_sized_maps([17, 14, 10, 10], [23, 21, 15, 15])
    untrained, *_ = chapter_sized_maps([17, 14, 10, 10], [23, 21, 15, 15])
    chart = explorers.attention_explorer(maps, src_tokens, in_tokens, out_tokens, untrained_maps=untrained,
                                         sentence_names=[f"test sentence {i}" for i in (9, 16, 48, 14)])
    page = chart._repr_mimebundle_()["text/html"]  # what the notebook stores and myst-nb copies into the page
    size = len(page.encode("utf-8"))
    assert size <= 200_000, f"the attention explorer weighs {size:,} bytes of the page; the limit is 200 KB"


# ---- in the browser ----

needs_chromium = pytest.mark.skipif(offline_cdn.CHROMIUM is None,
                                    reason="Chromium is not installed (Debian: apt-get install chromium)")


@pytest.fixture(scope="module")
def vega_copies():
    """The local npm copies of Vega, Vega-Lite and Vega-Embed that the charts' CDN requests are answered from:
    TRANSFORMER_BOOK_VEGA, or those the browser tests fetched into book/_build/vega, or fetched there now with npm."""
    offline_cdn.VEGA = offline_cdn.local_vega()
    if not offline_cdn.VEGA:
        pytest.skip("no local copies of Vega, Vega-Lite and Vega-Embed: set TRANSFORMER_BOOK_VEGA (.ci/run shows how, "
                    "with `npm pack`) or install npm, which fetches them: this test lets no request through")


needs_vega = pytest.mark.usefixtures("vega_copies")


def open_chart(browser, chart, path):
    """The chart saved as a standalone page and opened offline, with its errors, requests and answered CDN files."""
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')")
    chart.save(str(path))
    return offline_cdn.open_offline(browser, path.as_uri(), 1280, 1000)


def drawn(page, role: str = "rect mark") -> list[dict[str, str]]:
    """The fields of every mark drawn with this role (Vega writes the tooltip's fields into each mark's aria-label;
    a heatmap's cells are "rect mark", bars "bar"), with d3's minus sign (U+2212) read as "-"."""
    labels = page.eval_on_selector_all(f'.vega-embed path[aria-roledescription="{role}"]',
                                       "paths => paths.map(p => p.getAttribute('aria-label'))")
    return [dict(part.split(": ", 1) for part in label.replace("\u2212", "-").split("; ")) for label in labels]


def wait_for(page, check, *args):
    """check(*args) until it passes (Vega redraws asynchronously after a control changes), 5 s at most."""
    for _ in range(50):
        try:
            return check(*args)
        except AssertionError:
            page.wait_for_timeout(100)
    return check(*args)


def check_offline(log):
    assert not log["refused"], f"requests beyond the local files: {log['refused']}"
    assert all(url.startswith("file://") or url in log["served"] for url in log["requests"]), log["requests"]
    assert any("vega-embed@" in url for url in log["served"]), "the page did not load Vega-Embed"
    assert not log["errors"], f"errors in the console: {log['errors']}"


@needs_chromium
@needs_vega
def test_attention_explorer_in_the_browser(browser, tmp_path):
    maps, untrained, src_tokens, in_tokens, out_tokens = example_maps()
    chart = explorers.attention_explorer(maps, src_tokens, in_tokens, out_tokens, untrained)
    page, log = open_chart(browser, chart, tmp_path / "attention.html")

    def shows(b: int, kind: str, layer: int, head: int, models=("trained",)):
        cells = drawn(page)
        n_q = len(src_tokens[b]) if kind == "encoder self" else len(in_tokens[b])
        n_k = len(in_tokens[b]) if kind == "decoder self" else len(src_tokens[b])
        assert len(cells) == n_q * n_k * len(models), (len(cells), n_q, n_k, models)
        queries = [f"{i} {t}" for i, t in enumerate((src_tokens if kind == "encoder self" else
                                                      in_tokens if kind == "decoder self" else out_tokens)[b])]
        keys = [f"{i} {t}" for i, t in enumerate((in_tokens if kind == "decoder self" else src_tokens)[b])]
        for cell in cells:
            trained = cell["model"] == "trained"
            block = (maps if trained else untrained)[explorers.MODULE_KINDS[kind].format(layer - 1)][b, :, :n_q, :n_k]
            shown = head if trained else 0  # the untrained model: always the mean of its heads
            expected = block.mean(0) if shown == 0 else block[shown - 1]
            w = expected[queries.index(cell["query"]), keys.index(cell["key"])].item()
            assert abs(float(cell["weight"]) - w) <= 5e-4 + 1e-6, (cell, w)
            assert cell["layer"] == str(layer) and cell["head"] == ("mean" if shown == 0 else str(shown))
        return queries, keys

    # As the page opens: sentence 1, cross-attention, the last layer (3), the mean of the heads, the trained model.
    queries, keys = wait_for(page, shows, 0, "cross", 3, 0)
    cell = page.locator(f'.vega-embed path[aria-roledescription="rect mark"][aria-label*="; query: {queries[4]};"]'
                        f'[aria-label*="; key: {keys[6]};"]')
    box = cell.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_function("() => { const t = document.getElementById('vg-tooltip-element');"
                           " return t && t.classList.contains('visible'); }", timeout=5_000)
    tip = dict(page.eval_on_selector_all("#vg-tooltip-element tr",
                                         "rows => rows.map(r => [r.cells[0].textContent, r.cells[1].textContent])"))
    expected = maps["decoder.2.cross"][0, :, 4, 6].mean().item()
    assert tip["query"] == queries[4] and tip["key"] == keys[6] and abs(float(tip["weight"]) - expected) <= 5e-4 + 1e-6

    # Each control changes what is drawn to the map it names.
    page.select_option('.vega-bindings select[name="head"]', label="5")
    wait_for(page, shows, 0, "cross", 3, 5)
    page.select_option('.vega-bindings select[name="layer"]', label="1")
    wait_for(page, shows, 0, "cross", 1, 5)
    page.locator('.vega-bindings input[name="module"][value="encoder self"]').check()
    wait_for(page, shows, 0, "encoder self", 1, 5)
    page.select_option('.vega-bindings select[name="sentence"]', label="sentence 3")
    wait_for(page, shows, 2, "encoder self", 1, 5)
    page.locator('.vega-bindings input[name="module"][value="decoder self"]').check()
    wait_for(page, shows, 2, "decoder self", 1, 5)
    width = page.locator(".vega-embed svg").bounding_box()["width"]
    page.locator('.vega-bindings input[name="untrained"]').check()
    wait_for(page, shows, 2, "decoder self", 1, 5, ("trained", "untrained"))
    assert {cell["model"] for cell in drawn(page)} == {"trained", "untrained"}
    assert "untrained: mean of the heads" in page.locator(".vega-embed svg").text_content()  # the panel's header
    right = page.eval_on_selector_all('.vega-embed path[aria-roledescription="rect mark"]',
                                      "paths => Math.max(...paths.map(p => p.getBoundingClientRect().right))")
    svg = page.locator(".vega-embed svg").bounding_box()
    assert svg["width"] > 1.5 * width and right <= svg["x"] + svg["width"] + 1, "the second panel is cut off"
    check_offline(log)
    page.close()


@needs_chromium
@needs_vega
def test_beam_explorer_in_the_browser(browser, tmp_path):
    model, k, sources = small_model(4), 3, ["1 2 3 4", "5 6"]
    steps_rows, final_rows = explorers.beam_rows(model, DigitTokenizer(), sources, k, (0.0, 0.6, 1.0), max_len=7)
    chart = explorers.beam_explorer(model, DigitTokenizer(), sources, k, (0.0, 0.6, 1.0), max_len=7)
    page, log = open_chart(browser, chart, tmp_path / "beam.html")

    def shows(s: int, alpha: float, step: int):
        rows = [r for r in steps_rows if r["sentence"] == s and r["alpha"] == alpha]
        rows = [r for r in rows if r["step"] == min(step, rows[0]["steps"])]
        final = [r for r in final_rows if r["sentence"] == s and r["alpha"] == alpha]
        cells = drawn(page, "bar")
        want = sorted((r["hypothesis"], r["status"], f"{r['score']:.3f}") for r in rows + final)
        got = sorted((" ".join(c["hypothesis"].split()), c["status"], c["log P / penalty"]) for c in cells)  # wrapped
        assert got == want

    wait_for(page, shows, 0, 0.6, 1)  # as the page opens: sentence 1, alpha 0.6, step 1
    slider = page.locator('.vega-bindings input[name="step"]').first
    for step in (2, 4, 7):
        slider.evaluate("(e, v) => { e.value = v; e.dispatchEvent(new Event('input', {bubbles: true})); }", step)
        wait_for(page, shows, 0, 0.6, step)
    page.locator('.vega-bindings input[name="alpha"][value="0"]').check()
    wait_for(page, shows, 0, 0.0, 7)
    page.locator('.vega-bindings input[name="sentence"][value="1"]').check()
    wait_for(page, shows, 1, 0.0, 7)
    check_offline(log)
    page.close()


@needs_chromium
@needs_vega
@pytest.mark.parametrize("width", [1280, 390])
def test_the_beam_explorer_shows_its_sentences_opens_at_the_given_alpha_and_fits_a_phone(browser, tmp_path, width):
    model, k = small_model(4), 3
    sources, references = ["1 2 3 4", "5 6"], ["the reference of the first sentence", "and of the second"]
    long_source = " ".join(["7 8 9"] * 9)  # a long sentence and reference: their text must wrap, not widen the chart
    chart = explorers.beam_explorer(model, DigitTokenizer(), sources + [long_source], k, (0.0, 0.6, 1.0), max_len=7,
                                    references=references + ["a reference " * 12], alpha=1.0)
    page, log = open_chart(browser, chart, tmp_path / "beam.html")
    page.set_viewport_size({"width": width, "height": 1000})
    steps_rows, final_rows = explorers.beam_rows(model, DigitTokenizer(), sources, k, (0.0, 0.6, 1.0), max_len=7)

    def opens_at_alpha_one():
        want = sorted(r["hypothesis"] for r in final_rows if r["sentence"] == 0 and r["alpha"] == 1.0)
        got = sorted(" ".join(c["hypothesis"].split()) for c in drawn(page, "bar"))
        assert [h for h in want if h in got] == want
        texts = page.eval_on_selector_all(".vega-embed g.mark-text text", "ts => ts.map(t => t.textContent)")
        assert any("1 2 3 4" in t and "the reference of the first sentence" in t for t in texts), texts

    wait_for(page, opens_at_alpha_one)
    assert page.locator('.vega-bindings input[name="alpha"][value="1"]').is_checked()
    page.locator('.vega-bindings input[name="sentence"][value="2"]').check()
    page.wait_for_timeout(300)
    svg = page.locator(".vega-embed svg").bounding_box()
    right = page.eval_on_selector_all(".vega-embed svg *", "es => Math.max(...es.filter(e => e.getBBox)"
                                      ".map(e => e.getBoundingClientRect().right))")
    assert svg["width"] <= 360 and right <= svg["x"] + svg["width"] + 1 <= width, (svg, right)  # legend and bars in
    legend = page.eval_on_selector_all(".vega-embed g.role-legend text", "ts => ts.map(t => t.textContent)")
    assert legend == ["alive", "finished", "pruned", "chosen", "cut at max_len", "greedy"]  # none clipped
    check_offline(log)
    page.close()


def test_the_beam_explorer_refuses_an_alpha_it_did_not_search():
    with pytest.raises(ValueError, match=r"alpha must be one of alphas \(0.0, 0.6\)"):
        explorers.beam_explorer(small_model(4), DigitTokenizer(), ["1 2"], 2, (0.0, 0.6), max_len=4, alpha=1.0)
    with pytest.raises(ValueError, match="got 1 sources but 2 references"):
        explorers.beam_explorer(small_model(4), DigitTokenizer(), ["1 2"], 2, (0.0, 0.6), max_len=4,
                                references=["a", "b"])
