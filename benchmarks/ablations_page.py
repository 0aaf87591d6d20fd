"""Keep the appendix "What each choice is worth" equal to the ablation records in benchmarks/results/ablations/.

    python benchmarks/ablations_page.py          # rewrite the page's generated blocks and its figure from the records
    python benchmarks/ablations_page.py --check  # exit 1 when the page was made from other records than those there

The page, book/appendix_ablations.md, is Markdown written by hand around blocks that this script writes: a block
runs from `<!-- ablations: NAME -->` to `<!-- end ablations -->`, and NAME says what goes in it: "runs" (one row
per run), "summary" (one row per variant, the spread over seeds), "status" (which runs are recorded and which are
still to come), "reproduction" (the baseline of seed 0 against chapter 8's recorded run, its scoreboard record) or
"verdict VARIANT ..." (the sentences that say what the records show for those variants). The
curves go to book/figures/records/ablation_curves.svg. Every number in a block comes from a record; the block "status" also
holds the sha256 of the records it was made from, which --check compares with the records on disk (fast, and
without the test set: the tests run it). Making the blocks needs test2016's references, for the bootstrap
(TRANSFORMER_LIB_DATA or the Hub, as everywhere in the book).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import ablation_records  # noqa: E402
import ablation_tables  # noqa: E402

RECORDS = ROOT / "benchmarks" / "results" / "ablations" / "multi30k-cpu"
SCOREBOARD = ROOT / "benchmarks" / "results" / "scoreboard" / "multi30k-cpu-cpu.json"  # chapter 8's recorded run
PAGE = ROOT / "book" / "appendix_ablations.md"
FIGURE = ROOT / "book" / "figures" / "records" / "ablation_curves.svg"  # drawn from records, not by tools/figures.py
BLOCK = re.compile(r"(<!-- ablations: (?P<name>[\w .-]+?) -->\n)(?P<body>.*?)(<!-- end ablations -->)", re.S)
DIGEST = re.compile(r"records sha256 ([0-9a-f]{64})")
# The seed plan, declared and decided on validation only (the page's "How the runs were made" says what was decided
# from the test set before this rule). The variants named here get these seeds (pre-norm's third was decided from its
# first two test gaps, before the rule; the block of chapter 10 gets three because it changes five things at once).
# Every other variant gets seeds 0 and 1, unless its seed 0 ends more than ONE_SEED_GAP validation BLEU (the decoding
# it chose) from the baseline's seed 0: a gap many times any seed's noise, which a second seed would not change.
PLANNED_SEEDS = {"baseline": (0, 1, 2), "pre-norm": (0, 1, 2), "block-2026": (0, 1, 2)}
ONE_SEED_GAP = 5.0
ALPHA = 0.05  # a Holm-adjusted p below it: beyond the noise
NOT_LEARNED = ablation_tables.NOT_LEARNED



def records_digest(folder: Path = RECORDS) -> str:
    """sha256 over chapter 8's scoreboard record and the record files' names and bytes, in name order: what the page
    was made from."""
    digest = hashlib.sha256(SCOREBOARD.read_bytes())  # the reproduction block reads chapter 8's record too
    for path in sorted(folder.glob("*-seed*.json")):
        digest.update(path.name.encode("utf-8") + b"\n" + path.read_bytes())
    return digest.hexdigest()


def weights_name(run: dict) -> str:
    """The weights a run's chosen decoding used, named: "final weights" or "average of epochs 9-12"."""
    last, epochs = run["chosen"]["average_last"], run["epochs"]
    return "final weights" if last == 1 else f"average of epochs {epochs - last + 1}-{epochs}"


