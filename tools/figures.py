"""Draw the book's diagrams into book/figures/ (matplotlib only; no figure is copied from the paper or another book).

    python tools/figures.py               # draw every figure and rewrite book/figures/manifest.json
    python tools/figures.py --check       # exit 1, naming the figures, when one is missing, edited or out of date
    python tools/figures.py --out DIR     # draw every figure into DIR (the manifest in book/figures is left alone)
    python tools/figures.py --png DIR     # also write a PNG copy of each figure into DIR, for looking at them

Each figure is one function below, registered with `@figure(NAME, deps=...)`; `deps` names the parts of
transformer_lib whose results the drawing shows (the masks, the teacher-forcing split, beam search...). Every
figure sits on an opaque white panel with rounded corners and dark text, so it reads the same in the book's light
and dark themes.

How "out of date" is decided. Comparing a freshly drawn SVG with the stored one byte for byte would be the most
direct test, but SVG bytes change with the matplotlib version (path rounding, element order) and, for the
beam-search tree, with the floating-point details of a short training run on a given CPU: such a test would fail
on a fresh install for no fault of the figure. Instead, book/figures/manifest.json records for every figure
  - `source_sha256`: a hash of the figure's function, of the shared drawing helpers and style, and of the source
    of every transformer_lib function or class in its `deps` (those it calls or depicts directly; an edit deeper
    inside the library is not tracked); it changes when the drawing code or the library code it shows changes;
  - `file_sha256`: a hash of the SVG file as written, so that a hand edit or a file not regenerated is caught;
  - `matplotlib` and `torch`: the versions it was drawn with, for information only.
`--check` (and tests/test_figures.py) recompute both hashes and fail, naming the figure and the command to run,
when either differs or a file is missing; the test also redraws every figure into a temporary folder to prove the
script still runs and writes every file the manifest lists. Output is deterministic for given versions: a fixed
`svg.hashsalt`, no date in the metadata, DejaVu Sans (shipped with matplotlib) for every text.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import io
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch, Rectangle  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing the package

import transformer_lib as tl  # noqa: E402
from transformer_lib import decoding, explorers, masks, model, training  # noqa: E402

FIGURES_DIR = ROOT / "book" / "figures"
MANIFEST = FIGURES_DIR / "manifest.json"

# ---- style: one palette (seaborn's "deep" colours, as the book's plots use) and one font for every figure ----
STYLE = {
    "font.family": "DejaVu Sans",
    "font.size": 10,
    "svg.hashsalt": "transformer-piece-by-piece",
    "svg.fonttype": "path",  # glyphs as paths: the figure looks the same whatever fonts the reader has
    "axes.unicode_minus": True,
}
INK = "#1f1f1f"  # text and arrows
MUTED = "#6b6b6b"  # secondary text
PANEL = "#ffffff"  # the opaque background panel
EDGE = "#c8c8c8"  # panel and box outlines
BLUE, ORANGE, GREEN, RED, PURPLE, BROWN = "#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"
LIGHT = {BLUE: "#dbe4f1", ORANGE: "#f8e3d4", GREEN: "#dcefe0", RED: "#f3dcdc", PURPLE: "#e5e1f0", BROWN: "#ebe3dc"}
OFF = "#ececec"  # a False mask cell, a pruned hypothesis
HEADS = (BLUE, ORANGE, GREEN, PURPLE)

REGISTRY: dict[str, dict] = {}


def figure(name: str, deps: tuple = ()) -> Callable:
    """Register a function that returns a matplotlib Figure as the figure book/figures/NAME."""

    def register(fn: Callable) -> Callable:
        REGISTRY[name] = {"fn": fn, "deps": deps}
        return fn

    return register


def canvas(width: float, height: float) -> tuple[plt.Figure, plt.Axes]:
    """A figure of width x height inches whose axes count in inches from the lower left, on a rounded white panel."""
    fig = plt.figure(figsize=(width, height))
    fig.patch.set_alpha(0.0)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    ax.add_patch(FancyBboxPatch((0.03, 0.03), width - 0.06, height - 0.06, boxstyle="round,pad=0,rounding_size=0.18",
                                facecolor=PANEL, edgecolor=EDGE, linewidth=1.0, zorder=-10))
    return fig, ax


def box(ax, x: float, y: float, w: float, h: float, text: str = "", color: str = BLUE, fill: str | None = None,
        size: float = 10, weight: str = "normal", round_: float = 0.08, text_color: str = INK, lw: float = 1.2,
        ls: str = "-") -> None:
    """A rounded box with its lower left corner at (x, y) and centred text."""
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle=f"round,pad=0,rounding_size={round_}",
                                facecolor=LIGHT.get(color, color) if fill is None else fill, edgecolor=color,
                                linewidth=lw, linestyle=ls))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, color=text_color, weight=weight)


def arrow(ax, start: tuple, end: tuple, color: str = INK, lw: float = 1.3, style: str = "-|>", ls: str = "-",
          rad: float = 0.0, shrink: float = 2.0) -> None:
    """An arrow from start to end (inches), straight or bent by rad."""
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12, color=color, linewidth=lw,
                                 linestyle=ls, shrinkA=shrink, shrinkB=shrink,
                                 connectionstyle=f"arc3,rad={rad}"))


def text(ax, x: float, y: float, s: str, size: float = 10, color: str = INK, ha: str = "center",
         va: str = "center", **kwargs) -> None:
    """Text at (x, y) inches."""
    ax.text(x, y, s, fontsize=size, color=color, ha=ha, va=va, **kwargs)


def cell(ax, x: float, y: float, w: float, h: float, color: str, label: str = "", size: float = 9,
         text_color: str = INK) -> None:
    """One square cell of a drawn tensor."""
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor=PANEL, linewidth=1.0))
    if label:
        ax.text(x + w / 2, y + h / 2, label, ha="center", va="center", fontsize=size, color=text_color)


SHARED = (figure, canvas, box, arrow, text, cell)  # their source is part of every figure's hash


# ---- the landing page ----
# A figure drawn for a phone as well as a desktop keeps its smallest text, MIN_TEXT_PT, at least 8 CSS px
# (tests/test_browser.py, MIN_TEXT_PX) when it is shown 342 px wide, the text column of a 390 px phone. A figure W
# inches wide is shown at 342 / (72 W) px per point there, so W <= MIN_TEXT_PT * 342 / (72 * 8) = 5.3 inches for text
# of 9 points: the diagrams that carry much text are drawn in one narrow column (the book shows them at most
# 560 px wide on a desktop), not across the page.
MIN_TEXT_PT = 9


@figure("roadmap.svg")
def roadmap() -> plt.Figure:
    """The chapters against what they build: Part I's pieces of the model, Part II's training, translator and maps."""
    part_one = [
        ("1", "text → tensors", "BPE tokens, ids, padding, embeddings", ORANGE),
        ("2", "positions", "sinusoidal encodings", ORANGE),
        ("3", "attention", "softmax(QKᵀ/√d_k) V", BLUE),
        ("4", "masks", "padding and causal masks", BLUE),
        ("5", "multi-head", "h heads in parallel, one projection", BLUE),
        ("6", "the model", "encoder–decoder, = nn.Transformer", PURPLE),
    ]
    part_two = [
        ("7", "training on a toy task", "teacher forcing, label smoothing, warm-up,\ngreedy decoding (CPU, 1 min)",
         GREEN),
        ("8", "a German→English translator", "Multi30k, beam search, KV cache;\ntest BLEU 37.5 on a 2-core CPU", RED),
        ("9", "attention heatmaps", "what the trained heads look at:\nalignments, every head, ablation", RED),
    ]
    width, left, gap = 5.2, 0.25, 0.13
    right = width - left
    h1, h2 = 0.38, 0.74  # a row of Part I (title and what, one line), of Part II (title, then two lines)
    height = 0.5 + 0.4 + len(part_one) * (h1 + gap) + 0.75 + len(part_two) * (h2 + gap) + 1.15
    fig, ax = canvas(width, height)
    y = height - 0.38
    text(ax, left, y, "Part I — the pieces of the model (transformer_lib)", weight="bold", size=10.5, ha="left",
         color=BLUE)
    y -= 0.3
    for i, (number, title, what, color) in enumerate(part_one):
        y -= h1
        box(ax, left, y, right - left, h1, "", color=color)
        text(ax, left + 0.12, y + h1 / 2, f"{number}  {title}", size=9.5, weight="bold", ha="left")
        text(ax, left + 1.55, y + h1 / 2, what, size=MIN_TEXT_PT, ha="left")
        if i:
            arrow(ax, (left + 0.3, y + h1 + gap), (left + 0.3, y + h1), shrink=0.5)
        y -= gap
    end_of_six = y + gap
    y -= 0.75
    text(ax, left, y + 0.12, "Part II — training it and looking inside", weight="bold", size=10.5, ha="left",
         color=RED)
    y -= 0.1
    for i, (number, title, what, color) in enumerate(part_two):
        y -= h2
        box(ax, left, y, right - left, h2, "", color=color)
        text(ax, left + 0.12, y + h2 - 0.17, f"{number}  {title}", size=9.5, weight="bold", ha="left")
        text(ax, left + 0.42, y + 0.27, what, size=MIN_TEXT_PT, ha="left")
        if i:
            arrow(ax, (left + 0.3, y + h2 + gap), (left + 0.3, y + h2), shrink=0.5)
        else:
            start_of_seven = y + h2
        y -= gap
    arrow(ax, (right - 0.3, end_of_six), (right - 0.3, start_of_seven), color=PURPLE, lw=1.5, shrink=0.5)
    text(ax, right - 0.42, end_of_six - 0.2, "chapter 6's model is the one Part II trains", size=MIN_TEXT_PT,
         color=PURPLE, ha="right", va="center")
    text(ax, left, y - 0.08, "Appendices", weight="bold", size=9.5, ha="left", color=MUTED)
    text(ax, left, y - 0.62, "common bugs and the tests that catch them ·\nperformance, measured · scaling out with "
         "torchrun ·\nopus_books, BPE against words · PyTorch Lightning", size=MIN_TEXT_PT, ha="left", color=MUTED)
    return fig


# ---- chapter 1 ----
@figure("text_to_tensors.svg", deps=(tl.pad_batch, tl.TokenEmbedding))
def text_to_tensors() -> plt.Figure:
    """Two sentences -> tokens with <bos>/<eos> -> ids -> a padded (B, L) batch -> embedding rows (B, L, d_model),
    each token's id and embedding column drawn under it."""
    sentences = ["Ein Hund läuft .", "Zwei Kinder spielen im Park ."]
    words = sorted({w for s in sentences for w in s.split()})
    vocab = {t: i for i, t in enumerate([*tl.SPECIAL_TOKENS, *words])}
    token_lists = [["<bos>", *s.split(), "<eos>"] for s in sentences]  # as encode_words and both tokenizers add them
    ids = [[vocab[w] for w in tokens] for tokens in token_lists]
    batch = tl.pad_batch(ids, tl.PAD_ID)  # (B, L)
    torch.manual_seed(0)
    embed = tl.TokenEmbedding(len(vocab), 6, tl.PAD_ID)
    with torch.no_grad():
        rows = embed(batch)  # (B, L, d_model)
    B, L = batch.shape
    d_model = rows.size(-1)
    x0, col, tw = 0.82, 0.54, 0.51  # where the token columns start, one column's width, a token box's width
    cw, eh = 0.3, 0.09  # an id cell's width, an embedding cell's height
    block = 1.95  # the height of one sentence's rows
    fig, ax = canvas(x0 + L * col + 0.15, 2 * block + 1.75)
    scale = float(rows.abs().max())
    for b, sentence in enumerate(sentences):
        top = 2 * block + 1.6 - b * block  # the top of this sentence's rows
        labels = (("text", top - 0.16), ("tokens", top - 0.55), ("ids", top - 0.92),
                  ("embedding", top - 1.1 - d_model * eh / 2))
        for label, y in labels:
            text(ax, 0.2, y, label, size=MIN_TEXT_PT, ha="left", color=MUTED)
        box(ax, x0, top - 0.3, 2.3, 0.28, f"“{sentence}”", color=BROWN, size=MIN_TEXT_PT)
        tokens = token_lists[b] + ["<pad>"] * (L - len(token_lists[b]))
        for t, token in enumerate(tokens):
            x = x0 + t * col  # this token's column
            pad = token == "<pad>"
            box(ax, x, top - 0.69, tw, 0.28, token, color=EDGE if pad else ORANGE, fill=OFF if pad else None,
                size=MIN_TEXT_PT, text_color=MUTED if pad else INK, round_=0.05)
            is_pad = int(batch[b, t]) == tl.PAD_ID
            cell(ax, x + (tw - cw) / 2, top - 1.07, cw, 0.28, OFF if is_pad else LIGHT[BLUE], str(int(batch[b, t])),
                 size=MIN_TEXT_PT, text_color=MUTED if is_pad else INK)
            for d in range(d_model):  # one column of d_model numbers per token: blue > 0, orange < 0
                v = float(rows[b, t, d]) / scale
                rgb = matplotlib.colors.to_rgb(BLUE if v >= 0 else ORANGE)
                ax.add_patch(Rectangle((x + (tw - cw) / 2, top - 1.15 - (d + 1) * eh), cw, eh,
                                       facecolor=tuple(1 - abs(v) * (1 - c) for c in rgb), edgecolor=EDGE,
                                       linewidth=0.4))
    text(ax, 0.2, 1.0, f"B = {B} sentences, padded to L = {L} tokens; <bos> and <eos>\nmark start and end; "
         f"<pad> has id {tl.PAD_ID}, <bos> {tl.BOS_ID}, <eos> {tl.EOS_ID};\nd_model = {d_model} numbers per token, "
         f"and the <pad> columns are zero", size=MIN_TEXT_PT, color=MUTED, ha="left")
    key_y = 0.3  # the colour key of the embedding columns
    for k, (colour, label) in enumerate(((BLUE, "> 0"), (ORANGE, "< 0"))):
        x = 0.2 + k * 1.1
        for shade in range(3):
            level = (shade + 1) / 3
            rgb = matplotlib.colors.to_rgb(colour)
            ax.add_patch(Rectangle((x + shade * 0.18, key_y - 0.08), 0.18, 0.16,
                                   facecolor=tuple(1 - level * (1 - c) for c in rgb), edgecolor=EDGE, linewidth=0.4))
        text(ax, x + 0.6, key_y, label, size=MIN_TEXT_PT, ha="left")
    text(ax, 2.45, key_y, "a deeper colour: a larger |value|", size=MIN_TEXT_PT, color=MUTED, ha="left")
    return fig


