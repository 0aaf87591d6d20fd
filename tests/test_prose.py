"""Part I's main line stays brisk: the words a reader must read to follow chapters 1 to 5, counted as the round-4
and round-5 reviews of the book counted them, within a budget (CONTRIBUTING.md, 'Style of code and prose').

Counted: whitespace-separated words of the markdown up to each chapter's `## Exercises` heading, without fenced code,
display maths (`$$ ... $$`), table rules and MyST fence and option lines. Not counted as main line: the bodies of
dropdowns and admonitions (folded, for a second reading), of figure directives (captions), of exercises and of
solutions. The heading and a `{solution-start}` take effect from their own line, not from their cell's first: chapter
1's Summary shares its cell with both and is main line. On the chapters as the round-4 review read them (5b36b7f)
this gives its 14,944 words, chapter by chapter to the word, and on those the round-5 review read (27c0d8e) its 13,027.
"""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PART_ONE = sorted((ROOT / "book").glob("0[1-5]_*.ipynb"))
MAIN_LINE_BUDGET = 13_000  # words for chapters 1-5 together: the length before round 4 added 1,200 (13,725)
FOLDED = {"dropdown", "note", "tip", "hint", "admonition", "warning", "important", "seealso", "attention", "caution"}
FENCE = re.compile(r"^(`{3,}|:{3,})(\{[\w-]+\})?")


def prose_words(notebook: dict) -> dict[str, int]:
    """Words of each kind in a notebook's markdown: main, folded, captions, exercises, solutions."""
    counts = dict.fromkeys(("main", "folded", "captions", "exercises", "solutions"), 0)
    after_exercises = in_solution = False
    for cell in notebook["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"])
        opened: list[tuple[str, str]] = []  # (fence marker, directive or "code")
        in_maths = False
        for line in text.splitlines():
            # from the heading and from the start of a solution on, within their cell too
            after_exercises = after_exercises or line.startswith("## Exercises")
            in_solution = in_solution or "{solution-start}" in line
            stripped = line.strip()
            if stripped.startswith("$$"):
                in_maths = in_maths != (stripped.count("$$") == 1)
                continue
            fence = FENCE.match(stripped)
            if in_maths or (opened and opened[-1][1] == "code" and not (fence and fence.group(1) == opened[-1][0])):
                continue
            if fence:
                marker, directive = fence.group(1), (fence.group(2) or "").strip("{}")
                if opened and opened[-1][0] == marker and not directive:
                    opened.pop()
                else:
                    opened.append((marker, directive or "code"))
                continue
            if re.match(r"^\s*:[\w-]+:", line) or (re.fullmatch(r"[\s:|-]+", line) and "-" in line and "|" in line):
                continue  # an option line of a directive, or the rule under a table's header
            kinds = {kind for _, kind in opened}
            kind = ("solutions" if in_solution or kinds & {"solution", "solution-start"} else
                    "exercises" if "exercise" in kinds or after_exercises else
                    "captions" if "figure" in kinds else "folded" if kinds & FOLDED else "main")
            counts[kind] += len(line.split())
        in_solution = in_solution and "{solution-end}" not in text
    return counts


def test_the_counter_sees_each_kind_of_text():
    cells = ["# Title\n\nOne two three.\n\n```python\nnot = counted\n```\n\n$$\nx = y\n$$\n\n"
             "| a | b |\n|---|---|\n| c | d |",
             ":::{dropdown} Folded\nfour five\n:::\n\n```{figure} f.svg\n:alt: alt words\n\nsix seven\n```",
             "## Summary\n\nthirteen fourteen\n\n## Exercises\n\n:::{exercise} Try\n:label: ex-x\n\neight nine\n:::\n\n"
             ":::{solution-start} ex-x\n:class: dropdown\n:::",
             "ten eleven twelve", ":::{solution-end}\n:::", "fifteen"]
    notebook = {"cells": [{"cell_type": "markdown", "source": [text]} for text in cells]}
    # main: the heading, the sentence, the table's two rows (its pipes are words too, as the review counted them) and
    # a summary that shares its cell with `## Exercises` and the start of a solution (chapter 1's does), up to them
    assert prose_words(notebook) == {"main": 2 + 3 + 5 + 5 + 2 + 2, "folded": 2, "captions": 2,
                                     "exercises": 2 + 2 + 1, "solutions": 3}


def test_part_one_reads_briskly():
    words = {path.name: prose_words(json.loads(path.read_text(encoding="utf-8")))["main"] for path in PART_ONE}
    assert len(words) == 5
    assert sum(words.values()) <= MAIN_LINE_BUDGET, (
        f"chapters 1-5 hold {sum(words.values()):,} words of main-line prose ({words}); the budget is "
        f"{MAIN_LINE_BUDGET:,}: fold engineering into a dropdown, move a forward reference where it is used, or "
        f"tighten the longest paragraphs")
