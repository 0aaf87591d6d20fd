"""Chapter 8's scoring beyond corpus_scores (transformer_lib.scoring): sacreBLEU's bootstrap interval and paired test,
and BLEU as Trevett's tutorial computes it, checked against torchtext's own bleu_score."""

import importlib.util
import random

import pytest
import sacrebleu

from transformer_lib.scoring import (
    bootstrap_interval,
    corpus_scores,
    paired_bootstrap,
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


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: bootstrap_interval(["a"] * 99, ["a"] * 99), "BLEU on 99 sentences is noise"),
        (lambda: bootstrap_interval(corpus(), corpus(199)), "got 200 hypotheses but 199 references"),
        (lambda: bootstrap_interval(corpus(), corpus(), n_bootstrap=1), "n_bootstrap must be an integer of at least 2"),
        (lambda: paired_bootstrap(corpus(), corpus(150), corpus()), "got 150 hypotheses but 200 references"),
        (lambda: paired_bootstrap("one string", corpus(), corpus()), "must be a list of sentences"),
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
