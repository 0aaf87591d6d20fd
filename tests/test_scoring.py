"""Chapter 8's scoring beyond corpus_scores (transformer_lib.scoring): sacreBLEU's bootstrap interval and paired test,
and BLEU as Trevett's tutorial computes it, checked against torchtext's own bleu_score."""

import importlib.util
import random

import numpy as np
import pytest
import sacrebleu

from transformer_lib.scoring import (
    bootstrap_interval,
    corpus_scores,
    paired_bootstrap,
    signed_paired_bootstrap,
    tutorial_bleu,
    tutorial_metric,
    tutorial_tokens,
)

WORDS = "a man woman dog girl boy runs sits walks on in the grass street red blue hat with ball".split()


def corpus(n: int = 200, seed: int = 0) -> list[str]:
    """n made-up captions of 6 to 12 words, the same for the same seed."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 12))).capitalize() + "." for _ in range(n)]


def damaged(sentences: list[str], every: int, seed: int = 1) -> list[str]:
    """Every `every`-th sentence with its words shuffled: a worse system than the sentences themselves."""
    rng = random.Random(seed)
    out = []
    for i, sentence in enumerate(sentences):
        words = sentence.rstrip(".").split()
        if i % every == 0:
            rng.shuffle(words)
        out.append(" ".join(words) + ".")
    return out


def test_the_interval_is_sacrebleus_and_repeats():
    references = corpus()
    hypotheses = damaged(references, 2)
    interval = bootstrap_interval(hypotheses, references)
    assert interval["score"] == pytest.approx(corpus_scores(hypotheses, references)["bleu"])
    assert interval["low"] < interval["score"] < interval["high"] and interval["ci"] > 0
    assert interval["high"] - interval["low"] == pytest.approx(2 * interval["ci"])
    assert "bs:1000" in interval["signature"] and "tok:13a" in interval["signature"]
    assert bootstrap_interval(hypotheses, references) == interval  # sacreBLEU's fixed seed: the same numbers
    chrf = sacrebleu.metrics.CHRF()
    assert bootstrap_interval(hypotheses, references, chrf)["score"] == pytest.approx(
        corpus_scores(hypotheses, references)["chrf"])
    assert chrf.n_bootstrap is None  # the caller's metric is left as it was: bootstrapping records itself in a copy


def test_the_paired_test_tells_a_real_gap_from_none():
    references = corpus()
    better, worse = damaged(references, 4), damaged(references, 2, seed=2)
    gap = paired_bootstrap(worse, better, references)
    assert gap["difference"] == pytest.approx(gap["system"] - gap["baseline"]) and gap["difference"] > 0
    assert gap["p_value"] == pytest.approx(1 / 1001)  # better on every resample: the smallest p 1,000 give
    assert "bs:1000" in gap["signature"]
    same = paired_bootstrap(better, list(better), references)
    assert same["difference"] == 0 and same["p_value"] == 1.0  # no difference at all: nothing to test
    noise = paired_bootstrap(damaged(references, 2, seed=3), damaged(references, 2, seed=4), references)
    assert noise["p_value"] > 0.05  # two systems damaged alike: a gap the test calls noise
    alone = bootstrap_interval(worse, references)  # sacreBLEU's seed: the same resamples as the interval's
    assert gap["baseline_ci"] == pytest.approx(alone["ci"], abs=1e-4)  # (sacreBLEU sums in float32)
    assert 0 < gap["difference_ci"] < gap["baseline_ci"] + gap["system_ci"]


def test_the_p_value_is_two_sided_where_sacrebleus_is_not():
    """A small gap between two systems damaged alike: sacreBLEU's --paired-bs centres the absolute differences, and
    so calls the gap less likely than it is; the signed test's p is the same whichever system is the baseline."""
    references = corpus(1000)
    one, other = damaged(references, 2, seed=3), damaged(references, 2, seed=4)
    ours, reversed_ = paired_bootstrap(one, other, references), paired_bootstrap(other, one, references)
    assert ours["p_value"] == pytest.approx(reversed_["p_value"])
    assert ours["difference"] == pytest.approx(-reversed_["difference"])
    test = sacrebleu.significance.PairedTest([("one", one), ("other", other)], {"score": sacrebleu.metrics.BLEU()},
                                             [references], test_type="bs", n_samples=1000)
    sacrebleus = test()[1]["BLEU"][1].p_value
    assert sacrebleus < 0.25 < ours["p_value"], (sacrebleus, ours["p_value"])


