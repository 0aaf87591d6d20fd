"""transformer_lib.split_decoding: a split decoded batch by batch gives exactly translate's translations, its
progress is shown as it goes (a bar in a terminal, lines in a log), and the commands that decode show it."""

import io
import json
import random

import pytest
import torch
from test_translation import QUICK, small_model, tiny_corpus

import transformer_lib as tl
from transformer_lib import cli, data, recipe, split_decoding, translation, validation

WORDS = ["ein", "eine", "hund", "katze", "mann", "frau", "läuft", "spielt", "im", "park", "auf", "der", "straße"]


def sentences(count: int, seed: int = 0) -> list[str]:
    """Sentences of 1 to 12 words, so that sorting them by length reorders them and the batches pad differently."""
    generator = random.Random(seed)
    return [" ".join(generator.choice(WORDS) for _ in range(generator.randint(1, 12))) for _ in range(count)]


def small_translator():
    tokenizer = tl.train_word_tokenizer(sentences(200, seed=1), vocab_size=30, min_frequency=1)
    assert tokenizer.get_vocab_size() <= 30  # the model's vocabularies: 30 ids
    return small_model(), tokenizer


def test_batch_by_batch_is_translate_itself_the_same_batches_in_the_same_order(monkeypatch):
    """translate_batches calls translate once per batch of decoding_batches: beam_search must see the very tensors
    that one call of translate for all the sentences gives it, in the same order, and the translations be equal."""
    model, tokenizer = small_translator()
    given = sentences(150)  # three batches of at most 64
    seen = []

    def recording(model, src, **options):
        seen.append((src.clone(), dict(options)))
        return beam_search(model, src, **options)

    beam_search = translation.beam_search
    monkeypatch.setattr(translation, "beam_search", recording)
    whole = translation.translate(model, tokenizer, given, beam_size=2, max_len=8, alpha=0.6)
    at_once, seen[:] = list(seen), []
    progress = split_decoding.DecodeProgress(len(given), 1, "test", enabled=False)
    batched = split_decoding.translate_batches(model, tokenizer, given, beam_size=2, alpha=0.6, max_len=8,
                                               progress=progress)
    assert batched == whole
    assert len(seen) == len(at_once) == 3 and progress.done_sentences == 150
    for (src, options), (expected, expected_options) in zip(seen, at_once):
        assert options == expected_options and torch.equal(src, expected)
    assert [len(indices) for indices, _ in split_decoding.decoding_batches(tokenizer, given)] == [64, 64, 22]
    assert progress.done_work == split_decoding.source_positions(split_decoding.decoding_batches(tokenizer, given))


def test_a_sentence_is_named_by_its_number_among_all_not_within_its_batch():
    model, tokenizer = small_translator()
    given = sentences(70) + ["hund " * 50]  # the 71st, too long for max_len=40, in the second batch
    with pytest.raises(ValueError, match="the length of sentence 71 in tokens"):
        split_decoding.translate_batches(model, tokenizer, given, beam_size=1, alpha=0.0)


