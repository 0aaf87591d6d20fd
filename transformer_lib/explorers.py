"""Interactive explorers for chapters 8 and 9: Vega-Altair charts that a reader handles in the static page.

Written by hand (not generated from a notebook). Each function takes numbers the chapter has just computed with the
library, puts them, rounded, into the chart, and returns an `altair` chart; the page draws it in the reader's browser,
with no kernel (CONTRIBUTING.md, 'Interactive figures'). Altair is imported inside the functions only: importing
transformer_lib does not import it.

- trace_beam_search: decoding.beam_search for one sentence, step by step, with what it kept and what it pruned.
- beam_explorer: chapter 8's explorer of that trace, a slider for the step and a choice of sentence and of
  length penalty, with each sentence's source and reference.
- attention_explorer: chapter 9's explorer of the attention maps that attention_maps.collect_attention returns.
"""

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from transformer_lib.decoding import beam_step, greedy_decode, length_penalty, output_budget
from transformer_lib.embedding import BOS_ID, EOS_ID, PAD_ID
from transformer_lib.masks import padding_mask
from transformer_lib.model import Transformer

EMBED_OPTIONS = {"embedOptions": {"actions": False, "renderer": "svg"}}  # no menu that links out; SVG marks
MODULE_KINDS = {"encoder self": "encoder.{}.self", "decoder self": "decoder.{}.self", "cross": "decoder.{}.cross"}


@torch.no_grad()
def trace_beam_search(
    model: Transformer,
    src: Tensor,
    beam_size: int = 4,
    max_len: int | None = None,
    alpha: float = 0.6,
    top: int | None = None,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
) -> list[dict]:
    """decoding.beam_search for one sentence (src of shape (1, S)), recording every step: the same beam_step, no cache.

    Returns one dict per step: "parents", the hypotheses the step extended (the beam before it); "candidates", the
    best `top` extensions of each parent (top defaults to, and is at least, beam_size, so that every kept one is
    there; a finished parent has one, itself extended by <pad> at no cost); "kept", the indices into candidates of
    the new beam, best first; "n_candidates", how many extensions the step ranked in all (the pruned ones are
    n_candidates - len(kept)). A hypothesis is a dict: "tokens" (<bos> first), "score" (summed log-probabilities),
    "length" (tokens after <bos>, <eos> included), "finished", "parent" (its index in parents) and "ranked" (score /
    length_penalty(length, alpha), the number beam search compares). The last step's best kept hypothesis, by
    "ranked", is what beam_search returns.
    """
    if src.dim() != 2 or src.size(0) != 1:
        raise ValueError(f"src must be one sentence of shape (1, S), got shape {tuple(src.shape)}")
    if beam_size < 1:
        raise ValueError(f"beam_size must be a positive integer, got {beam_size}")
    k, top = beam_size, max(top or beam_size, beam_size)
    was_training = model.training
    model.eval()
    try:
        max_len = max_len or output_budget(model, src.size(1))  # beam_search's default
        src_mask = padding_mask(src, model.cfg.pad_id)  # (1, 1, 1, S)
        memory = model.encode(src, src_mask)  # (1, S, d_model)
        beams = [{"tokens": [bos_id], "score": 0.0, "length": 0, "finished": False}]  # <bos> alone: one parent
        scores = torch.zeros(1, 1, device=src.device)  # (1, n) as in beam_search, without its k - 1 dead copies
        lengths = torch.zeros(1, dtype=torch.long, device=src.device)  # (n,)
        finished = torch.zeros(1, dtype=torch.bool, device=src.device)  # (n,)
        steps = []
        for _ in range(max_len):
            n = len(beams)
            tokens = torch.tensor([b["tokens"] for b in beams], device=src.device)  # (n, t)
            logits = model.decode(tokens, memory.expand(n, -1, -1), src_mask.expand(n, -1, -1, -1))[:, -1]  # (n, V)
            step = beam_step(torch.log_softmax(logits.float(), dim=-1), scores, lengths, finished, k, alpha,
                             model.cfg.pad_id, eos_id)
            new_lengths = lengths + (~finished).long()  # (n,) each parent's extensions' length
            best = step.ranked.topk(min(top, step.ranked.size(1)), dim=1).indices.tolist()  # (n, top): each's best
            records, where = [], {}
            for b, row in enumerate(best):
                for token in row:
                    if step.ranked[b, token].item() == float("-inf"):
                        continue
                    where[b, token] = len(records)
                    records.append({"tokens": beams[b]["tokens"] + [token], "score": step.candidates[b, token].item(),
                                    "length": int(new_lengths[b]), "finished": bool(finished[b]) or token == eos_id,
                                    "parent": b, "ranked": step.ranked[b, token].item()})
            kept = [where[b, token] for b, token in zip(step.chosen.tolist(), step.token.tolist())]  # best first
            n_candidates = int(torch.isfinite(step.ranked).sum())
            steps.append({"candidates": records, "kept": kept, "parents": beams, "n_candidates": n_candidates})
            beams = [records[i] for i in kept]
            scores, lengths, finished = step.scores, step.lengths, step.finished
            if all(b["finished"] for b in beams):
                break
        return steps
    finally:
        model.train(was_training)