MEAN = lambda summed: summed[0] / summed[1]  # noqa: E731  (per-sentence scores and a count: a corpus mean)


def with_count(scores) -> np.ndarray:
    return np.column_stack([scores, np.ones(len(scores))])


def test_the_paired_test_by_hand():
    """Cases whose answer follows from the definition: every resample's difference the same (p = 1 / (B + 1), no
    spread), no difference at all (p = 1), and a difference of exactly 0 between unequal systems (p = 1)."""
    rng = np.random.default_rng(0)
    scores = rng.uniform(0, 1, 300)
    shifted = signed_paired_bootstrap(with_count(scores), with_count(scores + 0.01), MEAN, 999, seed=1)
    assert shifted["difference"] == pytest.approx(0.01) and shifted["p_value"] == pytest.approx(1 / 1000)
    assert shifted["difference_ci"] == pytest.approx(0, abs=1e-12)
    assert signed_paired_bootstrap(with_count(scores), with_count(scores), MEAN, 999, seed=1)["p_value"] == 1.0
    swings = scores + np.tile([0.25, -0.25], 150)  # up on one half, down on the other: a whole-set gap of 0
    balanced = signed_paired_bootstrap(with_count(scores), with_count(swings), MEAN, 999, seed=1)
    assert balanced["difference"] == pytest.approx(0, abs=1e-12) and balanced["p_value"] == 1.0
    assert balanced["difference_ci"] > 0


def sign_flip_p_value(differences: np.ndarray, flips: int, seed: int) -> float:
    """The paired permutation test of a mean difference: each sentence's two scores swapped at random."""
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(flips, len(differences)))
    as_far = np.abs((signs * differences).mean(axis=1)) >= abs(differences.mean())
    return (1 + int(as_far.sum())) / (flips + 1)