def _number(value: float, digits: int = 2) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _interval(stat: dict) -> str:
    """The bootstrap's 95% interval, as the tables print it."""
    return f"95% interval {stat['mean'] - stat['ci']:.2f}–{stat['mean'] + stat['ci']:.2f}"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def runs_block(records: list[dict], stats: dict) -> str:
    """One row per run, in the variants' order, then seeds; narrow enough for the book's page at 1280 px, and its key
    columns (test BLEU, the gap to the baseline, its p-value) next to the variant, on a phone's first screen."""
    baseline = ablation_tables.baselines(records)
    rows = []
    for variant in ablation_records.VARIANTS:
        for run in sorted((r for r in records if r["variant"] == variant), key=lambda r: r["seed"]):
            if run["diverged"]:
                rows.append([variant, "diverged: " + run["error"], "–", "–", str(run["seed"])] + ["–"] * 3)
                continue
            stat, base = stats[variant, run["seed"]], baseline.get(run["seed"])
            gap = "–" if base is None or base is run else f"{run['test']['bleu'] - base['test']['bleu']:+.2f}"
            p = "–" if stat["p_value"] is None else f"{stat['p_value']:.3f}"
            last, epochs = run["chosen"]["average_last"], run["epochs"]
            weights = "final weights" if last == 1 else f"epochs {epochs - last + 1}–{epochs} averaged"
            load = ablation_tables.mean_load(run)
            load = "" if load is None else f" ({load:.1f})"
            rows.append([variant,
                         f"{run['test']['bleu']:.2f} ({stat['mean'] - stat['ci']:.2f}–{stat['mean'] + stat['ci']:.2f})",
                         gap, p, str(run["seed"]), f"α {run['chosen']['alpha']}, {weights}",
                         _number(run["chosen"]["valid_bleu"]), _number(run["minutes"], 1) + load])
    header = ["variant", "test BLEU (95% interval)", "vs baseline", "paired p", "seed", "decoding", "validation BLEU",
              "minutes (load)"]
    return markdown_table(header, rows)


def summary_block(records: list[dict]) -> str:
    """One row per variant: mean test BLEU and its spread over seeds (the key columns first), seeds, greedy validation
    BLEU, minutes."""
    table = ablation_tables.summary_table(records)
    rows = []
    for _, row in table.iterrows():
        rows.append([row["variant"], _number(row["test BLEU"]), _number(row["test BLEU spread"]),
                     str(int(row["seeds"])), str(int(row["diverged"])),
                     _number(row.get("validation BLEU (greedy)")),
                     "–" if math.isnan(row.get("runs alone", math.nan))  # a row on decoding: no training of its own
                     else f"{_number(row['minutes'], 1)} ({int(row['runs alone'])} of {int(row['seeds'])})"])
    header = ["variant", "test BLEU (mean over seeds)", "spread (max − min)", "runs", "diverged",
              "validation BLEU, greedy", "minutes, machine to itself (runs)"]
    return markdown_table(header, rows)


def status_block(records: list[dict], digest: str) -> str:
    """Which runs are recorded, where and how; which are still to come."""
    done = {(r["variant"], r["seed"]) for r in records}
    planned = [(v, s) for v in ablation_records.VARIANTS for s in planned_seeds(v, records)]
    missing = [f"{v} (seed {s})" for v, s in planned if (v, s) not in done]
    machines = sorted({f"{r['device_name']}, {r['torch_threads']} threads, torch {r['torch']}" for r in records})
    dates = sorted({r["date"] for r in records})
    when = f"on {dates[0]}" if dates and dates[0] == dates[-1] else f"from {dates[0]} to {dates[-1]}" if dates else ""
    text = (f"{len(records)} run{'s' if len(records) != 1 else ''} recorded, {when}, on {'; '.join(machines)}. "
            if records else "No run is recorded yet. ")
    text += (f"Still to come: {', '.join(missing)}." if missing else "Every planned run is recorded.")
    return f"{text}\n<!-- records sha256 {digest} -->\n"