def _text(tokenizer, tokens: Sequence[int]) -> str:
    """A hypothesis as text: its pieces after <bos> decoded, and "<eos>" where it has ended."""
    ids = [t for t in tokens[1:] if t not in (EOS_ID, PAD_ID)]
    words = tokenizer.decode(ids, skip_special_tokens=True) if ids else ""
    return (words + " <eos>").strip() if EOS_ID in tokens else words or "(nothing yet)"


def beam_rows(model: Transformer, tokenizer, sources: Sequence[str], beam_size: int = 4,
              alphas: Sequence[float] = (0.0, 0.6, 1.0), max_len: int | None = None, pruned_shown: int | None = None
              ) -> tuple[list[dict], list[dict]]:
    """The tables that beam_explorer draws: (step rows, final rows). Each step row is one hypothesis of one step of
    one search (sentence, alpha): the beam_size kept (status "alive" or "finished") and the best pruned_shown
    (default beam_size) of the pruned; "pruned" counts every pruned one. The final rows are each search's last beam,
    ranked by score / length penalty, and greedy decoding's choice (status "greedy") scored the same way."""
    device = next(model.parameters()).device
    pruned_shown = beam_size if pruned_shown is None else pruned_shown
    steps_rows, final_rows = [], []
    for s, sentence in enumerate(sources):
        src = torch.tensor([tokenizer.encode(sentence).ids], device=device)  # (1, S)
        cap = max_len or output_budget(model, src.size(1))
        greedy = [BOS_ID] + greedy_decode(model, src, cap, BOS_ID, EOS_ID)[0].tolist()
        greedy = greedy[: greedy.index(EOS_ID) + 1] if EOS_ID in greedy else greedy
        with torch.no_grad():  # greedy's log-probability: beam search of size 1 is greedy decoding
            greedy_trace = trace_beam_search(model, src, 1, cap, 0.0)[-1]
        greedy_best = greedy_trace["candidates"][greedy_trace["kept"][0]]
        for alpha in alphas:
            # the best pruned_shown pruned ones are among each parent's best beam_size + pruned_shown
            trace = trace_beam_search(model, src, beam_size, cap, alpha, top=beam_size + pruned_shown)
            for t, step in enumerate(trace, start=1):
                kept = set(step["kept"])
                pruned = sorted((i for i in range(len(step["candidates"])) if i not in kept),
                                key=lambda i: -step["candidates"][i]["ranked"])[:pruned_shown]
                n_finished = sum(step["candidates"][i]["finished"] for i in step["kept"])
                for rank, i in enumerate(step["kept"] + pruned, start=1):
                    c = step["candidates"][i]
                    status = ("finished" if c["finished"] else "alive") if i in kept else "pruned"
                    steps_rows.append({
                        "sentence": s, "alpha": alpha, "step": t, "steps": len(trace), "rank": rank, "status": status,
                        "hypothesis": f"{rank}. {_text(tokenizer, c['tokens'])}", "log_p": round(c["score"], 3),
                        "length": c["length"], "score": round(c["ranked"], 3), "kept": len(step["kept"]),
                        "finished": n_finished, "pruned": step["n_candidates"] - len(step["kept"]),
                    })
            last = trace[-1]
            final = sorted((last["candidates"][i] for i in last["kept"]), key=lambda c: -c["ranked"])
            shown = [(c, "chosen" if r == 0 else ("finished" if c["finished"] else "cut at max_len"))
                     for r, c in enumerate(final)]
            lp = float(length_penalty(torch.tensor(greedy_best["length"]), alpha))
            shown.append(({**greedy_best, "ranked": greedy_best["score"] / lp, "tokens": greedy}, "greedy"))
            for rank, (c, status) in enumerate(shown, start=1):
                name = "greedy" if status == "greedy" else f"{rank}."
                final_rows.append({"sentence": s, "alpha": alpha, "rank": rank, "status": status,
                                   "hypothesis": f"{name} {_text(tokenizer, c['tokens'])}",
                                   "log_p": round(c["score"], 3), "length": c["length"],
                                   "score": round(c["ranked"], 3)})
    return steps_rows, final_rows


