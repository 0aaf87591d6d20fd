"""Decoding a split and scoring it, with its progress shown (hand-written: the command line, benchmarks/ablations.py
and benchmarks/recipe_trial.py call it; chapter 8 teaches the same steps in validation_sweep and its test cells).

- `decoding_batches`: the batches `translation.translate` decodes, in its order; `translate_batches` decodes them
  one call of `translate` each, so that the translations are those of one call for all (the same batches, the same
  order), and moves a `DecodeProgress` between them.
- `DecodeProgress`: sentences decoded, their rate and the time left, on stderr: a tqdm bar in a terminal, else a
  line at the start and about every PROGRESS_EVERY seconds, so that a log shows the command is alive.
- `translate_with_progress`: translate_batches under a progress of its own; `decode_and_score`: that, then the
  scores (corpus_scores); `sweep`: validation_sweep's decodings (each weights x alpha on the validation split) under
  one progress; `split_pairs`: the split of a run's corpus.
- `stdin_sentences`: the sentences given on standard input, checked; `warn_empty`: the warning that names the
  sentences whose translation came out empty.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import torch
from tokenizers import Tokenizer
from tqdm import tqdm

from transformer_lib.data import load_pairs
from transformer_lib.files import decode_text, without_byte_order_mark
from transformer_lib.guards import lock_run_folder
from transformer_lib.model import Transformer
from transformer_lib.positional import check_length
from transformer_lib.runs import kept_epochs, read_run_record
from transformer_lib.scoring import corpus_scores
from transformer_lib.translation import check_sentences, checkpoint_file, load_translator, translate, weights_label

BATCH_SIZE = 64  # sentences per batch: translate's default, passed to it explicitly
MIN_SENTENCES = 100  # corpus_scores' min_sentences: BLEU on fewer sentences is noise
PROGRESS_EVERY = 30.0  # seconds between the progress lines written where stderr is not a terminal


def split_pairs(run: dict, split: str) -> list[tuple[str, str]]:
    """The (source, reference) pairs of a split of the corpus a run trained on (run: its run record)."""
    return load_pairs(run["corpus"], split, run["src_lang"], run["tgt_lang"], run["corpus_config"])


def decoding_batches(tokenizer: Tokenizer, sentences: Sequence[str]) -> list[tuple[list[int], int]]:
    """The batches translation.translate decodes, in its order: (the indices of their sentences, their length in
    tokens when padded). translate sorts the sentences by length (a stable sort) and cuts that order every
    BATCH_SIZE sentences; a batch given to translate alone is already sorted, so it is decoded as that one batch."""
    lengths = [len(encoding.ids) for encoding in tokenizer.encode_batch(list(sentences))]
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches = [order[start: start + BATCH_SIZE] for start in range(0, len(order), BATCH_SIZE)]
    return [(indices, max(lengths[i] for i in indices)) for indices in batches]


def source_positions(batches: Sequence[tuple[list[int], int]]) -> int:
    """The source positions a batch pads to, summed: beam search's time grows with them (a batch of long sentences
    takes more steps), so that the time left is not read off the short sentences decoded first."""
    return sum(len(indices) * padded for indices, padded in batches)


class DecodeProgress:
    """Sentences decoded so far, their rate and the time left, on `stream` (stderr by default).

    In a terminal, a tqdm bar; elsewhere (a log, a pipe) a line when it starts, saying what is decoded, then a line
    about every `every` seconds (PROGRESS_EVERY by default) and one at the end. The time left is estimated from the
    source positions left to decode (source_positions), not from the sentences: they are decoded shortest first.
    Nothing is shown when enabled is False. Use it as a context manager; advance() after each batch, write() for a
    line of output while it runs.
    """

    def __init__(self, sentences: int, work: int, what: str, enabled: bool = True, stream: TextIO | None = None,
                 every: float | None = None) -> None:
        self.sentences, self.work, self.enabled = sentences, work, enabled
        self.every = PROGRESS_EVERY if every is None else every
        self.stream = stream if stream is not None else sys.stderr
        self.done_sentences = self.done_work = 0
        self.started = self.last_line = time.perf_counter()
        self.bar = None
        if not enabled:
            return
        if self.stream.isatty():
            self.bar = tqdm(total=sentences, desc=what, unit=" sentences", file=self.stream, leave=True,
                            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} sentences "
                                       "[{elapsed}, {rate_fmt}{postfix}]")
        else:
            print(f"{what}: {sentences:,} sentences to decode; a progress line about every {self.every:g} s",
                  file=self.stream, flush=True)

    def time_left(self) -> float | None:
        """Seconds left, from the rate so far per source position; None before the first batch is done."""
        if not self.done_work:
            return None
        return (time.perf_counter() - self.started) * (self.work - self.done_work) / self.done_work

    def advance(self, sentences: int, work: int) -> None:
        """Count a batch decoded: its sentences and its source positions."""
        self.done_sentences += sentences
        self.done_work += work
        if not self.enabled:
            return
        left = _clock(self.time_left())
        if self.bar is not None:
            self.bar.set_postfix_str(f"about {left} left", refresh=False)
            self.bar.update(sentences)
        elif time.perf_counter() - self.last_line >= self.every and self.done_sentences < self.sentences:
            elapsed = time.perf_counter() - self.started
            print(f"decoded {self.done_sentences:,} of {self.sentences:,} sentences "
                  f"({100 * self.done_sentences / self.sentences:.0f}%) in {_clock(elapsed)}, "
                  f"{self.done_sentences / elapsed:.2f} sentences/s; about {left} left", file=self.stream, flush=True)
            self.last_line = time.perf_counter()

    def write(self, line: str, file: TextIO | None = None) -> None:
        """Print a line of output (stdout by default) above the bar, which stays at the bottom."""
        if self.bar is not None:
            self.bar.write(line, file=file or sys.stdout)
        else:
            print(line, file=file or sys.stdout, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and self.done_sentences:
            elapsed = time.perf_counter() - self.started
            print(f"decoded {self.done_sentences:,} sentences in {_clock(elapsed)} "
                  f"({self.done_sentences / elapsed:.2f} sentences/s)", file=self.stream, flush=True)
        self.enabled = False

    def __enter__(self) -> DecodeProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _clock(seconds: float | None) -> str:
    """Seconds as m:ss or h:mm:ss; '?' when unknown."""
    if seconds is None:
        return "?"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def translate_batches(model: Transformer, tokenizer: Tokenizer, sentences: Sequence[str], *, beam_size: int,
                      alpha: float, max_len: int | None = None, progress: DecodeProgress | None = None,
                      batches: Sequence[tuple[list[int], int]] | None = None) -> list[str]:
    """translate(model, tokenizer, sentences, ...), one batch per call, the progress moved after each batch.

    The translations are those of one call for all the sentences: the same batches (decoding_batches, or the
    batches given, which must be that), in the same order. The sentences are checked first, as translate checks
    them, so that an error names a sentence by its number among all of them.
    """
    check_sentences(sentences)
    for index, encoding in enumerate(tokenizer.encode_batch(list(sentences))):
        check_length(len(encoding.ids), model.cfg.max_len, name=f"the length of sentence {index + 1} in tokens")
    batches = decoding_batches(tokenizer, sentences) if batches is None else batches
    results: list[str] = [""] * len(sentences)
    for indices, padded in batches:
        decoded = translate(model, tokenizer, [sentences[i] for i in indices], beam_size=beam_size,
                            batch_size=BATCH_SIZE, max_len=max_len, alpha=alpha)
        for i, text in zip(indices, decoded):
            results[i] = text
        if progress is not None:
            progress.advance(len(indices), len(indices) * padded)
    return results


def translate_with_progress(model: Transformer, tokenizer: Tokenizer, sentences: Sequence[str], *, beam_size: int,
                            alpha: float, max_len: int | None = None, progress: bool = True) -> list[str]:
    """translate_batches under a DecodeProgress of its own (on stderr; none when progress is False)."""
    batches = decoding_batches(tokenizer, sentences)
    with DecodeProgress(len(sentences), source_positions(batches), "translating", enabled=progress) as bar:
        return translate_batches(model, tokenizer, sentences, beam_size=beam_size, alpha=alpha, max_len=max_len,
                                 progress=bar, batches=batches)


def warn_empty(translations: Sequence[str]) -> None:
    """A warning on stderr naming the sentences whose translation came out empty (the command line's)."""
    empty = [number for number, text in enumerate(translations, 1) if not text.strip()]
    if empty:
        shown = ", ".join(map(str, empty[:10])) + (", ..." if len(empty) > 10 else "")
        print(f"warning: {len(empty)} of {len(translations)} translations are empty (sentence {shown}): the model "
              f"ended them at once with <eos>, as an undertrained model often does; train longer", file=sys.stderr)


def stdin_sentences(data: bytes) -> list[str]:
    """The sentences of standard input's bytes, one per line: UTF-8 (a byte order mark first is the encoding mark),
    split only at line ends (LF or CRLF), each stripped; empty lines skipped with a note on stderr, unless all are empty
    (then no sentences); each checked by check_sentences, named "line N of standard input"."""
    text = without_byte_order_mark(decode_text(data, "standard input"), "standard input")
    # Only \n (and \r\n) ends a line: str.splitlines() would also split at U+2028, U+0085, form feeds and more,
    # and give more translations than sentences.
    lines = [line.strip() for line in text.removesuffix("\n").split("\n")] if text else []
    skipped = [str(number) for number, line in enumerate(lines, 1) if not line]
    if skipped and len(skipped) < len(lines):
        print(f"note: skipped {len(skipped)} empty line{'s' if len(skipped) > 1 else ''} of standard input "
              f"(line {', '.join(skipped[:10])}{', ...' if len(skipped) > 10 else ''})", file=sys.stderr)
    kept = [(number, line) for number, line in enumerate(lines, 1) if line]
    check_sentences([line for _, line in kept], [f"line {number} of standard input" for number, _ in kept])
    return [line for _, line in kept]


def check_scorable(sources: Sequence[str], references: Sequence[str], what: str = "source sentences") -> None:
    """Refuse, before any decoding, sources (or translations) and references that corpus_scores could not score."""
    if len(sources) != len(references):
        raise ValueError(f"{len(sources)} {what} but {len(references)} references; they must pair up one to one")
    if len(sources) < MIN_SENTENCES:
        raise ValueError(f"BLEU on {len(sources)} sentences is noise; expected at least {MIN_SENTENCES} (score a "
                         f"whole test set)")


def score_translations(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
    """corpus_scores of translations against their references, at least MIN_SENTENCES of them."""
    check_scorable(hypotheses, references, "translations")
    return corpus_scores(hypotheses, references, min_sentences=MIN_SENTENCES)


def decode_and_score(model: Transformer, tokenizer: Tokenizer, sources: Sequence[str], references: Sequence[str],
                     *, beam_size: int, alpha: float, max_len: int | None = None,
                     progress: bool = True) -> tuple[list[str], dict]:
    """Translate sources (translate_with_progress) and score the translations against references
    (score_translations); returns both. Sentences that could not be scored are refused before any decoding."""
    check_scorable(sources, references)
    hypotheses = translate_with_progress(model, tokenizer, sources, beam_size=beam_size, alpha=alpha,
                                         max_len=max_len, progress=progress)
    return hypotheses, score_translations(hypotheses, list(references))


def sweep(run_folder: str | Path, pairs: Sequence[tuple[str, str]], beam_size: int = 4,
          alphas: Sequence[float] = (0.6, 0.8, 1.0, 1.2), average_lasts: Sequence[int] | None = None,
          max_len: int | None = None, device: torch.device | str | None = None, progress: bool = True,
          print_rows: bool = True) -> list[dict]:
    """validation.validation_sweep's decodings and rows, under one DecodeProgress for all of them.

    Each weights (average_lasts; by default the final weights and the average of every epoch the run keeps) x
    alpha (one decoding with alpha 0 for greedy search) translates the source side of pairs; the rows are
    validation_sweep's: average_last, weights, beam_size, alpha, scores and hypotheses, in the order tried, each
    printed (on stdout) as it comes when print_rows is True. progress=False shows no progress. The run folder is
    locked meanwhile.
    """
    if not alphas or (average_lasts is not None and not average_lasts):
        raise ValueError(f"sweep needs at least one alpha and one weights to try, got alphas={alphas!r} and "
                         f"average_lasts={average_lasts!r}")
    folder = Path(run_folder)
    sources, references = [src for src, _ in pairs], [tgt for _, tgt in pairs]
    check_scorable(sources, references)
    rows = []
    with lock_run_folder(folder):
        if average_lasts is None:
            kept = len(kept_epochs(folder))  # every epoch the run should keep is there, or one line
            average_lasts = [1] + ([kept] if kept > 1 else [])
        weights_tried = list(dict.fromkeys(average_lasts))  # each once, in the order given
        alphas_tried = list(dict.fromkeys(alphas if beam_size > 1 else [0.0]))
        decodings = len(weights_tried) * len(alphas_tried)
        tokenizer = Tokenizer.from_str(read_run_record(checkpoint_file(folder))["tokenizer"])  # every weights' own
        batches = decoding_batches(tokenizer, sources)  # the same for every decoding
        what = f"{decodings} decoding{'s' * (decodings > 1)} of {len(sources):,} sentences"
        with DecodeProgress(decodings * len(sources), decodings * source_positions(batches), what, progress) as bar:
            for average_last in weights_tried:
                model, tokenizer = load_translator(folder, device, average_last=average_last)
                weights = weights_label(folder, average_last)
                for alpha in alphas_tried:
                    hypotheses = translate_batches(model, tokenizer, sources, beam_size=beam_size, alpha=alpha,
                                                   max_len=max_len, progress=bar, batches=batches)
                    scores = score_translations(hypotheses, references)
                    rows.append({"average_last": average_last, "weights": weights, "beam_size": beam_size,
                                 "alpha": alpha, "scores": scores, "hypotheses": hypotheses})
                    if print_rows:
                        bar.write(f"  {weights:36s} alpha {alpha:.1f}: BLEU {scores['bleu']:5.2f}   BP "
                                  f"{scores['bp']:.3f}   length ratio {scores['ratio']:.3f}")
    return rows