@pytest.mark.parametrize("shift", [0.0, 0.02, 0.05, 0.1, 0.15])
def test_the_paired_test_agrees_with_a_permutation_test(shift):
    """On made-up per-sentence scores and their mean, the bootstrap's p and the sign-flip permutation test's p
    estimate nearly the same number (both the normal approximation's two-sided p for n = 400). Tolerance: the Monte
    Carlo standard error of the two estimates' gap is at most sqrt(0.25 * (1/10,000 + 1/20,000)) = 0.0061; four of
    them, 0.025, and 0.005 for what the two methods' exact values differ by at n = 400 (the bootstrap's variance has
    n - 1 where the permutation's has n, and it centres the differences): 0.03. The draws are numpy's PCG64 with
    fixed seeds, the same on every machine."""
    rng = np.random.default_rng(7)
    baseline = rng.normal(0.5, 0.2, 400)
    system = baseline + rng.normal(shift, 0.8, 400)
    bootstrap = signed_paired_bootstrap(with_count(baseline), with_count(system), MEAN, 10_000, seed=3)
    permutation = sign_flip_p_value(system - baseline, 20_000, seed=1)
    assert abs(bootstrap["p_value"] - permutation) < 0.03, (bootstrap["p_value"], permutation)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: bootstrap_interval(["a"] * 99, ["a"] * 99), "BLEU on 99 sentences is noise"),
        (lambda: bootstrap_interval(corpus(), corpus(199)), "got 200 hypotheses but 199 references"),
        (lambda: bootstrap_interval(corpus(), corpus(), n_bootstrap=1), "n_bootstrap must be an integer of at least 2"),
        (lambda: paired_bootstrap(corpus(), corpus(150), corpus()), "got 150 hypotheses but 200 references"),
        (lambda: paired_bootstrap("one string", corpus(), corpus()), "must be a list of sentences"),
        (lambda: signed_paired_bootstrap(np.ones((5, 2)), np.ones((4, 2)), MEAN), "arrays of one shape, got"),
        (lambda: signed_paired_bootstrap(np.ones((5, 2)), np.ones((5, 2)), MEAN, 1), "n_bootstrap must be"),
    ],
)
def test_what_cannot_be_scored_is_refused_in_one_line(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


# ---- the tutorial's metric ----

needs_spacy = pytest.mark.skipif(
    importlib.util.find_spec("spacy") is None,
    reason="spaCy is not installed, so the tutorial's metric cannot be checked: pip install -e '.[tutorial]' (the dev "
           "and book extras include it)")

# torchtext's bleu_score (torchtext 0.18.0, the last release; it no longer imports with this torch) on the same
# sentences, split by spacy.blank("en") and lower-cased as Trevett's notebook splits them. Obtained by
# `pip download torchtext==0.18.0 --no-deps`, taking torchtext/data/metrics.py out of the wheel, inlining the
# ngrams_iterator it imports from torchtext/data/utils.py, and running bleu_score(candidates, [[reference] ...]) * 100
# standalone (torch 2.13.0, spaCy 3.8.18). torchtext counts in float32, hence the tolerance.
TORCHTEXT = {
    "three captions": (["A man in an orange hat is at something.", "Two dogs run across the green grass.",
                        "A girl is making a board with a board."],
                       ["A man in an orange hat starring at something.", "Two dogs are running on the grass.",
                        "A girl in karate uniform breaking a stick with a front kick."], 29.27712104066173),
    "short output": (["A dog runs.", "People are fixing the roof."],
                     ["A brown dog runs through the deep snow.", "People are fixing the roof of a house."],
                     28.2500626782673),
    "no 4-gram": (["A man rides a bike."], ["A man is riding a bicycle."], 0.0),
    "contractions and hyphens": (["The man's blue-eyed dog doesn't bark at the U.S. flag.",
                                  "A woman, wearing a red hat, sits on a bench."],
                                 ["The man's blue-eyed dog does not bark at the U.S. flag!",
                                  "A woman wearing a red hat is sitting on a bench."], 59.58064794540405),
}


@needs_spacy
@pytest.mark.parametrize("name", TORCHTEXT)
def test_the_tutorials_bleu_is_torchtexts(name):
    hypotheses, references, expected = TORCHTEXT[name]
    scored = tutorial_bleu(hypotheses, references, min_sentences=1)
    assert scored["bleu"] == pytest.approx(expected, abs=1e-4)
    assert "case:lc" in scored["bleu_signature"] and "tok:none" in scored["bleu_signature"]
    assert "smooth:none" in scored["bleu_signature"]


@needs_spacy
def test_the_tutorials_tokens_are_spacys_lower_cased():
    assert tutorial_tokens(["The man's blue-eyed dog doesn't bark at the U.S. flag.", "Two  dogs."]) == [
        "the man 's blue - eyed dog does n't bark at the u.s. flag .", "two dogs ."]
    scored = tutorial_bleu(corpus(), corpus())
    assert scored["bleu"] == pytest.approx(100) and scored["reference_tokens"][0] == tutorial_tokens(corpus(1))[0]
    interval = bootstrap_interval(scored["hypothesis_tokens"], scored["reference_tokens"], tutorial_metric())
    assert interval["score"] == pytest.approx(100)


def test_without_spacy_the_tutorials_metric_says_how_to_install_it(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "spacy", None)  # import spacy now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'transformer-lib\[tutorial\]'"):
        tutorial_tokens(["A dog."])