def _wrapped(text: str, width: int, max_lines: int | None = None) -> str:
    """text broken at spaces into lines of at most width characters (a longer word stays whole), joined by newlines;
    with max_lines, the lines past it are cut and the last kept one ends with an ellipsis."""
    import textwrap

    lines = textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False) or [""]
    if max_lines is not None and len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = lines[-1][: width - 1] + "…"
    return "\n".join(lines)


def beam_explorer(model: Transformer, tokenizer, sources: Sequence[str], beam_size: int = 4,
                  alphas: Sequence[float] = (0.0, 0.6, 1.0), max_len: int | None = None,
                  references: Sequence[str] | None = None, alpha: float | None = None,
                  rows: tuple[list[dict], list[dict]] | None = None, width: int = 330):
    """An Altair chart of beam search on a few source sentences (plain text, encoded with tokenizer).

    A slider picks the step; radio buttons pick the sentence and the length penalty's alpha (one search per alpha,
    traced by trace_beam_search); the chart opens at `alpha` (default: the middle one of alphas). The top lines show
    the sentence and, when given, its reference translation. The upper panel shows the step's beam (alive and
    finished hypotheses) and the best pruned candidates, as bars of score / length penalty under each hypothesis's
    text; the lower one the search's last beam, ranked, next to greedy decoding's translation scored the same way.
    Every number comes from the traces: `rows`, when given, are the tables beam_rows returned for these arguments.
    The chart is `width` pixels wide plus a few, so that it fits a phone's screen: each hypothesis is wrapped onto at
    most two lines (a newline where a line breaks, also in its tooltip).
    """
    import altair as alt

    if references is not None and len(references) != len(sources):
        raise ValueError(f"got {len(sources)} sources but {len(references)} references; expected one each, or None")
    alpha = alphas[len(alphas) // 2] if alpha is None else alpha
    if alpha not in alphas:
        raise ValueError(f"alpha must be one of alphas {tuple(alphas)}, the searches the chart holds; got {alpha!r}")
    steps_rows, final_rows = rows if rows is not None else beam_rows(model, tokenizer, sources, beam_size, alphas,
                                                                     max_len)
    chars = max(20, width // 6)  # characters of 11-pixel text in a line of the chart
    counts = ("kept", "finished", "pruned")  # the same for every row of a step: kept once, on its first row
    steps_rows = [{key: value for key, value in row.items() if row["rank"] == 1 or key not in counts}
                  | {"hypothesis": _wrapped(row["hypothesis"], chars, 2)} for row in steps_rows]
    final_rows = [{**row, "hypothesis": _wrapped(row["hypothesis"], chars, 2)} for row in final_rows]
    sentence_rows = [{"sentence": s, "text": _wrapped(f"source: {source}", chars) + (
        "" if references is None else "\n" + _wrapped(f"reference: {references[s]}", chars))}
        for s, source in enumerate(sources)]
    lines = max(text["text"].count("\n") + 1 for text in sentence_rows)
    longest = max(row["steps"] for row in steps_rows)
    sentence = alt.param(name="sentence", value=0, bind=alt.binding_radio(
        options=list(range(len(sources))), labels=[f"{s + 1}" for s in range(len(sources))], name="sentence: "))
    alpha_param = alt.param(name="alpha", value=alpha,
                            bind=alt.binding_radio(options=list(alphas), name="length penalty α: "))
    step = alt.param(name="step", value=1, bind=alt.binding_range(min=1, max=longest, step=1, name="step: "))
    colours = alt.Scale(domain=["alive", "finished", "pruned", "chosen", "cut at max_len", "greedy"],
                        range=["#4c72b0", "#55a868", "#cccccc", "#c44e52", "#8172b3", "#dd8452"])
    tooltip = ["hypothesis:N", "status:N", alt.Tooltip("log_p:Q", title="log P", format=".3f"), "length:Q",
               alt.Tooltip("score:Q", title="log P / penalty", format=".3f")]
    x = alt.X("score:Q", title="log P / length penalty (higher is better)")
    y = alt.Y("rank:O", axis=None)
    legend = alt.Legend(orient="bottom", direction="horizontal", columns=3, title=None, labelLimit=width // 3)

    def ranked(data: str, title: str, where: str):
        """Each hypothesis as its text (up to two lines, growing upwards) just above a bar of its score, best first."""
        base = alt.Chart(alt.Data(name=data), title=alt.Title(title, anchor="start", fontSize=12)
                         ).transform_filter(where)
        bars = base.mark_bar(height=8, yOffset=14).encode(
            x=x, y=y, color=alt.Color("status:N", scale=colours, legend=legend), tooltip=tooltip)
        text = base.mark_text(align="left", baseline="bottom", yOffset=8, lineBreak="\n", fontSize=11,
                              limit=width).encode(x=alt.value(0), y=y, text="hypothesis:N")
        return alt.layer(bars, text).properties(width=width, height=alt.Step(44))

    now = "datum.sentence == sentence && datum.alpha == alpha && datum.step == min(step, datum.steps)"
    heading = alt.Chart(alt.Data(name="beam_sentences")).transform_filter("datum.sentence == sentence").mark_text(
        align="left", baseline="top", lineBreak="\n", fontSize=11, limit=width).encode(
        x=alt.value(0), y=alt.value(0), text="text:N").properties(width=width, height=14 * lines)
    counts = alt.Chart(alt.Data(name="beam_steps")).transform_filter(f"{now} && datum.rank == 1").transform_calculate(
        line="'step ' + datum.step + ' of ' + datum.steps + ': ' + datum.kept + ' kept (' + datum.finished"
             " + ' finished), ' + format(datum.pruned, ',') + ' pruned'"
    ).mark_text(align="left", baseline="top", fontSize=11, limit=width).encode(
        x=alt.value(0), y=alt.value(0), text="line:N").properties(width=width, height=14)
    steps = ranked("beam_steps", "the beam at this step, and the best it pruned", now)
    final = ranked("beam_final", "where the search ends, and greedy search",
                   "datum.sentence == sentence && datum.alpha == alpha")
    return alt.vconcat(  # the steps' table once, for two panels; the page resizes as the number of rows changes
        heading, counts, steps, final, usermeta=EMBED_OPTIONS, autosize=alt.AutoSizeParams(type="pad", resize=True),
        datasets={"beam_sentences": sentence_rows, "beam_steps": steps_rows, "beam_final": final_rows},
    ).add_params(sentence, alpha_param, step).configure_view(stroke=None)


def _blocks(maps: Mapping[str, Tensor], b: int, kind: str, n_layers: int, n_src: int, n_tgt: int) -> Tensor:
    """Sentence b's maps of one module kind without padding: (L, h, n_q, n_k), head mean prepended: (L, h + 1, ...)."""
    n_q = n_src if kind == "encoder self" else n_tgt
    n_k = n_tgt if kind == "decoder self" else n_src
    stack = torch.stack([maps[MODULE_KINDS[kind].format(i)][b, :, :n_q, :n_k].float().cpu() for i in range(n_layers)])
    return torch.cat([stack.mean(dim=1, keepdim=True), stack], dim=1)  # head 0 is the mean of the heads


def _packed(block: Tensor, causal: bool) -> str:
    """One (n_q, n_k) map as the attention explorer stores it: each weight in thousandths (0 to 1000), written as two
    base-36 digits ("00" to "rs"; the chart reads them back with parseInt(..., 36)), row by row. Of a decoder
    self-attention map (causal) only the lower triangle, diagonal included: the causal mask makes every weight above
    the diagonal exactly 0, and the chart draws those cells as 0."""
    if causal:
        if block.triu(diagonal=1).any():
            raise ValueError("a decoder self-attention map has weight above its diagonal: is its causal mask missing?")
        rows, columns = torch.tril_indices(block.size(0), block.size(1))
        block = block[rows, columns]  # (n (n + 1) / 2,): row by row
    thousandths = (block.flatten() * 1000).round().int().tolist()
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    return "".join(digits[t // 36] + digits[t % 36] for t in thousandths)


def attention_rows(maps: Mapping[str, Tensor], src_tokens: Sequence[Sequence[str]], in_tokens: Sequence[Sequence[str]],
                   out_tokens: Sequence[Sequence[str]] | None = None, untrained_maps: Mapping[str, Tensor] | None = None
                   ) -> tuple[list[dict], list[dict]]:
    """The tables that attention_explorer draws: (maps rows, label rows).

    A map row holds one (sentence, module kind, layer, model)'s maps without padding, each packed by _packed into a
    string and laid end to end under "w": for the trained model the mean of the heads, then heads 1 to h; for the
    untrained model the mean of its heads alone (all its heads would nearly double the page). Layers count from 1. A
    label row holds one (sentence, module kind)'s query and key labels ("3 Hund", position and piece), the number of
    keys, which the chart uses to cut a map into rows, and whether the map is stored as a lower triangle ("causal").
    """
    n_layers = sum(name.startswith("encoder.") for name in maps)
    models = {"trained": maps} | ({"untrained": untrained_maps} if untrained_maps is not None else {})
    map_rows, label_rows = [], []
    for b, (src, dec) in enumerate(zip(src_tokens, in_tokens)):
        out = out_tokens[b] if out_tokens is not None else dec
        src_labels = [f"{i} {t}" for i, t in enumerate(src)]
        labels = {"encoder self": (src_labels, src_labels),
                  "decoder self": ([f"{i} {t}" for i, t in enumerate(dec)],) * 2,
                  "cross": ([f"{i} {t}" for i, t in enumerate(out)], src_labels)}
        for kind, (queries, keys) in labels.items():
            causal = kind == "decoder self"
            label_rows.append({"grid": f"{b}|{kind}", "queries": queries, "keys": keys, "n_keys": len(keys),
                               "causal": causal})
            for model_name, model_maps in models.items():
                blocks = _blocks(model_maps, b, kind, n_layers, len(src), len(dec))  # (L, h + 1, n_q, n_k)
                kept = blocks.size(1) if model_name == "trained" else 1  # the untrained model: the mean alone
                for layer in range(n_layers):
                    w = "".join(_packed(blocks[layer, head], causal) for head in range(kept))
                    map_rows.append({"sentence": b, "module": kind, "layer": layer + 1, "model": model_name, "w": w})
    return map_rows, label_rows


def attention_explorer(maps: Mapping[str, Tensor], src_tokens: Sequence[Sequence[str]],
                       in_tokens: Sequence[Sequence[str]], out_tokens: Sequence[Sequence[str]] | None = None,
                       untrained_maps: Mapping[str, Tensor] | None = None, sentence_names: Sequence[str] | None = None):
    """An Altair heatmap of attention weights with controls: sentence, module kind, layer, head (or their mean).

    maps is what attention_maps.collect_attention returns (names like "decoder.2.cross", each (B, h, T_q, T_k));
    src_tokens[b] are sentence b's source pieces (keys of the encoder and of cross-attention), in_tokens[b] the
    pieces the decoder read (its self-attention's queries and keys), out_tokens[b] the pieces it wrote (labels of
    cross-attention's query rows; in_tokens when None). Padding beyond those lengths is left out. untrained_maps,
    the same maps of an untrained model, adds a checkbox that draws the untrained model's mean of the heads beside
    the trained map. Weights are shown rounded to 3 decimals; hovering a cell shows its weight. The chart unpacks
    only the map it shows (attention_rows says how the maps are stored).
    """
    import altair as alt

    map_rows, label_rows = attention_rows(maps, src_tokens, in_tokens, out_tokens, untrained_maps)
    n_layers = max(row["layer"] for row in map_rows)
    n_heads = next(iter(maps.values())).size(1)
    names = sentence_names or [f"sentence {b + 1}" for b in range(len(src_tokens))]
    params = [
        alt.param(name="sentence", value=0, bind=alt.binding_select(options=list(range(len(names))),
                                                                    labels=list(names), name="sentence: ")),
        alt.param(name="module", value="cross", bind=alt.binding_radio(options=list(MODULE_KINDS),
                                                                       name="attention: ")),
        alt.param(name="layer", value=n_layers, bind=alt.binding_select(options=list(range(1, n_layers + 1)),
                                                                        name="layer: ")),
        alt.param(name="head", value=0, bind=alt.binding_select(
            options=list(range(n_heads + 1)), labels=["mean of the heads"] + [str(h) for h in range(1, n_heads + 1)],
            name="head: ")),
    ]
    shown = "datum.model == 'trained'"
    if untrained_maps is not None:
        params.append(alt.param(name="untrained", value=False, bind=alt.binding_checkbox(
            name="the untrained model's mean of the heads beside it ")))
        shown = "(datum.model == 'trained' || untrained)"
    cells = "length(datum.queries) * datum.n_keys"  # of the map drawn: n_q x n_k
    stored = f"(datum.causal ? datum.n_keys * (datum.n_keys + 1) / 2 : {cells})"  # of each map packed in "w"
    chart = alt.Chart(alt.Data(values=map_rows)).transform_filter(
        f"datum.sentence == sentence && datum.module == module && datum.layer == layer && {shown}"
    ).transform_calculate(
        grid="datum.sentence + '|' + datum.module"
    ).transform_lookup(
        lookup="grid",
        from_=alt.LookupData(alt.Data(values=label_rows), key="grid", fields=["queries", "keys", "n_keys", "causal"]),
    ).transform_calculate(
        index=f"sequence(0, {cells})"
    ).transform_calculate(  # the first weight of the map shown: "w" holds the mean, then heads 1 to h (trained only)
        start=f"(datum.model == 'trained' ? head : 0) * {stored}"
    ).transform_flatten(
        ["index"]
    ).transform_calculate(
        q="floor(datum.index / datum.n_keys)"
    ).transform_calculate(
        k="datum.index % datum.n_keys"
    ).transform_calculate(  # where weight (q, k) lies in its map: row by row, or in the lower triangle (-1 above it)
        at="datum.causal ? (datum.k <= datum.q ? datum.q * (datum.q + 1) / 2 + datum.k : -1) : datum.index"
    ).transform_calculate(
        weight="datum.at < 0 ? 0 : parseInt(substring(datum.w, 2 * (datum.start + datum.at), "
               "2 * (datum.start + datum.at) + 2), 36) / 1000",
        query="datum.queries[datum.q]", key="datum.keys[datum.k]",
        heads="datum.model == 'trained' && head > 0 ? '' + head : 'mean'",
    ).mark_rect().encode(
        x=alt.X("key:N", sort=alt.EncodingSortField("k"), title="attended to (keys)"),
        y=alt.Y("query:N", sort=alt.EncodingSortField("q"), title="attending (queries)"),
        color=alt.Color("weight:Q", scale=alt.Scale(scheme="viridis", domain=[0, 1]), title="attention weight"),
        tooltip=["key:N", "query:N", alt.Tooltip("weight:Q", format=".3f"), "model:N", "layer:Q",
                 alt.Tooltip("heads:N", title="head")],
    ).properties(width=alt.Step(18), height=alt.Step(18))
    header = alt.Header(labelExpr="datum.value == 'untrained' ? 'untrained: mean of the heads' : datum.value")
    column = alt.Column("model:N", title=None, sort=["trained", "untrained"], header=header)
    return chart.facet(column=column).add_params(*params).properties(
        usermeta=EMBED_OPTIONS, autosize=alt.AutoSizeParams(type="pad", resize=True))  # the page makes room for the
    # second panel when the checkbox adds it