def test_too_few_sentences_to_score_are_refused_before_anything_is_decoded():
    with pytest.raises(ValueError, match=r"^BLEU on 99 sentences is noise; expected at least 100"):
        split_decoding.decode_and_score(None, None, ["a"] * 99, ["b"] * 99, beam_size=1, alpha=0.0)
    with pytest.raises(ValueError, match=r"^100 source sentences but 101 references"):
        split_decoding.decode_and_score(None, None, ["a"] * 100, ["b"] * 101, beam_size=1, alpha=0.0)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_in_a_log_the_progress_is_a_first_line_then_a_line_every_so_often_and_one_at_the_end(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(split_decoding.time, "perf_counter", lambda: now[0])
    log = io.StringIO()
    with split_decoding.DecodeProgress(300, 3000, "translating", stream=log, every=25.0) as progress:
        assert log.getvalue() == "translating: 300 sentences to decode; a progress line about every 25 s\n"
        now[0] = 20.0
        progress.advance(100, 500)  # no line yet
        now[0] = 40.0
        progress.advance(100, 1000)  # a line; 1,500 of 3,000 positions left, after 40 s for 1,500
        now[0] = 70.0
        progress.advance(100, 1500)  # the last batch: the end line says it
    lines = log.getvalue().splitlines()
    assert lines[1:] == ["decoded 200 of 300 sentences (67%) in 0:40, 5.00 sentences/s; about 0:40 left",
                         "decoded 300 sentences in 1:10 (4.29 sentences/s)"]


def test_in_a_terminal_the_progress_is_a_bar_with_the_time_left():
    screen = Terminal()
    with split_decoding.DecodeProgress(128, 640, "translating", stream=screen) as progress:
        progress.advance(64, 128)
        progress.write("a line of output", file=screen)
    shown = screen.getvalue()
    assert "translating:" in shown and "64/128 sentences" in shown and "left]" in shown
    assert "a line of output\n" in shown and "128/128" not in shown  # the bar says only what was decoded


def test_no_progress_shows_nothing():
    log = io.StringIO()
    with split_decoding.DecodeProgress(10, 10, "translating", enabled=False, stream=log) as progress:
        progress.advance(10, 10)
    assert log.getvalue() == ""


# ---- the commands, in-process, on a made-up corpus and a run of a few steps ----


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("split_decoding")
    corpus = tiny_corpus(folder / "data", rows=130)  # every split: 130 pairs, enough to score
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(data.DATA_ENV, str(corpus))
        recipe.train_translator(folder / "run", preset="tiny", overrides=QUICK, epochs=2, progress=False)
    return folder


def test_sweep_gives_validation_sweeps_rows_exactly(quick_run, monkeypatch, capsys):
    monkeypatch.setenv(data.DATA_ENV, str(quick_run / "data"))
    pairs = data.load_pairs("multi30k", "validation", "de", "en")
    options = dict(beam_size=2, alphas=(0.6, 1.0), average_lasts=None, max_len=10)
    expected = validation.validation_sweep(quick_run / "run", pairs, progress=False, **options)
    rows = split_decoding.sweep(quick_run / "run", pairs, progress=False, print_rows=False, **options)
    assert rows == expected and len(rows) == 4  # the final weights and the average of 2 epochs, 2 alphas each
    assert capsys.readouterr().out == ""


def test_choose_and_evaluate_say_at_once_what_they_decode_and_how_far_they_are(quick_run, monkeypatch, capsys):
    monkeypatch.setenv(data.DATA_ENV, str(quick_run / "data"))
    monkeypatch.setattr(split_decoding, "PROGRESS_EVERY", 0.0)  # a line after every batch
    run = str(quick_run / "run")
    code = cli.main(["choose", "--checkpoint", run, "--beam", "2", "--alpha", "0.6", "1.0", "--max-len", "10"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err.splitlines()[0] == "4 decodings of 130 sentences: 520 sentences to decode; a progress line about " \
                                  "every 0 s"
    assert "decoded 130 of 520 sentences (25%) in " in err and "decoded 520 sentences in " in err
    assert len([line for line in out.splitlines() if line.startswith("  ") and " alpha " in line]) == 4
    assert "chosen on the validation split" in out
    code = cli.main(["choose", "--checkpoint", run, "--beam", "2", "--alpha", "0.6", "--average", "1", "--max-len",
                     "10", "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 0 and "decod" not in err, err  # no progress, but the row tried is still printed
    assert len([line for line in out.splitlines() if line.startswith("  ") and " alpha 0.6: BLEU" in line]) == 1

    code = cli.main(["evaluate", "--checkpoint", run, "--split", "test", "--max-len", "10"])
    out, err = capsys.readouterr()
    assert code == 0 and "translating: 130 sentences to decode" in err and "decoded 130 sentences in " in err, err
    assert "decoded 64 of 130 sentences (49%)" in err and "on 130 sentences" in out

    code = cli.main(["evaluate", "--checkpoint", run, "--split", "test", "--max-len", "10", "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 0 and "decoded" not in err and "to decode" not in err and "on 130 sentences" in out


def test_translate_shows_progress_only_for_more_than_a_batch_of_sentences(quick_run, monkeypatch, capsys):
    run = str(quick_run / "run")
    lines = [json.loads(line)["de"] for line in (quick_run / "data" / "multi30k" / "test.jsonl").open()]
    code = cli.main(["translate", "--checkpoint", run, "--max-len", "10", *lines[:64]])
    out, err = capsys.readouterr()
    assert code == 0 and out.count("\n") == 64 and "to decode" not in err
    code = cli.main(["translate", "--checkpoint", run, "--max-len", "10", *lines[:65]])
    out, err = capsys.readouterr()
    assert code == 0 and out.count("\n") == 65 and "translating: 65 sentences to decode" in err
    code = cli.main(["translate", "--checkpoint", run, "--max-len", "10", "--no-progress", *lines[:65]])
    out, err = capsys.readouterr()
    assert code == 0 and out.count("\n") == 65 and "to decode" not in err