def reproduction_block(records: list[dict]) -> str:
    """Whether the baseline of seed 0 reproduces chapter 8's recorded run (the scoreboard record of multi30k-cpu)."""
    from transformer_lib.files import read_checked_json

    run = ablation_tables.baselines(records).get(0)
    if run is None:
        return "The baseline of seed 0, chapter 8's recorded run trained again, has not run yet.\n"
    board = read_checked_json(SCOREBOARD, "scoreboard file", "write_scoreboard")
    ours = (run["chosen"]["alpha"], run["chosen"]["average_last"], run["chosen"]["valid_bleu"], run["test"]["bleu"])
    theirs = (board["decoding"]["alpha"], board["decoding"]["average_last"], board["validation"]["bleu"],
              board["test"]["bleu"])
    said = (f"validation BLEU {run['chosen']['valid_bleu']:.2f} and test BLEU {run['test']['bleu']:.2f} with alpha "
            f"{run['chosen']['alpha']} and the {weights_name(run)}")
    if ours == theirs and run["steps"] == board["steps"]:
        return (f"The baseline of seed 0 is chapter 8's recorded run trained again, and it reproduces that run to the "
                f"last digit ({said}, after {run['steps']:,} steps), as deterministic training on a CPU should. "
                f"Chapter 8's run, with the machine to itself, trained in {board['training_minutes']:.1f} minutes: "
                f"the recipe's price on this CPU.\n")
    text = (f"The baseline of seed 0 is chapter 8's recipe trained again, but it does not reproduce chapter 8's "
            f"recorded run: {said} here, against validation BLEU {board['validation']['bleu']:.2f} and test BLEU "
            f"{board['test']['bleu']:.2f} with alpha {board['decoding']['alpha']} and average_last "
            f"{board['decoding']['average_last']} in the scoreboard record")
    if board["device_name"] != run["device_name"] or board["torch"] != run["torch"]:
        text += (f". The two ran on different machines ({run['device_name']} with torch {run['torch']} here, "
                 f"{board['device_name']} with torch {board['torch']} for chapter 8), whose floating-point kernels "
                 f"round differently, so that from the first steps on the same seed trains other weights")
    return text + ".\n"


def _power_of_ten(value: float) -> str:
    """1.5625e-3 as $1.6 \\times 10^{-3}$."""
    mantissa, exponent = f"{value:.1e}".split("e")
    return rf"${mantissa} \times 10^{{{int(exponent)}}}$"


def schedule_block(records: list[dict]) -> str:
    """What removing warm-up does to the learning rate, from the settings the baseline and no-warmup runs trained with
    (eq. 3, transformer_lib.training.noam_lr, times the recipe's lr_factor)."""
    from transformer_lib.training import noam_lr

    base = ablation_tables.baselines(records).get(0)
    cold = next((r for r in records if r["variant"] == "no-warmup"), None)
    if base is None or cold is None:
        return "The learning rates of both schedules come with the first baseline and no-warmup runs.\n"

    def rate(run: dict, step: int) -> float:
        model, training = run["settings"]["model"], run["settings"]["training"]
        return training["lr_factor"] * noam_lr(step, model["d_model"], training["warmup"])

    warmup = base["settings"]["training"]["warmup"]
    peak, start, quarter = rate(base, warmup), rate(cold, 1), warmup // 4
    return (f"Here the warm-up climbs for {warmup} steps to a peak of {_power_of_ten(peak)}. Without it (warmup = "
            f"{cold['settings']['training']['warmup']} in the formula) the decay starts at the first step, from "
            f"{_power_of_ten(start)}: {start / peak:.0f} times the warm-up's peak, still "
            f"{rate(cold, quarter) / peak:.1f} times it at step {quarter}, and the same rate as the baseline's from "
            f"step {warmup} on.\n")


def planned_seeds(variant: str, records: list[dict]) -> tuple[int, ...]:
    """The seeds the plan gives a variant (PLANNED_SEEDS, else 0 and 1), decided on validation BLEU alone: one seed
    when its seed 0's chosen decoding scored more than ONE_SEED_GAP from the baseline's seed 0 on validation."""
    if variant in PLANNED_SEEDS:
        return PLANNED_SEEDS[variant]
    first = {r["variant"]: r for r in records if r["seed"] == 0 and not r["diverged"]}
    if variant in first and "baseline" in first and abs(
            first[variant]["chosen"]["valid_bleu"] - first["baseline"]["chosen"]["valid_bleu"]) > ONE_SEED_GAP:
        return (0,)
    if any(r["variant"] == variant and r["seed"] == 0 and r["diverged"] for r in records):
        return (0,)  # a diverged seed 0 is its own answer
    return (0, 1)