# ---- chapter 2 ----
def _turn_arc(ax, cx: float, cy: float, radius: float, start: float, end: float, color: str, lw: float = 1.3,
              head: bool = True) -> None:
    """An arc of the circle of the given radius around (cx, cy), from angle start to angle end (radians,
    counterclockwise), with an arrowhead at its end unless head is False."""
    points = [(cx + radius * math.cos(a), cy + radius * math.sin(a)) for a in (start, end)]
    bend = math.tan((end - start) / 4)  # arc3's rad that makes the curve a circular arc: sagitta over half the chord
    arrow(ax, points[0], points[1], color=color, lw=lw, rad=bend, style="-|>" if head else "-", shrink=0.0)


@figure("rotation.svg", deps=(tl.sinusoidal_encoding,))
def rotation() -> plt.Figure:
    """Chapter 2's rotation. Pair i of PE_pos, drawn as the point (cos, sin) of the angle pos * omega_i, goes round a
    circle: moving k positions on turns it by k * omega_i, wherever it starts. Two positions turned together keep the
    angle between them, so their dot product depends on p - q only. Every point is read from tl.sinusoidal_encoding."""
    d_model = 16
    pe = tl.sinusoidal_encoding(12, d_model)  # (12, 16)
    omega = [10000 ** (-2 * i / d_model) for i in range(d_model // 2)]  # the pairs' angular frequencies
    gram = pe @ pe.T  # (12, 12): gram[p, q] = PE_p . PE_q
    assert abs(float(gram[1, 3] - gram[4, 6])) < 1e-5  # the claim of part 2
    size = MIN_TEXT_PT
    radius = 0.8
    width, height = 5.2, 6.55
    fig, ax = canvas(width, height)

    def point(cx: float, cy: float, pos: int, pair: int, scale: float = 1.0) -> tuple[float, float]:
        """Where pair `pair` of PE_pos lies on the circle around (cx, cy): cos across, sin up."""
        return cx + scale * radius * float(pe[pos, 2 * pair + 1]), cy + scale * radius * float(pe[pos, 2 * pair])

    def circle(cx: float, cy: float, cos_below: bool = True) -> None:
        """The unit circle of one pair, with its axes: cos across, sin up (labelled left of the axis's top)."""
        ax.add_patch(Circle((cx, cy), radius, facecolor="none", edgecolor=EDGE, linewidth=1.0))
        ax.plot([cx - radius - 0.12, cx + radius + 0.12], [cy, cy], color=EDGE, lw=0.8)
        ax.plot([cx, cx], [cy - radius - 0.12, cy + radius + 0.12], color=EDGE, lw=0.8)
        text(ax, cx + radius + 0.1, cy + (-0.15 if cos_below else 0.15), "cos", size=size, color=MUTED, ha="left")
        text(ax, cx - 0.08, cy + radius + 0.1, "sin", size=size, color=MUTED, ha="right")

    def mid_label(cx: float, cy: float, a: float, b: float, scale: float, label: str, colour: str) -> None:
        mid = (a + b) / 2
        text(ax, cx + scale * radius * math.cos(mid), cy + scale * radius * math.sin(mid), label, size=size,
             color=colour, weight="bold")

    # part 1: one position on turns pair i by omega_i; k positions on by k * omega_i, from any starting position
    text(ax, 0.22, height - 0.3, "1  k positions on: every pair turns by kω", weight="bold", ha="left", color=BLUE)
    cy = height - 1.62
    for pair, cx in ((0, 1.32), (1, 3.88)):
        circle(cx, cy)
        for start, colour in ((0, GREEN), (3, ORANGE)):  # two shifts by k = 2, from position 0 and from 3
            a, b = start * omega[pair], (start + 2) * omega[pair]
            _turn_arc(ax, cx, cy, 0.62 * radius, a, b, colour)
            mid_label(cx, cy, a, b, 0.42, "2ω", colour)
        for pos in range(6):
            x, y = point(cx, cy, pos, pair)
            ax.plot([x], [y], "o", color=BLUE, markersize=5)
            text(ax, *point(cx, cy, pos, pair, 1.2), str(pos), size=size, weight="bold")
        text(ax, cx, cy - radius - 0.35, f"pair {pair}: dimensions {2 * pair} and {2 * pair + 1}", size=size)
        text(ax, cx, cy - radius - 0.58, f"ω = {omega[pair]:.3g} rad per position", size=size, color=MUTED)
    text(ax, 0.22, cy - radius - 0.8, "Positions 0 to 5 of PE (d_model = 16). From 0 to 2 and from 3 to 5\n"
         "the turn is the same, 2ω: the rotation R(kω) does not depend on pos.", size=size, color=MUTED,
         ha="left", va="top")

    # part 2: two positions turned together keep the angle between them, so the dot product keeps its value
    p2 = cy - radius - 1.45  # the top of part 2
    ax.plot([0.22, width - 0.22], [p2 + 0.12, p2 + 0.12], color=EDGE, lw=1.0)
    text(ax, 0.22, p2 - 0.2, "2  turned together, two positions keep their angle", weight="bold", ha="left",
         color=GREEN)
    cx, cy, pair, k = 1.32, p2 - 1.45, 0, 3
    circle(cx, cy, cos_below=False)
    for (p, q), colour in (((1, 3), BLUE), ((1 + k, 3 + k), ORANGE)):
        for pos in (p, q):
            arrow(ax, (cx, cy), point(cx, cy, pos, pair), color=colour, lw=1.5, shrink=0.0)
            text(ax, *point(cx, cy, pos, pair, 1.2), str(pos), size=size, weight="bold", color=colour)
        _turn_arc(ax, cx, cy, 0.3 * radius, p * omega[pair], q * omega[pair], colour, lw=1.1, head=False)
        mid_label(cx, cy, p * omega[pair], q * omega[pair], 0.5, "2ω", colour)
    lines = [("pair 0 at positions 1 and 3,", BLUE), (f"then both moved on by {k}:", ORANGE),
             (f"each turns by {k}ω, and the angle", INK), ("between them stays 2ω.", INK),
             ("The dot product adds cos((p − q)ω)", INK), ("over the pairs: p − q alone counts.", INK),
             (f"PE₁ · PE₃ = {gram[1, 3]:.3f}", BLUE), (f"PE₄ · PE₆ = {gram[4, 6]:.3f}", ORANGE)]
    for row, (line, colour) in enumerate(lines):
        text(ax, 2.48, cy + 0.8 - row * 0.23, line, size=size, color=colour, ha="left",
             weight="bold" if row >= 6 else "normal")
    return fig


# ---- chapter 3 ----
@figure("attention_row.svg", deps=())
def attention_row() -> plt.Figure:
    """Chapter 3's soft lookup: one query against four keys, softmax weights, the weighted sum of the values. Drawn in
    two stacked parts, narrow enough for a phone: (1) the query scored against every key and the scores' softmax,
    (2) each value scaled by its weight and the products summed."""
    names = ["kitten", "wolf", "scooter", "lorry"]
    features = ["animal", "vehicle", "small", "large"]
    keys = torch.tensor([[1.0, 0, 1, 0], [1, 0, 0, 1], [0, 1, 1, 0], [0, 1, 0, 1]])  # (4, 4), as in chapter 3
    values = torch.tensor([[4.0, 0], [4, 0], [0, 2], [0, 6]])  # (4, 2): legs, wheels
    query = torch.tensor([1.0, 0, 1, 0])  # "a small animal"
    scores = keys @ query  # (4,)
    weights = torch.softmax(scores, dim=-1)  # (4,)
    output = weights @ values  # (2,)

    size = MIN_TEXT_PT
    cw, ch, rh = 0.42, 0.32, 0.42  # a number cell's width and height, a row's height
    # from the top: part 1's title and headers (1.72), its rows and the query (4 rh + 0.15), the gap to part 2 (0.5),
    # part 2's title and headers (1.38), its rows and the sum (4 rh + 0.15), the note under it (0.75)
    width, height = 5.2, 1.72 + 0.5 + 1.38 + 2 * (4 * rh + 0.15) + 0.75
    fig, ax = canvas(width, height)
    nx = 1.0  # the right edge of the row names
    best = int(weights.argmax())

    # part 1: the query against every key, and the softmax of the scores
    kx, sx, wx = 1.08, 3.12, 3.86  # key, score and weight columns
    text(ax, 0.22, height - 0.3, "1  score every key, then softmax", weight="bold", ha="left", color=PURPLE)
    hy = height - 0.72
    text(ax, kx + 2 * cw, hy, "keys $k_j$", weight="bold")
    text(ax, sx + 0.27, hy, "score\n$q \\cdot k_j$", weight="bold")
    text(ax, wx + 0.6, hy, "weight $a_j$\n= softmax", weight="bold")
    for f, feature in enumerate(features):
        text(ax, kx + (f + 0.5) * cw, hy - 0.5, feature, size=size, color=MUTED, rotation=35)
    top = hy - 1.0  # the lower edge of the first row's cells
    for j, name in enumerate(names):
        y = top - j * rh
        text(ax, nx, y + ch / 2, name, ha="right")
        for f in range(4):
            on = keys[j, f] > 0
            cell(ax, kx + f * cw, y, cw, ch, LIGHT[BLUE] if on else OFF, f"{keys[j, f]:.0f}", size=size,
                 text_color=INK if on else MUTED)
        arrow(ax, (kx + 4 * cw + 0.04, y + ch / 2), (sx - 0.04, y + ch / 2), color=MUTED, lw=0.9)
        cell(ax, sx, y, 0.54, ch, LIGHT[PURPLE], f"{scores[j]:.0f}", size=size)
        bar = 1.25 * float(weights[j])
        ax.add_patch(Rectangle((wx, y + 0.05), bar, ch - 0.1, facecolor=GREEN, edgecolor="none"))
        text(ax, wx + bar + 0.06, y + ch / 2, f"{weights[j]:.3f}", ha="left", size=size,
             weight="bold" if j == best else "normal")
    qy = top - 4 * rh - 0.15  # the query, under the keys it is compared with
    text(ax, nx, qy + ch / 2, "query $q$", ha="right", weight="bold")
    for f in range(4):
        cell(ax, kx + f * cw, qy, cw, ch, LIGHT[RED] if query[f] > 0 else OFF, f"{query[f]:.0f}", size=size)
    text(ax, kx + 2 * cw, qy - 0.2, "“a small animal”", size=size, color=MUTED)
    arrow(ax, (kx + 4 * cw + 0.04, qy + ch / 2), (sx + 0.27, top - 3 * rh - 0.03), color=RED, rad=0.3)
    text(ax, sx + 0.62, qy + 0.12, "dot product\nwith every key", size=size, color=RED, ha="left")

    # part 2: each value times its weight, and the sum of the products
    vw, vx, px = 0.5, 1.08, 3.12  # a cell's width here, the value and product columns
    p2 = qy - 0.5  # the top of part 2
    ax.plot([0.22, width - 0.22], [p2 + 0.12, p2 + 0.12], color=EDGE, lw=1.0)
    text(ax, 0.22, p2 - 0.2, "2  blend the values by the weights", weight="bold", ha="left", color=GREEN)
    hy = p2 - 0.58
    text(ax, vx + vw, hy, "values $v_j$", weight="bold")
    text(ax, (vx + 2 * vw + px) / 2, hy, "× $a_j$", weight="bold", color=GREEN)
    text(ax, px + vw, hy, "$a_j\\, v_j$", weight="bold")
    for c, name in enumerate(["legs", "wheels"]):
        for x in (vx, px):
            text(ax, x + (c + 0.5) * vw, hy - 0.3, name, size=size, color=MUTED)
    top = hy - 0.8
    for j, name in enumerate(names):
        y = top - j * rh
        text(ax, nx, y + ch / 2, name, ha="right")
        for c in range(2):
            cell(ax, vx + c * vw, y, vw, ch, LIGHT[ORANGE], f"{values[j, c]:.0f}", size=size)
            cell(ax, px + c * vw, y, vw, ch, LIGHT[GREEN], f"{weights[j] * values[j, c]:.2f}" if values[j, c] else "0",
                 size=size)
        arrow(ax, (vx + 2 * vw + 0.04, y + ch / 2), (px - 0.04, y + ch / 2), color=MUTED, lw=0.9)
        text(ax, (vx + 2 * vw + px) / 2, y + ch / 2 + 0.12, f"× {weights[j]:.3f}", size=size, color=GREEN,
             weight="bold" if j == best else "normal")
    oy = top - 4 * rh - 0.15  # the sum, under the products
    ax.plot([px, px + 2 * vw], [oy + ch + 0.07, oy + ch + 0.07], color=INK, lw=1.0)
    for c in range(2):
        cell(ax, px + c * vw, oy, vw, ch, GREEN, f"{output[c]:.2f}", text_color=PANEL, size=size)
    text(ax, px - 0.1, oy + ch / 2, "output $\\sum_j a_j v_j$", ha="right", weight="bold")
    text(ax, px + 2 * vw + 0.1, oy + ch / 2, f"{output[0]:.1f} legs,\n{output[1]:.1f} wheels", size=size,
         color=MUTED, ha="left")
    text(ax, 0.22, oy - 0.42, "The weights are positive and sum to 1; the output is a blend\nof the values, pulled "
         "towards the best-matching key.", size=size, color=MUTED, ha="left")
    return fig


@figure("attention_pipeline.svg", deps=(tl.scaled_dot_product_attention,))
def attention_pipeline() -> plt.Figure:
    """Chapter 3's function as a pipeline, top to bottom: Q, K, V -> scores Q K^T -> divided by sqrt(d_k) -> masked
    -> softmax over the keys -> weights @ V, each step with its code, its shape and the numbers of one small example
    (the last key is padding), computed here and checked against tl.scaled_dot_product_attention."""
    T_q, T_k, d_k, d_v = 3, 4, 8, 5  # the sizes of the chapter's first example, without the batch
    generator = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(n, d, generator=generator) for n, d in ((T_q, d_k), (T_k, d_k), (T_k, d_v)))
    mask = torch.tensor([[True, True, True, False]])  # (1, T_k): the last key is padding
    raw = q @ k.T  # (T_q, d_k) @ (d_k, T_k) -> (T_q, T_k)
    scaled = raw / math.sqrt(d_k)  # (T_q, T_k)
    masked = scaled.masked_fill(~mask, float("-inf"))  # (T_q, T_k)
    weights = torch.softmax(masked, dim=-1)  # (T_q, T_k)
    out = weights @ v  # (T_q, T_k) @ (T_k, d_v) -> (T_q, d_v)
    library_out, library_weights = tl.scaled_dot_product_attention(q, k, v, mask=mask)
    torch.testing.assert_close(library_out, out)  # the drawing is what the library computes
    torch.testing.assert_close(library_weights, weights)

    size = MIN_TEXT_PT
    s = 0.13  # a cell of the Q, K and V grids
    cw, ch, gap = 0.44, 0.25, 0.36  # a number cell's width and height; the space between two steps
    mx, tx = 0.62, 2.6  # the left edge of the step matrices; the left edge of the step texts
    head = 0.45 + 4 * s + 0.95  # from the top edge to the first step's matrix: the inputs and the arrows
    width, height = 5.2, head + 5 * 3 * ch + 4 * gap + 0.95
    fig, ax = canvas(width, height)
    scale = float(torch.cat([q.flatten(), k.flatten(), v.flatten(), out.flatten()]).abs().max())

    def grid(x: float, top: float, values: torch.Tensor, cell_w: float = s, cell_h: float = s) -> None:
        """A tensor as a grid of cells, blue > 0 and orange < 0, deeper for a larger |value|."""
        for r in range(values.size(0)):
            for c in range(values.size(1)):
                level = float(values[r, c]) / scale
                rgb = matplotlib.colors.to_rgb(BLUE if level >= 0 else ORANGE)
                ax.add_patch(Rectangle((x + c * cell_w, top - (r + 1) * cell_h), cell_w, cell_h, edgecolor=EDGE,
                                       linewidth=0.4, facecolor=tuple(1 - abs(level) * (1 - part) for part in rgb)))

    # the inputs, and Q and K into step 1
    top = height - 0.45
    for name, x, values, shape in (("Q", mx, q, "(B, T_q, d_k)"), ("K", 1.95, k, "(B, T_k, d_k)"),
                                   ("V", 3.55, v, "(B, T_k, d_v)")):
        text(ax, x + values.size(1) * s / 2, top + 0.17, name, weight="bold")
        grid(x, top, values)
        text(ax, x + values.size(1) * s / 2, top - 4 * s - 0.17, shape, size=size)
    text(ax, 3.55 + d_v * s / 2, top - 4 * s - 0.4, "(used in step 5)", size=size, color=MUTED)
    y = height - head  # the top of the current step's matrix
    arrow(ax, (mx + 4 * s, top - 4 * s - 0.32), (mx + 2 * cw - 0.2, y + 0.24))
    arrow(ax, (1.95 + 4 * s, top - 4 * s - 0.32), (mx + 2 * cw + 0.2, y + 0.24))
    for j in range(T_k):
        text(ax, mx + (j + 0.5) * cw, y + 0.1, f"k{j + 1}", size=size, color=MUTED)

    def signed(x: float, digits: int) -> str:
        return f"{x:.{digits}f}".replace("-", "−")  # a minus sign, not a hyphen

    steps = [("1  scores Q Kᵀ", ["q @ k.transpose(-2, -1)", "(B, T_q, d_k) @ (B, d_k, T_k)", "→ (B, T_q, T_k)"],
              [[signed(x, 1) for x in row] for row in raw.tolist()]),
             ("2  divide by √d_k", [f"/ math.sqrt(d_k), here √{d_k}:", "scores of variance about 1",
                                    "(B, T_q, T_k)"], [[signed(x, 2) for x in row] for row in scaled.tolist()]),
             ("3  mask: −∞ where False", ["masked_fill(~mask, -inf)", "mask (B, 1, T_k) broadcasts;",
                                          "the last key is padding"],
              [[signed(x, 2) if m else "−∞" for x, m in zip(row, mask[0].tolist())] for row in scaled.tolist()]),
             ("4  softmax over the keys", ["softmax(scores, dim=-1)", "weights (B, T_q, T_k): rows",
                                           "sum to 1, and −∞ gives 0"],
              [[signed(x, 2) for x in row] for row in weights.tolist()]),
             ("5  weights @ V", ["(B, T_q, T_k) @ (B, T_k, d_v)", "→ (B, T_q, d_v): each query's",
                                 "blend of the values"], None)]
    for number, (title, lines, cells) in enumerate(steps):
        for i in range(T_q):
            text(ax, mx - 0.08, y - (i + 0.5) * ch, f"q{i + 1}", size=size, color=MUTED, ha="right")
        if cells is None:  # the output, coloured as the inputs are
            grid(mx, y, out, cell_w=0.3, cell_h=ch)
        for i, row in enumerate(cells or []):
            for j, label in enumerate(row):
                off = number >= 2 and not bool(mask[0, j])  # masked: -inf, then weight 0
                fill, ink = (OFF, MUTED) if off else (LIGHT[PURPLE], INK)
                if number == 3 and not off:  # the weights: deeper green for a larger weight
                    w = float(weights[i, j])
                    fill = tuple(1 - (0.15 + 0.85 * w) * (1 - part) for part in matplotlib.colors.to_rgb(GREEN))
                    ink = PANEL if w > 0.6 else INK
                cell(ax, mx + j * cw, y - (i + 1) * ch, cw, ch, fill, label, size=size, text_color=ink)
        text(ax, tx, y - 0.04, title, weight="bold", ha="left", va="top")
        for r, line in enumerate(lines):
            text(ax, tx, y - 0.3 - r * 0.2, line, size=size, ha="left", va="top")
        if number < len(steps) - 1:
            arrow(ax, (mx + 2 * cw, y - 3 * ch - 0.02), (mx + 2 * cw, y - 3 * ch - gap + 0.02))
            y -= 3 * ch + gap
    text(ax, 0.22, y - 3 * ch - 0.25, "The function returns the output and the weights. Here T_q = 3\nqueries, "
         "T_k = 4 keys, d_k = 8, d_v = 5; B stands for the batch and\nany dimension before it (the heads, chapter "
         "5).", size=size, color=MUTED, ha="left", va="top")
    return fig


# ---- chapter 4 ----
def _mask_grid(ax, x0: float, y0: float, grid: torch.Tensor, labels: list[str], size: float = 0.5) -> None:
    """Draw a (T_q, T_k) boolean grid with the top-left cell at (x0, y0); True cells blue, False grey."""
    for i in range(grid.size(0)):
        for j in range(grid.size(1)):
            on = bool(grid[i, j])
            cell(ax, x0 + j * size, y0 - (i + 1) * size, size, size, BLUE if on else OFF,
                 "True" if on else "False", size=7.5, text_color=PANEL if on else MUTED)
    for j, label in enumerate(labels):
        text(ax, x0 + (j + 0.5) * size, y0 + 0.08, label, size=8.5, rotation=35, ha="left", va="bottom",
             rotation_mode="anchor")
    for i, label in enumerate(labels):
        text(ax, x0 - 0.08, y0 - (i + 0.5) * size, label, size=8.5, ha="right")


@figure("masks.svg", deps=(masks.padding_mask, masks.causal_mask))
def mask_grids() -> plt.Figure:
    """The padding mask over a padded German source and the causal mask over an English target."""
    source = ["Ein", "Hund", "läuft", "<pad>", "<pad>"]
    target = ["<bos>", "A", "dog", "runs", "."]
    words = [t for t in dict.fromkeys(source + target) if t not in tl.SPECIAL_TOKENS]
    vocab = {t: i for i, t in enumerate([*tl.SPECIAL_TOKENS, *words])}
    src = torch.tensor([[vocab[t] for t in source]])  # (1, S)
    pad = masks.padding_mask(src, tl.PAD_ID)  # (1, 1, 1, S)
    causal = masks.causal_mask(len(target))  # (1, 1, T, T)
    S, T = len(source), len(target)

    fig, ax = canvas(10.0, 5.6)
    size = 0.5
    # left: the stored padding mask, one row, and its broadcast over the queries
    lx = 1.25
    text(ax, lx + S * size / 2, 5.25, "padding mask of the source", weight="bold", size=11)
    text(ax, lx + S * size / 2, 4.95, f"padding_mask(src, pad_id): shape {tuple(pad.shape)}", size=8.5, color=MUTED)
    for j in range(S):
        on = bool(pad[0, 0, 0, j])
        cell(ax, lx + j * size, 4.3, size, size, BLUE if on else OFF, "True" if on else "False", size=7.5,
             text_color=PANEL if on else MUTED)
    text(ax, lx - 0.08, 4.55, "stored", size=8.5, ha="right", color=MUTED)
    arrow(ax, (lx + S * size + 0.25, 4.55), (lx + S * size + 0.25, 3.2), rad=-0.3, color=MUTED)
    text(ax, lx + S * size + 0.55, 3.9, "broadcast:\nthe same row\nfor every query", size=8.5, color=MUTED,
         ha="left")
    _mask_grid(ax, lx, 3.05, pad[0, 0].expand(S, S), source, size)
    text(ax, lx + S * size / 2, 0.25, "keys (columns) that may be attended to", size=8.5, color=MUTED)
    text(ax, 0.25, 1.8, "queries", rotation=90, size=8.5, color=MUTED)
    # right: the causal mask
    rx = 6.6
    text(ax, rx + T * size / 2, 5.25, "causal mask of the target", weight="bold", size=11)
    text(ax, rx + T * size / 2, 4.95, f"causal_mask({T}): shape {tuple(causal.shape)}", size=8.5, color=MUTED)
    text(ax, rx + T * size / 2, 4.55, "query i may look at keys j ≤ i:\nitself and the words before it", size=8.5,
         color=MUTED)
    _mask_grid(ax, rx, 3.05, causal[0, 0], target, size)
    text(ax, rx + T * size / 2, 0.25, "keys (columns) that may be attended to", size=8.5, color=MUTED)
    text(ax, rx - 0.9, 1.8, "queries", rotation=90, size=8.5, color=MUTED)
    # legend
    cell(ax, 3.95, 1.05, 0.3, 0.3, BLUE)
    text(ax, 4.32, 1.2, "True: may be\nattended to", size=8.5, ha="left")
    cell(ax, 3.95, 0.6, 0.3, 0.3, OFF)
    text(ax, 4.32, 0.75, "False: hidden", size=8.5, ha="left")
    return fig


# ---- chapter 5 ----
def _matrix(ax, x: float, y: float, rows: int, cols: int, colours: list[str], size: float = 0.13) -> None:
    """A rows x cols grid of cells with its lower left corner at (x, y); colours[c] colours column c."""
    for r in range(rows):
        for c in range(cols):
            ax.add_patch(Rectangle((x + c * size, y + (rows - 1 - r) * size), size, size, facecolor=colours[c],
                                   edgecolor=PANEL, linewidth=0.6))


@figure("heads_split_merge.svg", deps=(tl.MultiHeadAttention.split_heads, tl.MultiHeadAttention.merge_heads))
def heads_split_merge() -> plt.Figure:
    """d_model features -> n_heads groups of d_k -> one (T, d_k) matrix per head -> attention -> concatenate -> W^O."""
    T, d_model, h = 6, 16, 4
    d_k = d_model // h
    mha = tl.MultiHeadAttention(d_model, h)
    x = torch.zeros(1, T, d_model)
    assert mha.split_heads(x).shape == (1, h, T, d_k) and mha.merge_heads(mha.split_heads(x)).shape == x.shape
    s = 0.13
    head_cols = [HEADS[c // d_k] for c in range(d_model)]
    light_cols = [LIGHT[HEADS[c // d_k]] for c in range(d_model)]
    fig, ax = canvas(10.0, 5.5)
    text(ax, 0.3, 5.2, "split", weight="bold", size=11, ha="left")
    text(ax, 0.3, 2.55, "merge", weight="bold", size=11, ha="left")
    # --- split row ---
    y = 3.6
    _matrix(ax, 0.35, y, T, d_model, head_cols, s)
    text(ax, 0.35 + d_model * s / 2, y + T * s + 0.35, "w_q(x): all heads' queries", size=9)
    text(ax, 0.35 + d_model * s / 2, y + T * s + 0.15, f"(B, T, d_model) = (B, {T}, {d_model})", size=8.5, color=MUTED)
    for i in range(h):
        text(ax, 0.35 + (i + 0.5) * d_k * s, y - 0.15, f"head {i}", size=7.5, color=HEADS[i])
    text(ax, 0.25, y + T * s / 2, "T", size=8, color=MUTED)
    arrow(ax, (2.55, y + 0.4), (3.15, y + 0.4))
    text(ax, 2.85, y + 0.65, "view", size=8.5)
    gx = 3.25
    for i in range(h):
        _matrix(ax, gx + i * (d_k * s + 0.12), y, T, d_k, [HEADS[i]] * d_k, s)
    text(ax, gx + 1.2, y + T * s + 0.35, "the features read as h groups of d_k", size=9)
    text(ax, gx + 1.2, y + T * s + 0.15, f"(B, T, h, d_k) = (B, {T}, {h}, {d_k})", size=8.5, color=MUTED)
    text(ax, gx + 1.2, y - 0.15, "no data moved", size=7.5, color=MUTED)
    arrow(ax, (5.75, y + 0.4), (6.5, y + 0.4))
    text(ax, 6.2, y + 0.65, "transpose(1, 2)", size=8)
    hx = 6.75
    for i in reversed(range(h)):
        _matrix(ax, hx + i * 0.32, y - i * 0.22 + 0.3, T, d_k, [HEADS[i]] * d_k, s)
    text(ax, hx + 1.3, y + T * s + 0.62, "one (T, d_k) matrix per head", size=9)
    text(ax, hx + 1.3, y + T * s + 0.42, f"(B, h, T, d_k) = (B, {h}, {T}, {d_k})", size=8.5, color=MUTED)
    text(ax, hx + 2.1, y - 0.35, "head 0 in front", size=7.5, color=MUTED, ha="left")
    # --- attention, between the rows ---
    box(ax, 5.9, 2.35, 3.6, 0.55, "scaled_dot_product_attention, every head at once\n"
        "scores (B, h, T, T), output (B, h, T, d_k)", color=PURPLE, size=8.5)
    arrow(ax, (7.6, y - 0.4), (7.6, 2.93))
    # --- merge row ---
    y2 = 0.75
    mx = 8.0
    arrow(ax, (7.7, 2.32), (mx + 0.4, y2 + T * s + 0.55))
    for i in reversed(range(h)):
        _matrix(ax, mx + i * 0.32 - 0.9, y2 - i * 0.22 + 0.3, T, d_k, [LIGHT[HEADS[i]]] * d_k, s)
    text(ax, mx + 0.25, y2 - 0.45, "head outputs (B, h, T, d_k)", size=8.5, color=MUTED)
    arrow(ax, (6.85, y2 + 0.4), (6.2, y2 + 0.4))
    text(ax, 6.52, y2 + 0.65, "transpose(1, 2)\n+ reshape", size=8.5)
    cx = 3.85
    _matrix(ax, cx, y2, T, d_model, light_cols, s)
    text(ax, cx + d_model * s / 2, y2 + T * s + 0.35, "Concat(head_0, ..., head_3)", size=9)
    text(ax, cx + d_model * s / 2, y2 + T * s + 0.15, f"(B, T, d_model) = (B, {T}, {d_model})", size=8.5,
         color=MUTED)
    text(ax, cx + d_model * s / 2, y2 - 0.15, "a copy: the heads' columns side by side", size=7.5, color=MUTED)
    arrow(ax, (cx - 0.1, y2 + 0.4), (cx - 0.75, y2 + 0.4))
    text(ax, cx - 0.42, y2 + 0.62, "w_o", size=8.5)
    mixed = ["#b9bcc4"] * d_model
    _matrix(ax, 0.9, y2, T, d_model, mixed, s)
    text(ax, 0.9 + d_model * s / 2, y2 + T * s + 0.35, "output: heads mixed by $W^O$", size=9)
    text(ax, 0.9 + d_model * s / 2, y2 + T * s + 0.15, f"(B, T, d_model) = (B, {T}, {d_model})", size=8.5,
         color=MUTED)
    return fig


# ---- chapter 6 ----
@figure("encoder_decoder.svg", deps=(model.Transformer, model.EncoderLayer, model.DecoderLayer))
def encoder_decoder() -> plt.Figure:
    """The whole model, drawn left to right: encoder row, decoder row, output row, with shapes and masks."""
    fig, ax = canvas(10.0, 6.4)
    h = 0.72  # box height
    # encoder row
    ey = 4.75
    text(ax, 0.3, 6.0, "encoder", weight="bold", size=11, ha="left", color=BLUE)
    box(ax, 0.3, ey, 1.05, h, "source ids\n(B, S)", color=BROWN, size=9)
    arrow(ax, (1.38, ey + h / 2), (1.65, ey + h / 2))
    box(ax, 1.68, ey, 1.55, h, "embedding × √d_model\n+ positions", color=ORANGE, size=8.5)
    arrow(ax, (3.26, ey + h / 2), (3.72, ey + h / 2))
    text(ax, 3.49, ey + h / 2 + 0.22, "(B, S, d)", size=7.5, color=MUTED)
    ax.add_patch(FancyBboxPatch((3.75, ey - 0.3), 3.55, h + 0.6, boxstyle="round,pad=0,rounding_size=0.12",
                                facecolor="none", edgecolor=BLUE, linewidth=1.4, linestyle="--"))
    text(ax, 7.22, ey + h + 0.42, "N × encoder layer", size=9, color=BLUE, ha="right", weight="bold")
    box(ax, 3.9, ey, 1.75, h, "self-attention\nmask: source padding\n(B, 1, 1, S)", color=BLUE, size=8)
    for x, w in ((3.9, 1.75), (5.83, 1.32)):  # each sublayer's output: Add & Norm, LayerNorm(x + sublayer(x))
        box(ax, x, ey + h + 0.04, w, 0.2, "Add & Norm", color=MUTED, fill=OFF, size=6.5, round_=0.04, lw=0.8)
    arrow(ax, (5.68, ey + h / 2), (5.8, ey + h / 2))
    box(ax, 5.83, ey, 1.32, h, "feed-forward\nd → d_ff → d", color=GREEN, size=8)
    arrow(ax, (7.33, ey + h / 2), (7.75, ey + h / 2))
    text(ax, 7.54, ey + h / 2 + 0.22, "(B, S, d)", size=7.5, color=MUTED)
    box(ax, 7.78, ey, 1.9, h, "memory\n(B, S, d_model)", color=BLUE, size=9, weight="bold")
    # decoder row
    dy = 2.45
    text(ax, 0.3, 3.7, "decoder", weight="bold", size=11, ha="left", color=RED)
    box(ax, 0.3, dy, 1.05, h, "target ids\n(B, T)\n<bos> y₁ … yₙ", color=BROWN, size=8)
    arrow(ax, (1.38, dy + h / 2), (1.65, dy + h / 2))
    box(ax, 1.68, dy, 1.55, h, "embedding × √d_model\n+ positions", color=ORANGE, size=8.5)
    arrow(ax, (3.26, dy + h / 2), (3.72, dy + h / 2))
    text(ax, 3.49, dy + h / 2 + 0.22, "(B, T, d)", size=7.5, color=MUTED)
    ax.add_patch(FancyBboxPatch((3.75, dy - 0.3), 6.0, h + 0.6, boxstyle="round,pad=0,rounding_size=0.12",
                                facecolor="none", edgecolor=RED, linewidth=1.4, linestyle="--"))
    text(ax, 3.85, dy - 0.18, "N × decoder layer", size=9, color=RED, ha="left", weight="bold")
    box(ax, 3.9, dy, 1.85, h, "masked self-attention\nmask: padding & causal\n(B, 1, T, T)", color=RED, size=8)
    arrow(ax, (5.78, dy + h / 2), (5.93, dy + h / 2))
    box(ax, 5.96, dy, 2.3, h, "cross-attention\nQ: decoder; K, V: memory\nmask: source padding (B, 1, 1, S)",
        color=PURPLE, size=7.5)
    arrow(ax, (8.29, dy + h / 2), (8.4, dy + h / 2))
    box(ax, 8.43, dy, 1.2, h, "feed-forward\nd → d_ff → d", color=GREEN, size=8)
    for x, w in ((3.9, 1.85), (5.96, 2.3), (8.43, 1.2)):
        box(ax, x, dy + h + 0.04, w, 0.2, "Add & Norm", color=MUTED, fill=OFF, size=6.5, round_=0.04, lw=0.8)
    # memory to every decoder layer's cross-attention
    arrow(ax, (8.73, ey - 0.02), (7.4, dy + h + 0.26), color=BLUE, lw=1.8, rad=-0.15)
    text(ax, 8.55, 3.95, "the same memory\nfor every decoder layer", size=8, color=BLUE, ha="left")
    # output row
    oy = 0.55
    arrow(ax, (9.0, dy - 0.32), (9.0, oy + h + 0.02))
    text(ax, 9.1, 1.6, "(B, T, d)", size=7.5, color=MUTED, ha="left")
    box(ax, 6.95, oy, 2.7, h, "generator: linear d_model → V\n(weight tied to the target embedding)",
        color=ORANGE, size=8)
    arrow(ax, (6.92, oy + h / 2), (6.3, oy + h / 2))
    box(ax, 4.3, oy, 1.97, h, "logits (B, T, V)\none score per word", color=BROWN, size=8.5, weight="bold")
    arrow(ax, (4.27, oy + h / 2), (3.65, oy + h / 2), ls="--", color=MUTED)
    text(ax, 2.35, oy + h / 2, "softmax: in the loss (ch. 7)\nor in decoding (ch. 7, 8)", size=8, color=MUTED)
    text(ax, 0.3, 2.0, "Add & Norm: LayerNorm(x + dropout(sublayer(x))),\nthe residual connection of every "
         "sublayer;\nd = d_model, B batch, S source and T\ntarget length, V target vocabulary",
         size=7.8, color=MUTED, ha="left", va="top")
    return fig


# ---- chapter 7 ----
@figure("teacher_forcing.svg", deps=(training.teacher_forcing_pair,))
def teacher_forcing() -> plt.Figure:
    """The target <bos> y1..yn <eos> split into decoder input and labels, shifted by one position."""
    vocab = [*tl.SPECIAL_TOKENS, *"0123456789"]  # chapter 7's vocabulary: specials, then the digits
    tokens = ["<bos>", "5", "2", "7", "<eos>", "<pad>"]  # the reversal of source "7 2 5", padded by one
    tgt = torch.tensor([[vocab.index(t) for t in tokens]])  # (1, T + 1)
    decoder_input, labels = training.teacher_forcing_pair(tgt)  # (1, T), (1, T)
    T = decoder_input.size(1)
    fig, ax = canvas(10.0, 4.9)
    w, gap = 1.0, 0.25
    x0 = 2.1

    def xs(t: int) -> float:
        return x0 + t * (w + gap)

    # the target
    ty = 4.05
    text(ax, x0 - 0.15, ty + 0.2, "target\n(B, T + 1)", ha="right", size=9, weight="bold")
    for t, token in enumerate(tokens):
        box(ax, xs(t), ty, w, 0.4, token, color=BROWN, size=9.5,
            fill=OFF if token == "<pad>" else None, text_color=MUTED if token == "<pad>" else INK)
    # bracket lines for the two slices
    ax.plot([xs(0), xs(T - 1) + w], [ty - 0.12, ty - 0.12], color=BLUE, lw=2)
    text(ax, xs(0), ty - 0.28, "tgt[:, :-1]", size=8.5, color=BLUE, ha="left")
    ax.plot([xs(1), xs(T) + w], [ty + 0.52, ty + 0.52], color=GREEN, lw=2)
    text(ax, xs(T) + w, ty + 0.68, "tgt[:, 1:]", size=8.5, color=GREEN, ha="right")
    # decoder input and labels, aligned by position
    iy, ly = 2.6, 0.75
    text(ax, x0 - 0.15, iy + 0.2, "decoder input\n(B, T)", ha="right", size=9, weight="bold", color=BLUE)
    text(ax, x0 - 0.15, ly + 0.2, "labels\n(B, T)", ha="right", size=9, weight="bold", color=GREEN)
    for t in range(T):
        token_in, token_out = vocab[int(decoder_input[0, t])], vocab[int(labels[0, t])]
        box(ax, xs(t), iy, w, 0.4, token_in, color=BLUE, size=9.5)
        ignored = int(labels[0, t]) == tl.PAD_ID
        box(ax, xs(t), ly, w, 0.4, token_out, color=OFF if ignored else GREEN, fill=OFF if ignored else None,
            size=9.5, text_color=MUTED if ignored else INK)
        text(ax, xs(t) + w / 2, iy + 0.58, f"t = {t}", size=8, color=MUTED)
        arrow(ax, (xs(t) + w / 2, iy - 0.02), (xs(t) + w / 2, ly + 0.42), color=INK)
        if t + 1 < T:  # the label at t is the input at t + 1
            arrow(ax, (xs(t) + w - 0.05, ly + 0.42), (xs(t + 1) + 0.1, iy - 0.02), color=GREEN, ls="--", lw=1.0)
    text(ax, xs(T - 1) + w / 2, ly - 0.2, "<pad>: skipped by the loss", size=8, color=MUTED)
    text(ax, x0 - 0.15, 1.75, "the decoder predicts,\nat every position t,\nthe next token from\ninputs 0 … t "
         "(causal mask)", ha="right", size=8, color=MUTED)
    text(ax, xs(T) + 0.05, 1.6, "dashed: the label\nat t is the input\nat t + 1", size=8, color=GREEN,
         ha="left")
    return fig


# ---- chapter 8 ----
def _beam_beats_greedy(net: tl.Transformer, first: int, k: int, alpha: float, max_len: int) -> list[int]:
    """The first five-digit source (3 8 1 8 5, then seeded random ones) whose reversal greedy decoding gets wrong and
    beam search right. Which one that is depends on the trained weights, which differ in their last bits from one CPU
    to another, so the figure picks it rather than fixing it."""
    generator = torch.Generator().manual_seed(0)
    candidates = [[3, 8, 1, 8, 5]] + [torch.randint(0, 10, (5,), generator=generator).tolist() for _ in range(500)]
    for digits in candidates:
        src = torch.tensor([[first + d for d in digits]])  # (1, S)
        correct = [first + d for d in reversed(digits)] + [tl.EOS_ID]
        with torch.no_grad():
            beam = decoding.beam_search(net, src, beam_size=k, max_len=max_len, alpha=alpha)[0].tolist()
            greedy = decoding.greedy_decode(net, src, max_len, tl.BOS_ID, tl.EOS_ID)[0].tolist()
        if beam[: len(correct)] == correct and greedy[: len(correct)] != correct:
            return digits
    raise RuntimeError("no source among 501 where beam search corrects greedy decoding; train the figure's model "
                       "differently")


def _reversal_batches(epoch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Chapter 7's task at a smaller size: 3 to 6 random digits and their reversal, fixed by the epoch."""
    generator = torch.Generator().manual_seed(epoch)
    first = len(tl.SPECIAL_TOKENS)
    batches = []
    for _ in range(10):
        lengths = torch.randint(3, 7, (32,), generator=generator).tolist()
        sources = [torch.randint(first, first + 10, (n,), generator=generator).tolist() for n in lengths]
        targets = [[tl.BOS_ID, *reversed(s), tl.EOS_ID] for s in sources]
        batches.append((tl.pad_batch(sources, tl.PAD_ID), tl.pad_batch(targets, tl.PAD_ID)))
    return batches


@figure("beam_search_tree.svg", deps=(decoding.beam_search, decoding.beam_step, decoding.length_penalty,
                                       explorers.trace_beam_search, training.train, training.make_optimizer,
                                       training.translation_loss, decoding.greedy_decode, model.Transformer))
def beam_search_tree() -> plt.Figure:
    """A beam-search tree (k = 3, alpha = 0.6) from a small reversal model trained here for a few seconds."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    V, first = len(tl.SPECIAL_TOKENS) + 10, len(tl.SPECIAL_TOKENS)
    cfg = tl.TransformerConfig(src_vocab_size=V, tgt_vocab_size=V, d_model=32, n_heads=2, n_layers=1, d_ff=64,
                               dropout=0.0, max_len=16)
    net = tl.Transformer(cfg)
    optimizer, scheduler = training.make_optimizer(net, cfg.d_model, warmup=50, factor=0.5)
    training.train(net, _reversal_batches, optimizer, scheduler, max_steps=300, progress=False, log_every=25)
    net.eval()
    k, alpha, max_len = 3, 0.6, 8
    digits = _beam_beats_greedy(net, first, k, alpha, max_len)
    src = torch.tensor([[first + d for d in digits]])  # (1, S)
    with torch.no_grad():
        steps = explorers.trace_beam_search(net, src, k, max_len, alpha)  # each parent's best k, the kept among them
        library = decoding.beam_search(net, src, beam_size=k, max_len=max_len, alpha=alpha)[0].tolist()
        greedy = decoding.greedy_decode(net, src, max_len, tl.BOS_ID, tl.EOS_ID)[0].tolist()
    final = [steps[-1]["candidates"][i] for i in steps[-1]["kept"]]
    best = max(final, key=lambda c: c["ranked"])
    traced = best["tokens"][1:] + [tl.PAD_ID] * (len(library) - len(best["tokens"][1:]))
    assert traced[: len(library)] == library, (traced, library)  # the trace is the library's search

    def word(i: int) -> str:
        return tl.SPECIAL_TOKENS[i] if i < first else str(i - first)

    def text_of(ids: list[int]) -> str:
        out = []
        for i in ids:
            if i in (tl.EOS_ID, tl.PAD_ID):
                break
            out.append(word(i))
        return " ".join(out)

    shown_per_parent = 3
    n_steps = len(steps)
    size = MIN_TEXT_PT
    # one column per step, each node two lines (the token, the summed log-probability), so that seven steps fit in a
    # phone's width at 9 points; the root <bos> is a narrow upright box
    width, left, right = 5.2, 0.15, 0.15
    bw, bh, root_w = 0.5, 0.38, 0.26
    x_first = left + root_w + 0.17
    pitch = (width - right - x_first - bw) / (n_steps - 1)
    x_of = [x_first + pitch * s for s in range(n_steps)]

    def shown_children(step: dict, b: int) -> list[int]:
        """The candidates of parent b drawn: its best few, and every kept one."""
        children = [i for i, c in enumerate(step["candidates"]) if c["parent"] == b]
        children.sort(key=lambda i: -step["candidates"][i]["ranked"])
        return children[:shown_per_parent] + [i for i in children[shown_per_parent:] if i in step["kept"]]

    alive_of = [[b for b, parent in enumerate(step["parents"]) if not parent["finished"]] for step in steps]
    shown_most = max(sum(len(shown_children(step, b)) for b in alive) for step, alive in zip(steps, alive_of))
    top_note = 1.0  # the header: the source, the legend, the step numbers
    tree_h = (bh + 0.09) * (shown_most + 1)  # nodes spaced evenly, half a space more above and below the fullest step
    bottom_note = 1.7  # the three results and the note under the tree
    height = top_note + tree_h + bottom_note
    fig, ax = canvas(width, height)
    top, bottom = height - top_note, bottom_note
    root_y = (top + bottom) / 2
    box(ax, left, root_y - 0.32, root_w, 0.64, "", color=BROWN)
    text(ax, left + root_w / 2, root_y, "<bos>", size=size, rotation=90)
    positions = {(): (left + root_w, root_y)}  # prefix after <bos> -> right edge and centre of its node
    best_path = {tuple(best["tokens"][1:][:n]) for n in range(1, len(best["tokens"]))}
    for s, step in enumerate(steps):
        kept = set(step["kept"])
        alive = sorted(alive_of[s], key=lambda b: -positions[tuple(step["parents"][b]["tokens"][1:])][1])  # top down
        shown = [i for b in alive for i in shown_children(step, b)]
        ys = torch.linspace(top, bottom, len(shown) + 2)[1:-1].tolist() if len(shown) > 1 else [root_y]
        for y, i in zip(ys, shown):
            c = step["candidates"][i]
            prefix = tuple(c["tokens"][1:])
            is_kept, on_best = i in kept, prefix in best_path
            colour = RED if on_best else (BLUE if is_kept else OFF)
            box(ax, x_of[s], y - bh / 2, bw, bh, f"{word(c['tokens'][-1])}\n{c['score']:.2f}",
                color=colour if is_kept else EDGE, fill=LIGHT.get(colour, OFF), size=size,
                text_color=INK if is_kept else MUTED, lw=1.8 if on_best else 1.0, ls="-" if is_kept else ":",
                round_=0.05)
            px, py = positions[prefix[:-1]]
            arrow(ax, (px, py), (x_of[s], y), color=(RED if on_best else INK) if is_kept else EDGE,
                  lw=1.5 if on_best else 0.9, style="-", shrink=0.5)
            if is_kept:
                positions[prefix] = (x_of[s] + bw, y)
        text(ax, x_of[s] + bw / 2, top - 0.05, f"step {s + 1}" if s == 0 else str(s + 1), size=size, color=MUTED)
    text(ax, left + 0.07, height - 0.32, f"source: {' '.join(map(str, digits))}", size=10, ha="left", weight="bold")
    lx, ly = left + 0.07, height - 0.68  # the legend
    for colour, fill, ls, label, w in [(RED, LIGHT[RED], "-", "on the best hypothesis", 2.05),
                                       (BLUE, LIGHT[BLUE], "-", "kept in the beam", 1.6),
                                       (EDGE, OFF, ":", "pruned", 0.0)]:
        box(ax, lx, ly - 0.11, 0.3, 0.22, color=colour, fill=fill, ls=ls)
        text(ax, lx + 0.38, ly, label, size=size, ha="left")
        lx += w
    result = text_of(best["tokens"][1:])
    greedy_text = text_of(greedy)
    for row, (what, tokens) in enumerate([(f"beam search (k = {k}, α = {alpha})", result),
                                           ("greedy decoding", greedy_text),
                                           ("correct", " ".join(map(str, reversed(digits))))]):
        y = bottom - 0.05 - row * 0.24
        text(ax, left + 0.07, y, what, size=size, ha="left")
        text(ax, left + 2.45, y, tokens, size=size, ha="left", weight="bold" if row != 1 else "normal")
    text(ax, left + 0.07, 0.5, "Each node: the token added and the summed log-probability of\nits hypothesis. A "
         "hypothesis ended by <eos> keeps its place until\nbetter ones push it out; at the end, the winner is the "
         "one with\nthe best log-probability / length penalty.", size=size, color=MUTED, ha="left")
    return fig


# ---- writing and checking ----
def source_hash(name: str) -> str:
    """Hash of the figure's function, the shared helpers and style, and the library code it draws."""
    entry = REGISTRY[name]
    parts = [inspect.getsource(entry["fn"]), json.dumps(STYLE, sort_keys=True),
             repr((INK, MUTED, PANEL, EDGE, LIGHT, OFF, HEADS))]
    parts += [inspect.getsource(helper) for helper in SHARED]
    parts += [inspect.getsource(dep) for dep in entry["deps"]]
    parts += [inspect.getsource(obj) for obj in _private_helpers(entry["fn"])]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _private_helpers(fn: Callable) -> list:
    """Module-level helpers (names starting with _) that a figure function calls directly."""
    names = fn.__code__.co_names
    return [globals()[n] for n in sorted(set(names)) if n.startswith("_") and callable(globals().get(n))]


def render(name: str) -> bytes:
    """Draw one figure and return its SVG bytes."""
    threads = torch.get_num_threads()
    with plt.rc_context(STYLE), torch.random.fork_rng(devices=[]):  # leave the caller's random state alone
        try:
            fig = REGISTRY[name]["fn"]()
        finally:
            torch.set_num_threads(threads)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="svg", transparent=True, metadata={"Date": None, "Creator": "tools/figures.py"})
        plt.close(fig)
    return buffer.getvalue()


def png_copy(name: str, path: Path, dpi: int = 110) -> None:
    """Draw one figure as a PNG, for looking at it."""
    threads = torch.get_num_threads()
    with plt.rc_context(STYLE), torch.random.fork_rng(devices=[]):
        try:
            fig = REGISTRY[name]["fn"]()
        finally:
            torch.set_num_threads(threads)
        fig.savefig(path, format="png", dpi=dpi, transparent=True)
        plt.close(fig)


def write_all(out: Path, png: Path | None = None) -> dict:
    """Draw every figure into out; return the manifest entries."""
    out.mkdir(parents=True, exist_ok=True)
    manifest = {}
    for name in REGISTRY:
        data = render(name)
        (out / name).write_bytes(data)
        if png is not None:
            png.mkdir(parents=True, exist_ok=True)
            png_copy(name, png / (Path(name).stem + ".png"))
        manifest[name] = {"source_sha256": source_hash(name), "file_sha256": hashlib.sha256(data).hexdigest(),
                          "matplotlib": matplotlib.__version__, "torch": torch.__version__.split("+")[0]}
        print(f"wrote {out / name}")
    return manifest


def problems(folder: Path = FIGURES_DIR) -> list[str]:
    """Every way in which the figures in folder differ from what the script would draw now."""
    if not (folder / "manifest.json").exists():
        return [f"{folder / 'manifest.json'} is missing"]
    manifest = json.loads((folder / "manifest.json").read_text())
    found = []
    for name in REGISTRY:
        path = folder / name
        if name not in manifest:
            found.append(f"{name}: not in the manifest")
        elif not path.exists():
            found.append(f"{name}: file missing")
        elif manifest[name]["source_sha256"] != source_hash(name):
            found.append(f"{name}: its drawing code or the library code it shows changed since it was drawn")
        elif manifest[name]["file_sha256"] != hashlib.sha256(path.read_bytes()).hexdigest():
            found.append(f"{name}: the file was changed by hand or not regenerated")
    found += [f"{name}: in the manifest but drawn by no function" for name in manifest if name not in REGISTRY]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when a figure is missing or out of date")
    parser.add_argument("--out", type=Path, default=None, help="draw into this folder instead of book/figures")
    parser.add_argument("--png", type=Path, default=None, help="also write PNG copies into this folder")
    args = parser.parse_args(argv)
    for flag, folder in (("--out", args.out), ("--png", args.png)):
        if folder is not None and (folder.is_symlink() or (folder.exists() and not folder.is_dir())):
            parser.error(f"{flag} {str(folder)!r} is a file or a link; give a folder to draw into")
    if args.check:
        found = problems()
        for line in found:
            print(line, file=sys.stderr)
        if found:
            print("run `python tools/figures.py` and commit book/figures/", file=sys.stderr)
        return 1 if found else 0
    manifest = write_all(args.out or FIGURES_DIR, args.png)
    if args.out is None:
        MANIFEST.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
