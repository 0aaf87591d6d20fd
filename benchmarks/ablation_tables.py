"""What the records of benchmarks/ablations.py show: sacreBLEU's statistics of each run against the baseline of its
seed, the appendix's test of each variant's mean gap over its seeds (the sentences' noise and the seeds' together,
Holm's adjustment over the variants), the tables that `ablations.py --summary` prints and the appendix reads, whether
a run had the machine to itself (its minutes), and the validation curves.
"""

from __future__ import annotations

import math

from transformer_lib.scoring import bootstrap_interval, paired_bootstrap, signed_paired_bootstrap

from ablation_records import VARIANTS


def baselines(records: list[dict]) -> dict[int, dict]:
    """The baseline's runs that trained to the end, by seed: what every other run of the same seed is measured
    against (same initial weights and batches)."""
    return {r["seed"]: r for r in records if r["variant"] == "baseline" and not r["diverged"]}


def time_to_baseline(records: list[dict]) -> dict[tuple[str, int], dict | None]:
    """When each trained run's validation curve (greedy BLEU after each epoch, the final weights) first reaches the
    last point of the baseline's curve of the same seed, keyed by (variant, seed): its "epoch", "step" and
    "minutes" of training then, and the "target"; None when it never does. The baseline itself reaches it at its last
    epoch. Runs without a baseline of their seed, or without a curve, are left out."""
    by_seed = baselines(records)
    found = {}
    for run in records:
        baseline = by_seed.get(run["seed"])
        if run["diverged"] or baseline is None or not run.get("curve") or not baseline.get("curve"):
            continue
        target = baseline["curve"][-1]["valid_bleu"]
        reached = next((point for point in run["curve"]
                        if point.get("valid_bleu") is not None and point["valid_bleu"] >= target), None)
        found[run["variant"], run["seed"]] = None if reached is None else {
            "epoch": reached["epoch"], "step": reached["step"], "minutes": reached["minutes"], "target": target}
    return found


def significance(records: list[dict], references: list[str], n_samples: int = 1000) -> dict[tuple[str, int], dict]:
    """sacreBLEU's own statistics of each trained run's test2016 BLEU (the decoding it chose on validation), keyed by
    (variant, seed): "mean" and "ci", the bootstrap estimate and the half-width of its 95% interval
    (scoring.bootstrap_interval, n_samples resamples of the test sentences), and "p_value", the paired bootstrap test
    (scoring.paired_bootstrap, sacreBLEU's paired_bs) of the run against the baseline of the same seed, which sees
    the same batches; None for the baseline itself and for a seed without a baseline. sacreBLEU fixes its random
    seed (SACREBLEU_SEED, 12345 by default), so the numbers repeat and every run is resampled alike."""
    trained = [r for r in records if not r["diverged"]]
    by_seed = baselines(records)
    stats = {}
    for run in trained:
        hypotheses = run["test_hypotheses"]["chosen"]
        interval = bootstrap_interval(hypotheses, references, n_bootstrap=n_samples)
        baseline = by_seed.get(run["seed"])
        paired = None if baseline is None or baseline is run else paired_bootstrap(
            baseline["test_hypotheses"]["chosen"], hypotheses, references, n_bootstrap=n_samples)
        stats[run["variant"], run["seed"]] = {"mean": interval["mean"], "ci": interval["ci"],
                                              "p_value": None if paired is None else paired["p_value"]}
    return stats


NOT_LEARNED = 1.0  # a test BLEU below it: the run did not learn to translate at all
SACREBLEU_SEED = 12345  # sacreBLEU's default resampling seed, which every other test on the page uses


def gaps(records: list[dict], variant: str) -> dict[int, float]:
    """The variant's test BLEU minus the baseline's of the same seed, by seed, for its runs that trained and have a
    baseline of their seed."""
    baseline = baselines(records)
    return {r["seed"]: r["test"]["bleu"] - baseline[r["seed"]]["test"]["bleu"] for r in records
            if r["variant"] == variant and not r["diverged"] and r["seed"] in baseline}