def _seeds(seeds: list[int]) -> str:
    """[0] as "seed 0", [0, 2] as "seeds 0 and 2", [0, 1, 2] as "seeds 0, 1 and 2"."""
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    return "seeds " + ", ".join(map(str, seeds[:-1])) + f" and {seeds[-1]}"


def verdict(variant: str, records: list[dict], stats: dict, judged: dict) -> str:
    """What the records say of one variant, in a few sentences, by the page's declared method (judged, from
    ablation_tables.judge): each seed's gap with its paired test, then the mean gap against both noises, and beyond
    the noise only when its Holm-adjusted p is below ALPHA."""
    runs = sorted((r for r in records if r["variant"] == variant), key=lambda r: r["seed"])
    if not runs:
        return f"*{variant}*: not run yet."
    baseline = ablation_tables.baselines(records)
    parts = []
    for run in runs:
        if run["diverged"]:
            parts.append(f"seed {run['seed']} diverged ({run['error']})")
            continue
        stat, base = stats[variant, run["seed"]], baseline.get(run["seed"])
        if base is None:
            parts.append(f"seed {run['seed']}: test BLEU {run['test']['bleu']:.2f} ({_interval(stat)}), no "
                         f"baseline of that seed to pair it with")
            continue
        gap = run["test"]["bleu"] - base["test"]["bleu"]
        parts.append(f"seed {run['seed']}: test BLEU {run['test']['bleu']:.2f} ({_interval(stat)}), {gap:+.2f} "
                     f"against the baseline's {base['test']['bleu']:.2f} (paired p = {stat['p_value']:.3f})")
        if run["test"]["bleu"] < NOT_LEARNED:  # stuck, not diverged: no NaN stopped it, and it learned nothing
            parts[-1] += (f"; it never learned to translate, its training loss ending at "
                          f"{run['curve'][-1]['train_loss']:.2f} against the baseline's "
                          f"{base['curve'][-1]['train_loss']:.2f}")
    text = f"*{variant}*: " + "; ".join(parts) + "."
    if variant not in judged:
        return text
    j = judged[variant]
    seeds = len(j["seeds"])
    gaps = ablation_tables.gaps(records, variant)
    way = ("" if seeds == 1 else " Every seed's gap points the same way." if len({g > 0 for g in gaps.values()}) == 1
           else " The seeds' gaps point opposite ways.")
    over = "its seed" if seeds == 1 else f"its {seeds} seeds"
    if not j["seeds_measured"]:
        return text + way + (f" The mean gap over {over}, {j['gap']:+.2f}, has a standard error of "
                             f"{j['se_sentences']:.2f} from the sentences; the seeds' noise is not measured yet (no "
                             f"variant has two seeds), so no verdict: p {_p(j['p_value'])} from the sentences alone.")
    adjusted = "below 0.001" if j["holm"] < 0.001 else f"{j['holm']:.3f}"
    text += way + (f" The mean gap over {over}, {j['gap']:+.2f}, has a standard error of {j['se']:.2f} "
                   f"({j['se_sentences']:.2f} from the sentences, {j['se_seeds']:.2f} from the seeds): p "
                   f"{_p(j['p_value'])} ({adjusted} after Holm's "
                   f"adjustment over the {j['family']} variants).")
    if j["holm"] < ALPHA:
        return text + " Beyond the noise."
    return text + " Within the noise: these runs cannot tell it from the baseline."


def _p(value: float) -> str:
    """A p-value as the page prints it after "p": "= 0.012", or "< 0.001" below that."""
    return "< 0.001" if value < 0.001 else f"= {value:.3f}"


def compact_table(title: str, label: str, table: str) -> str:
    """A Markdown table in MyST's table directive, titled and labelled, with the book's narrow "compact" style."""
    return f"```{{table}} {title}\n:class: compact\n:name: {label}\n\n{table}\n```\n"