def seed_noise(records: list[dict]) -> tuple[float | None, int]:
    """The seeds' noise of a gap: the standard deviation of a variant's gap from one seed to the next, pooled over
    every variant with two or more gaps (each gap around its own variant's mean gap), and its degrees of freedom.

    Its expectation does not grow with the number of seeds, as the spread max - min does. Runs that never learned to
    translate (test BLEU below NOT_LEARNED) are left out: their gaps say nothing of how far a seed moves a working
    recipe. (None, 0) while no variant has two gaps."""
    squares, freedom = 0.0, 0
    for variant in VARIANTS:
        if variant == "baseline":
            continue
        learned = {r["seed"] for r in records if r["variant"] == variant and not r["diverged"]
                   and r["test"]["bleu"] >= NOT_LEARNED}
        values = [gap for seed, gap in gaps(records, variant).items() if seed in learned]
        if len(values) > 1:
            mean = sum(values) / len(values)
            squares += sum((value - mean) ** 2 for value in values)
            freedom += len(values) - 1
    return (math.sqrt(squares / freedom), freedom) if freedom else (None, 0)


def sentence_noise(records: list[dict], references: list[str], n_samples: int = 1000) -> dict[str, dict]:
    """The sentences' noise of each variant's mean gap over its seeds, keyed by variant: "gap" (the mean gap),
    "seeds", "se" (its standard error from resampling the test sentences) and "p_value" (that noise alone).

    Every seed's pair (the variant and the baseline of that seed) is scored on the same resamples of the test
    sentences: scoring.signed_paired_bootstrap on sacreBLEU's per-sentence BLEU statistics of every seed side by
    side, the score being the mean of the seeds' corpus BLEU. "se" is the half-width of the resampled mean gaps'
    middle 95% over 1.96, the standard deviation of a normal distribution of that width."""
    import numpy as np
    import sacrebleu

    bleu, baseline = sacrebleu.metrics.BLEU(), baselines(records)
    statistics = {}  # (variant, seed) -> per-sentence statistics, each extracted once

    def of(run: dict):
        key = run["variant"], run["seed"]
        if key not in statistics:
            statistics[key] = np.asarray(bleu._extract_corpus_statistics(run["test_hypotheses"]["chosen"],
                                                                         [references]), dtype=float)
        return statistics[key]

    found = {}
    for variant in VARIANTS:
        runs = sorted((r for r in records if r["variant"] == variant and not r["diverged"] and r["seed"] in baseline
                       and variant != "baseline"), key=lambda r: r["seed"])
        if not runs:
            continue
        width = of(runs[0]).shape[1]

        def mean_bleu(summed) -> float:  # the seeds' statistics side by side: the mean of their corpus BLEU
            return sum(bleu._compute_score_from_stats(summed[i:i + width]).score
                       for i in range(0, len(summed), width)) / (len(summed) // width)

        test = signed_paired_bootstrap(np.hstack([of(baseline[r["seed"]]) for r in runs]),
                                       np.hstack([of(r) for r in runs]), mean_bleu, n_samples, SACREBLEU_SEED)
        found[variant] = {"gap": test["difference"], "seeds": [r["seed"] for r in runs],
                          "se": test["difference_ci"] / 1.96, "p_value": test["p_value"]}
    return found


def holm(p_values: dict[str, float], family_size: int) -> dict[str, float]:
    """Holm's step-down adjusted p-values over a family of family_size comparisons, of which p_values holds those
    measured (the others count as p = 1, and so only as members of the family): the i-th smallest p times
    (family_size - i + 1), never below the adjusted p before it, never above 1."""
    if len(p_values) > family_size:
        raise ValueError(f"family_size must count every comparison, got {family_size} for {len(p_values)} p-values")
    adjusted, running = {}, 0.0
    for rank, (name, p) in enumerate(sorted(p_values.items(), key=lambda item: item[1])):
        running = max(running, min(1.0, (family_size - rank) * p))
        adjusted[name] = running
    return adjusted


def judge(records: list[dict], noise: dict[str, dict]) -> dict[str, dict]:
    """The appendix's test of each variant, declared before chapter 10's variants ran: the mean gap over its seeds
    against both noises at once. Its standard error adds the sentences' variance (sentence_noise) and the seeds'
    (seed_noise's pooled standard deviation squared, over the number of seeds); t = gap / se, and "p_value" is
    Student's t's two-sided p with seed_noise's degrees of freedom ("seeds_measured" False, and a normal p of the
    sentences' noise alone, while no variant has two seeds). "holm" is that p adjusted over the family of every
    variant of VARIANTS but the baseline, run or not."""
    from scipy import stats

    sd, freedom = seed_noise(records)
    judged = {}
    for variant, sentences in noise.items():
        seeds = len(sentences["seeds"])
        from_seeds = None if sd is None else sd / math.sqrt(seeds)
        se = math.sqrt(sentences["se"] ** 2 + (from_seeds or 0.0) ** 2)
        t = sentences["gap"] / se if se > 0 else (0.0 if sentences["gap"] == 0 else math.inf)
        p = 2 * (stats.norm.sf(abs(t)) if sd is None else stats.t.sf(abs(t), freedom))
        judged[variant] = {**sentences, "se_sentences": sentences["se"], "se_seeds": from_seeds, "se": se, "t": t,
                           "p_value": float(p), "seeds_measured": sd is not None, "seed_sd": sd, "freedom": freedom}
    family = [variant for variant in VARIANTS if variant != "baseline"]
    adjusted = holm({variant: j["p_value"] for variant, j in judged.items()}, len(family))
    for variant, j in judged.items():
        j.update(holm=adjusted[variant], family=len(family))
    return judged


def runs_table(records: list[dict], references: list[str]):
    """A pandas DataFrame, one row per run (variants in VARIANTS' order, then seeds): its test BLEU with sacreBLEU's
    bootstrap mean and 95% interval, its difference from the baseline of the same seed with the paired test's
    p-value, its validation BLEU (the decoding it chose), training minutes and steps, the mean load average of the
    machine while it trained (above the cores' count: other work shared them), and where a diverged run stopped."""
    import pandas as pd

    stats = significance(records, references)
    baseline = baselines(records)
    rows = []
    for variant in VARIANTS:
        for run in sorted((r for r in records if r["variant"] == variant), key=lambda r: r["seed"]):
            row = {"variant": variant, "seed": run["seed"], "diverged": run["error"] if run["diverged"] else ""}
            if not run["diverged"]:
                stat, base, load = stats[variant, run["seed"]], baseline.get(run["seed"]), mean_load(run)
                row.update({
                    "test BLEU": run["test"]["bleu"], "bootstrap mean": stat["mean"], "95% CI ±": stat["ci"],
                    "vs baseline": run["test"]["bleu"] - base["test"]["bleu"] if base else math.nan,
                    "paired p": math.nan if stat["p_value"] is None else stat["p_value"],
                    "validation BLEU": run["chosen"]["valid_bleu"], "minutes": run["minutes"], "steps": run["steps"],
                    "load": math.nan if load is None else load,
                })
            rows.append(row)
    return pd.DataFrame(rows)


SHARED_LOAD = 0.5  # a mean load average more than this above the threads a run trains with: other work shared the CPU


def mean_load(record: dict) -> float | None:
    """The machine's mean 1-minute load average over a run's epochs; None for the first records, which have none."""
    loads = record.get("load_average")
    return sum(loads) / len(loads) if loads else None


SLOW_EPOCH = 1.5  # an epoch this many times the run's median epoch: other work held a third of the CPU through it


def slowest_epoch(record: dict) -> float | None:
    """The run's slowest epoch over its median epoch, in training minutes. Under one seed every epoch has the same
    batches' worth of steps, so on any machine a run alone reads close to 1; None with fewer than three epochs."""
    ends = [0.0] + [point["minutes"] for point in record.get("curve") or []]
    epochs = sorted(b - a for a, b in zip(ends, ends[1:]))
    if len(epochs) < 3:
        return None
    return epochs[-1] / epochs[len(epochs) // 2]


def had_the_machine(record: dict) -> bool:
    """Whether a run's training minutes are the recipe's own. On a GPU, yes: the CPU's load does not time it. On the
    CPU, when two things hold. The machine's mean 1-minute load average while it trained stayed within SHARED_LOAD
    of the threads its training keeps busy (torch_threads for each of its jobs): a run alone on 2 threads reads 2.0
    to 2.1, and half a core more, on average over the run, is other work. And no epoch took SLOW_EPOCH times the
    run's median epoch: the load is sampled once an epoch, and a burst of other work between two samples shows only in
    the epoch's minutes. A record without loads (the first ones) cannot tell: no."""
    if record["device"] != "cpu":
        return True
    load, slowest = mean_load(record), slowest_epoch(record)
    return (load is not None and load <= record["torch_threads"] * record["jobs"] + SHARED_LOAD
            and (slowest is None or slowest < SLOW_EPOCH))


def summary_table(records: list[dict]):
    """A pandas DataFrame, one row per variant in VARIANTS' order: runs, mean and spread (max - min) over seeds. Its
    "minutes" are the mean over the runs that had the machine to themselves (had_the_machine); "runs alone" counts
    them."""
    import pandas as pd

    rows = []
    for variant, (description, _) in VARIANTS.items():
        runs = [r for r in records if r["variant"] == variant]
        if not runs:
            continue
        trained = [r for r in runs if not r["diverged"]]
        row = {"variant": variant, "what changes": description, "seeds": len(runs),
               "diverged": len(runs) - len(trained)}
        alone = [r for r in trained if had_the_machine(r)]
        row["runs alone"] = len(alone)
        for key, label in (("test", "test BLEU"), ("valid_bleu_greedy", "validation BLEU (greedy)"),
                           ("final_valid_loss", "validation loss"), ("minutes", "minutes")):
            values = [r[key]["bleu"] if key == "test" else r[key] for r in (alone if key == "minutes" else trained)]
            values = [v for v in values if v is not None]
            row[label] = sum(values) / len(values) if values else math.nan
            row[f"{label} spread"] = max(values) - min(values) if len(values) > 1 else math.nan
        steps = {r["steps"] for r in trained}
        row["steps"] = steps.pop() if len(steps) == 1 else math.nan  # equal across seeds only by chance
        rows.append(row)
    baseline = list(baselines(records).values())
    for label, pick in (("greedy search, final weights", lambda r: r["test_greedy_final"]),
                        ("beam search, final weights", lambda r: r["test_beam_final"]),
                        ("beam search, chosen weights", lambda r: r["test"]["bleu"])):
        if baseline:
            values = [pick(r) for r in baseline]
            rows.append({"variant": f"baseline decoded by {label}", "what changes": "decoding only",
                         "seeds": len(baseline), "diverged": 0, "test BLEU": sum(values) / len(values),
                         "test BLEU spread": max(values) - min(values) if len(values) > 1 else math.nan})
    return pd.DataFrame(rows)


def plot_curves(records: list[dict], ax=None):
    """Greedy validation BLEU against steps, one line per run (its epochs that measured BLEU), a colour per variant,
    in VARIANTS' order (the eleventh variant on takes the colours again, dash-dotted); a diverged run is drawn up to
    where it stopped, dashed. Returns the axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        ax = plt.subplots(figsize=(8, 4.5))[1]
    colours = plt.get_cmap("tab10")
    for number, variant in enumerate(VARIANTS):
        runs = sorted((r for r in records if r["variant"] == variant), key=lambda r: r["seed"])
        for index, run in enumerate(runs):
            points = [(p["step"], p["valid_bleu"]) for p in run["curve"] if p.get("valid_bleu") is not None]
            if not points:
                continue
            steps, bleu = zip(*points)
            style = "--" if run["diverged"] else ("-", "-.", ":")[number // 10 % 3]  # ten colours; then a new line
            ax.plot(steps, bleu, color=colours(number % 10), linestyle=style, linewidth=1.2,
                    label=variant if index == 0 else None)
    ax.set_xlabel("training step")
    ax.set_ylabel("validation BLEU (greedy)")
    ax.legend(fontsize="small", ncol=2)
    return ax