def speed_block(records: list[dict]) -> str:
    """One row per trained run but the baseline's: the epoch, step and minutes at which its validation curve first
    reached the final validation BLEU of the baseline of its seed (ablation_tables.time_to_baseline)."""
    reached = ablation_tables.time_to_baseline(records)
    by_seed = ablation_tables.baselines(records)
    rows = []
    for variant in list(ablation_records.VARIANTS)[1:]:  # every variant but the baseline
        for run in sorted((r for r in records if r["variant"] == variant and (variant, r["seed"]) in reached),
                          key=lambda r: r["seed"]):
            point, baseline = reached[variant, run["seed"]], by_seed[run["seed"]]
            rows.append([variant, str(run["seed"]), _number(baseline["curve"][-1]["valid_bleu"])]
                        + (["not reached", "–", "–"] if point is None else
                           [f"{point['epoch']} of {baseline['epochs']}", f"{point['step']:,}",
                            _number(point["minutes"], 1)]))
    header = ["variant", "seed", "baseline's final validation BLEU", "first epoch at or above it", "step",
              "minutes of training then"]
    return markdown_table(header, rows)


def render(name: str, records: list[dict], stats: dict, judged: dict, digest: str) -> str:
    kind, *rest = name.split()
    if kind == "runs":
        return compact_table("Every run", "table-ablation-runs", runs_block(records, stats))
    if kind == "summary":
        return compact_table("Over seeds", "table-ablation-summary", summary_block(records))
    if kind == "status":
        return status_block(records, digest)
    if kind == "reproduction":
        return reproduction_block(records)
    if kind == "schedule":
        return schedule_block(records)
    if kind == "speed":
        return compact_table("How soon each run reaches the baseline's quality", "table-ablation-speed",
                             speed_block(records))
    if kind == "verdict":
        return "\n\n".join(verdict(variant, records, stats, judged) for variant in rest) + "\n"
    raise ValueError(f"{PAGE}: unknown block {name!r}; expected runs, summary, status, reproduction, schedule, "
                     "speed or verdict VARIANT ...")


def draw_curves(records: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Drawn for a phone as well as a desktop (CONTRIBUTING.md, 'Adding a chapter', item 9): 5.2 inches wide with no
    # text under 9 points, 8 CSS px when a 390 px phone shows it 342 px wide; the legend under the plot, two columns.
    style = {"svg.hashsalt": "ablations", "font.family": "DejaVu Sans", "font.size": 10, "legend.fontsize": 9,
             "xtick.labelsize": 9, "ytick.labelsize": 9}
    with plt.rc_context(style):  # fixed ids, and no timestamp: the same records, the same file
        fig, ax = plt.subplots(figsize=(5.2, 4.8), layout="constrained")
        ablation_tables.plot_curves(records, ax=ax)
        handles, labels = ax.get_legend_handles_labels()
        ax.get_legend().remove()
        fig.legend(handles, labels, loc="outside lower center", ncol=2, frameon=False, columnspacing=2.0)
        FIGURE.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(FIGURE, metadata={"Date": None})
        plt.close(fig)


def stored_digest(text: str) -> str | None:
    match = DIGEST.search(text)
    return match[1] if match else None


def sync(check: bool) -> bool:
    """Rewrite the page's blocks and figure from the records, or (check) say whether they were made from them."""
    text = PAGE.read_text(encoding="utf-8")
    records = ablation_records.read_records(RECORDS)  # each checked, all of one sweep, as for --summary: else one line
    digest = records_digest()
    if check:
        return stored_digest(text) == digest and FIGURE.is_file()
    references = ablation_records.test2016_references()
    ablation_records.check_hypotheses(records, references, RECORDS)
    stats = ablation_tables.significance(records, references)
    judged = ablation_tables.judge(records, ablation_tables.sentence_noise(records, references))
    new = BLOCK.sub(lambda m: m.group(1) + render(m["name"], records, stats, judged, digest) + m.group(4), text)
    PAGE.write_text(new, encoding="utf-8")
    draw_curves(records)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the page is current; exit 1 if not")
    args = parser.parse_args(argv)
    try:
        current = sync(args.check)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.check and not current:
        print(f"{PAGE.relative_to(ROOT)} was made from other records than those in {RECORDS.relative_to(ROOT)}; "
              f"run `python benchmarks/ablations_page.py`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
