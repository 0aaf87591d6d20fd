"""The command line: python -m transformer_lib train|translate|evaluate (hand-written; the book teaches the pieces).

Imports are at the top: `python -m transformer_lib` imports the package, and with it these modules, first anyway.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import traceback
from contextlib import nullcontext
from pathlib import Path

import torch

from transformer_lib.data import CORPORA, SPLITS
from transformer_lib.decoding import EXTRA_TOKENS
from transformer_lib.distributed import TorchrunProcess, launch_info, launched_by_torchrun
from transformer_lib.files import atomic_write_text, check_argument_text, read_lines, read_settings_file
from transformer_lib.guards import DivergedError, lock_run_folder
from transformer_lib.recipe import PRESETS, check_fits_in_memory, default_preset, resolve_settings, train_translator
from transformer_lib.runtime import training_threads
from transformer_lib.runs import (DECODING_FILE, check_run_folder, check_save_hyp, kept_epochs, last_loss,
                                  read_run_record, steps_trained, write_decoding)
from transformer_lib.scoreboard import (check_scoreboard_folder, replaced_record, run_facts, scoreboard_record,
                                       write_scoreboard)
from transformer_lib.settings import MAX_BEAM, MAX_SEED
from transformer_lib.split_decoding import (BATCH_SIZE, MIN_SENTENCES, PROGRESS_EVERY, decode_and_score,
                                            score_translations, split_pairs, stdin_sentences, sweep,
                                            translate_with_progress, warn_empty)
from transformer_lib.training import SingleProcess
from transformer_lib.translation import (
    DEFAULT_DECODING,
    check_sentences,
    checkpoint_file,
    decoding_source,
    load_translator,
    weights_label,
)
from transformer_lib.validation import best_decoding, epoch_line

CHOOSE_ALPHAS = (0.6, 0.8, 1.0, 1.2)  # the length-penalty exponents chapter 8 tries on the validation split
RESUME_FIXED = ("preset", "config", "corpus", "corpus_config", "src", "tgt", "seed", "train_limit", "valid_limit")

EPILOG = """examples:
  python -m transformer_lib train --preset multi30k --out runs/de-en
  python -m transformer_lib train --preset tiny --max-steps 200 --train-limit 2000 --out runs/tiny
  python -m transformer_lib train --out runs/de-en --resume
  python -m transformer_lib train --preset tiny --max-steps 200 --out runs/tiny --overwrite
  torchrun --standalone --nproc_per_node=2 -m transformer_lib train --preset tiny --max-steps 200 --out runs/ddp
  python -m transformer_lib translate --checkpoint runs/de-en "Ein Mann fährt Fahrrad."
  echo "Zwei Hunde spielen im Schnee." | python -m transformer_lib translate --checkpoint runs/de-en
  python -m transformer_lib choose --checkpoint runs/de-en
  python -m transformer_lib choose --checkpoint runs/de-en --limit 200
  python -m transformer_lib evaluate --checkpoint runs/de-en --split test
  python -m transformer_lib evaluate --checkpoint runs/de-en --split test --scoreboard benchmarks/results/scoreboard
  python -m transformer_lib evaluate --checkpoint runs/de-en --src-file test.de --ref-file test.en
  python -m transformer_lib evaluate --hyp-file output.en --ref-file test.en
"""


def _existing_file(value: str) -> Path:
    path = Path(value)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"file {value!r} does not exist" if not path.exists() else
                                         f"{value!r} is {'a folder' if path.is_dir() else 'not a regular file'}; "
                                         f"expected a file")
    return path


def _integer_at_least(least: int, expected: str, most: int | None = None):
    """An argparse type: an integer of at least least (and at most most); the error says what was expected."""
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = None
        if number is None or number < least or (most is not None and number > most):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value!r}")
        return number
    return parse


positive_int = _integer_at_least(1, "a positive integer")  # the benchmarks' command lines use these types too
non_negative_int = _integer_at_least(0, "an integer >= 0")
seed_value = _integer_at_least(0, f"a seed from 0 to {MAX_SEED}", most=MAX_SEED)


def _run_folder(value: str) -> Path:
    if not value.strip():
        raise argparse.ArgumentTypeError(f"expected a folder name, got {value!r}")  # Path('') is the current folder
    return Path(value)


def _corpus_config(value: str) -> str:
    # The name becomes a file name, $TRANSFORMER_LIB_DATA/opus_books/{value}.jsonl: no separators, no '..'
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", value):
        raise argparse.ArgumentTypeError(f"expected a language pair as the Hub names it, like 'en-it', got {value!r}")
    return value


def alpha_value(value: str) -> float:
    """An argparse type: a length-penalty exponent, from 0 (none) to 10."""
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not 0.0 <= number <= 10.0:  # (also refuses nan and inf)
        raise argparse.ArgumentTypeError(f"expected a length penalty exponent from 0 (none) to 10, got {value!r}")
    return number


def _device(value: str) -> torch.device:
    try:
        device = torch.device(value)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"expected a device such as cpu, cuda or cuda:1, got {value!r}") from None
    if device.type not in ("cpu", "cuda", "mps"):  # torch names more (meta, xpu, ...): the book trains on these
        raise argparse.ArgumentTypeError(f"expected cpu, cuda, cuda:N or mps, got {value!r} (a {device.type} device, "
                                         f"which this library does not train or translate on)")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{value!r}: this machine has no CUDA GPU that torch can use")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"{value!r}: this machine has {torch.cuda.device_count()} GPU(s), "
                                         f"numbered from 0")
    if device.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise argparse.ArgumentTypeError(f"{value!r}: Apple's MPS is not available here")
    return device


def beam_size(value: str) -> int:
    """An argparse type: a beam size from 1 (greedy search) to MAX_BEAM."""
    number = positive_int(value)
    if number > MAX_BEAM:
        raise argparse.ArgumentTypeError(f"expected a beam size from 1 to {MAX_BEAM}, got {value!r}")
    return number


class UsageError(Exception):
    """A wrong combination of command-line arguments: reported with the usage line and exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m transformer_lib",
        description="Train, run and score the book's encoder-decoder Transformer.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--debug", action="store_true", help="show the full traceback of any error")
    debug = argparse.ArgumentParser(add_help=False)  # --debug also after the command
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show the full traceback of any error")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{train,translate,choose,evaluate}")

    train = commands.add_parser("train", parents=[debug], help="train a translator and save checkpoint.pt, tokenizer.json, history.json")
    train.add_argument("--preset", choices=sorted(PRESETS),
                       help="model and training sizes (default: multi30k on a GPU, multi30k-cpu without one)")
    train.add_argument("--config", type=_existing_file, help='JSON file overriding the preset: {"model": {...}, "training": {...}}')
    train.add_argument("--corpus", choices=sorted(CORPORA), help="default: multi30k")
    train.add_argument("--corpus-config", type=_corpus_config, help="opus_books language pair as the Hub names it, e.g. en-it")
    train.add_argument("--src", help="source language (default: de)")
    train.add_argument("--tgt", help="target language (default: en)")
    length = train.add_mutually_exclusive_group()
    length.add_argument("--max-steps", type=positive_int,
                        help="stop after this many optimizer steps in all; with --resume, the run's new length, "
                             "replacing the saved one (one shorter than what it has trained is refused)")
    length.add_argument("--epochs", type=positive_int,
                        help="stop after this many passes over the data in all (default: the preset's); with "
                             "--resume, the run's new length, replacing the saved one, steps or epochs")
    train.add_argument("--train-limit", type=positive_int, help="use only the first N training pairs (quick runs)")
    validation = train.add_mutually_exclusive_group()
    validation.add_argument("--valid-limit", type=positive_int,
                            help="score only the first N validation pairs after each epoch (default: --train-limit's "
                                 "value when it is given, else all of them)")
    validation.add_argument("--no-validation", action="store_true", help="skip validation after each epoch")
    train.add_argument("--out", type=_run_folder, required=True, help="run folder for checkpoint, tokenizer and history")
    train.add_argument("--resume", action="store_true",
                       help="continue the run in --out with its saved settings, data and seed (if finished: no-op)")
    train.add_argument("--overwrite", action="store_true", help="replace the run already saved in --out")
    train.add_argument("--compile", action="store_true", help="compile the model with torch.compile")
    train.add_argument("--seed", type=seed_value, help=f"0 to {MAX_SEED}; default: 0")
    train.add_argument("--device", type=_device, help="cpu, cuda, cuda:N or mps (default: the best there is)")
    train.add_argument("--threads", type=positive_int,
                       help="CPU threads for training on the CPU (default: every core when nothing else runs, else 1: "
                            "torch's threads slow down several-fold beside other work)")
    train.add_argument("--no-progress", action="store_true",
                       help="no progress bar (a line per epoch still says how training goes)")

    translate = commands.add_parser("translate", parents=[debug], help="translate sentences given as arguments or on standard input")
    translate.add_argument("--checkpoint", type=Path, required=True, help="checkpoint.pt or the run folder holding it")
    translate.add_argument("--beam", type=beam_size, help=f"beam size from 1 (greedy search) to {MAX_BEAM}")
    choose = commands.add_parser(
        "choose", parents=[debug],
        help=f"choose on the validation split how a run decodes (alpha, averaged weights) and save it in {DECODING_FILE}",
        description=f"Decode the run's own validation split with each alpha and each number of averaged epochs, "
                    f"and write the best (by BLEU) to {DECODING_FILE} in the run folder, where translate, evaluate "
                    f"and evaluate --scoreboard find it. The choice is made on the validation split only, as chapter 8 "
                    f"makes it; the test split is never decoded here.")
    choose.add_argument("--checkpoint", type=Path, required=True, help="checkpoint.pt or the run folder holding it")
    choose.add_argument("--beam", type=beam_size, help="beam size from 1 to %d (default: the run's settings, else %d)"
                        % (MAX_BEAM, DEFAULT_DECODING["beam_size"]))
    choose.add_argument("--alpha", type=alpha_value, nargs="+", default=list(CHOOSE_ALPHAS),
                        help="length-penalty exponents to try (default: %(default)s)")
    choose.add_argument("--limit", type=_integer_at_least(MIN_SENTENCES, f"an integer >= {MIN_SENTENCES} (BLEU on "
                                                                       f"fewer sentences is noise)"), metavar="N",
                        help=f"decode only the first N validation sentences, at least {MIN_SENTENCES}: a quick trial "
                             f"(Multi30k's split has 1,014; the README gives the times); the choice is then made on "
                             f"those, and decoding.json says on how many")
    choose.add_argument("--average", type=positive_int, nargs="+",
                        help="numbers of last epochs whose weights to average, 1 for the final weights (default: 1 and "
                             "every epoch the run keeps)")

    evaluate = commands.add_parser("evaluate", parents=[debug], help="corpus BLEU and chrF with sacreBLEU")
    for command in (translate, evaluate):  # choose takes several --alpha
        command.add_argument("--alpha", type=alpha_value, help="length penalty exponent of beam search, 0 for none")
    for command in (translate, choose, evaluate):  # how translate() decodes, and where
        command.add_argument("--max-len", type=positive_int,
                             help=f"at most this many tokens per translation (default: the source's length + "
                                  f"{EXTRA_TOKENS})")
        command.add_argument("--device", type=_device, help="cpu, cuda, cuda:N or mps (default: the best there is)")
        many = f" (for more than {BATCH_SIZE} sentences)" if command is translate else ""
        command.add_argument("--no-progress", action="store_true",
                             help=f"show no progress{many} on stderr: by default a bar in a terminal, elsewhere a "
                                  f"line every {PROGRESS_EVERY:g} s (sentences decoded, their rate, the time left)")
    translate.add_argument("sentences", nargs="*", help="sentences to translate (default: one per line from stdin)")
    for command in (translate, evaluate):
        command.epilog = (f"--beam and --alpha not given come from the run's {DECODING_FILE} (written by "
                          f"runs.write_decoding, chosen on the validation split) when the checkpoint's folder holds "
                          f"one, else from the run's settings (settings['decoding']), else beam "
                          f"{DEFAULT_DECODING['beam_size']} and alpha {DEFAULT_DECODING['alpha']}; a note on stderr "
                          f"says which.")

    evaluate.add_argument("--checkpoint", type=Path, help="checkpoint.pt or the run folder holding it")
    evaluate.add_argument("--split", choices=SPLITS, help="score the checkpoint's own corpus split")
    evaluate.add_argument("--src-file", type=_existing_file, help="source sentences, one per line")
    evaluate.add_argument("--hyp-file", type=_existing_file, help="translations already made, one per line")
    evaluate.add_argument("--ref-file", type=_existing_file, help="reference translations, one per line")
    evaluate.add_argument("--beam", type=beam_size, help=f"beam size from 1 to {MAX_BEAM}")
    evaluate.add_argument("--save-hyp", type=Path, help="write the translations to this file (not one of the inputs)")
    evaluate.add_argument("--scoreboard", type=_run_folder, metavar="DIR",
                          help=f"with --split test: write the run's scoreboard record to DIR/<preset>-<device>.json "
                               f"(-fp16.json for a run trained in float16): training minutes and steps from the "
                               f"checkpoint, the decoding and validation scores from its {DECODING_FILE} (never "
                               f"--beam, --alpha or --max-len). Run it where the run trained: the record names this "
                               f"machine's CPU or GPU")
    for command, handler in ((train, cmd_train), (translate, cmd_translate), (choose, cmd_choose),
                             (evaluate, cmd_evaluate)):
        command.set_defaults(handler=handler, parser=command)
    return parser


def _load(checkpoint: Path, device: torch.device | None = None):
    if not checkpoint.exists():
        raise FileNotFoundError(f"--checkpoint {str(checkpoint)!r} does not exist; give a run folder written by "
                                f"`train` or the checkpoint.pt inside it")
    if checkpoint.is_dir() and (checkpoint / "checkpoint.pt").is_dir():
        raise IsADirectoryError(f"--checkpoint {str(checkpoint)!r} holds a folder named checkpoint.pt, not the run's "
                                f"checkpoint file; give a run folder written by `train`")
    return load_translator(checkpoint, device)  # a file that is not a run's checkpoint: one line, from the library


def _train_settings(args: argparse.Namespace, device: torch.device) -> tuple[dict | None, str, dict]:
    """The --config overrides, the preset and the settings they make, checked before anything is written."""
    preset = args.preset or default_preset(device)
    if args.preset is None and device.type != "cuda":
        print(f"note: no GPU here ({device.type}), so the preset is {preset}, sized for a laptop CPU; name --preset "
              f"multi30k for the GPU's", file=sys.stderr)
    overrides = read_settings_file(args.config) if args.config else None
    return overrides, preset, resolve_settings(preset, overrides, source=f"--config {args.config}")


def _set_training_threads(threads: int | None) -> None:
    """torch's CPU threads for the training: --threads, else runtime.training_threads (and a note when the machine
    is busy, so that a reader knows why and how to choose)."""
    if threads is None:
        threads = training_threads()
        if threads == 1 and (os.cpu_count() or 1) > 1:
            print(f"note: training with 1 CPU thread: other work is running here (load average "
                  f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores), and torch's threads slow down beside it; "
                  f"--threads N to choose", file=sys.stderr)
    torch.set_num_threads(threads)


def cmd_train(args: argparse.Namespace) -> int:
    if args.resume:
        given = [f"--{name.replace('_', '-')}" for name in RESUME_FIXED if getattr(args, name) is not None]
        if given:
            raise UsageError(f"--resume continues the run in {args.out} with its saved settings, data and seed, so "
                             f"{', '.join(given)} would be ignored; drop {'them' if len(given) > 1 else 'it'}, or start "
                             f"a new run (another --out, or --overwrite)")
        overrides, preset = None, "multi30k"
    if launched_by_torchrun() and args.device is not None:
        raise UsageError("under torchrun each process trains on the GPU of its LOCAL_RANK, so --device would be "
                         "ignored; drop it")
    device = args.device or SingleProcess().device()  # (under torchrun: a GPU, when there is one)
    if not args.resume:
        overrides, preset, settings = _train_settings(args, device)
    if args.corpus_config is not None and (args.corpus or "multi30k") != "opus_books":
        raise UsageError(f"--corpus-config {args.corpus_config!r} names an opus_books pair, and "
                         f"{args.corpus or 'multi30k'} has no configs; drop it, or add --corpus opus_books")
    if args.resume:  # resume needs a checkpoint: say so before the lock creates the folder
        check_run_folder(args.out, args.resume, args.overwrite)
    # One training per folder: the main process (rank 0 under torchrun, which stops the others when it fails) locks
    # it before anything is read or written, so that a second `train`, even with --overwrite, stops at once.
    held = lock_run_folder(args.out) if launch_info().rank == 0 else nullcontext()
    with held:
        check_run_folder(args.out, args.resume, args.overwrite)
        if args.resume:
            read_run_record(args.out / "checkpoint.pt")  # a file train_translator wrote, or one line saying not
            steps_before = steps_trained(args.out / "checkpoint.pt")
        elif device.type == "cuda" and not launched_by_torchrun():
            check_fits_in_memory(settings, device, preset)  # one line now, not an out-of-memory traceback later
        if launched_by_torchrun():
            process = TorchrunProcess()
        else:  # None: train_translator's SingleProcess, on the best device there is
            process = SingleProcess(args.device)  # --device, or the best there is
        validation = _validation_arguments(args)
        if process.device().type == "cpu":
            _set_training_threads(args.threads)
        try:
            summary = train_translator(
                args.out, corpus=args.corpus or "multi30k", src_lang=args.src or "de", tgt_lang=args.tgt or "en",
                corpus_config=args.corpus_config, preset=preset, overrides=overrides, max_steps=args.max_steps,
                epochs=args.epochs, train_limit=args.train_limit, resume=args.resume, overwrite=args.overwrite,
                compile=args.compile, seed=0 if args.seed is None else args.seed, progress=not args.no_progress,
                process=process, on_record=_epoch_line if args.no_progress else None, **validation,
            )
        finally:
            if isinstance(process, TorchrunProcess):
                process.close()  # leave the process group, after the others are done
    if isinstance(process, TorchrunProcess) and not process.is_main:  # under torchrun, rank 0 speaks for all processes
        return 0
    last = last_loss(summary["history"])
    if args.resume and summary["steps"] == steps_before:  # train_translator said why: the run is finished
        print(f"nothing was trained or saved: the run in {args.out} stays as it was, {summary['steps']} steps; {last}")
        return 0
    where = summary["device"] if summary["processes"] == 1 else f"{summary['processes']} processes ({summary['device']})"
    print(f"trained {summary['steps']} steps on {where}; {last}; saved in {args.out}")
    return 0


def _epoch_line(record: dict) -> None:
    """With --no-progress, train_translator prints nothing: one line per epoch record still says how training goes."""
    if launch_info().rank == 0:  # under torchrun, rank 0 speaks for all processes
        print(epoch_line(record), flush=True)


def _validation_arguments(args: argparse.Namespace) -> dict:
    """train_translator's valid_limit and validate: --valid-limit (by default --train-limit's value), --no-validation."""
    if args.no_validation:
        return {"validate": False}
    valid_limit = args.valid_limit if args.valid_limit is not None else args.train_limit
    return {} if valid_limit is None else {"valid_limit": valid_limit}


def cmd_translate(args: argparse.Namespace) -> int:
    if args.sentences:
        check_argument_text(args.sentences)
        check_sentences(args.sentences, [f"sentence {number}" for number in range(1, len(args.sentences) + 1)])
        sentences = args.sentences
    else:
        sentences = stdin_sentences(sys.stdin.buffer.read())
    if not sentences:
        raise UsageError("no sentences: give them as arguments or one per line on standard input")
    model, tokenizer = _load(args.checkpoint, args.device)
    beam, alpha = _decoding(args)
    translations = translate_with_progress(model, tokenizer, sentences, beam_size=beam, alpha=alpha,
                                           max_len=args.max_len,
                                           progress=not args.no_progress and len(sentences) > BATCH_SIZE)
    warn_empty(translations)
    for line in translations:
        print(line)  # one line per sentence, empty ones included, so that lines still pair up
    return 0


def _decoding(args: argparse.Namespace) -> tuple[int, float]:
    """The beam size and alpha to decode with: --beam and --alpha, else the run's; a note on stderr says where from."""
    file = checkpoint_file(args.checkpoint)
    source, where, _ = decoding_source(file)
    beam = args.beam if args.beam is not None else source["beam_size"]
    alpha = args.alpha if args.alpha is not None else source["alpha"]
    if args.beam is None and args.alpha is None:
        print(f"note: decoding with beam {beam} and alpha {alpha:g}, from {where}, with "
              f"{weights_label(file, source['average_last'])}", file=sys.stderr)
    elif args.beam is None or args.alpha is None:
        print(f"note: decoding with beam {beam} ({'--beam' if args.beam is not None else f'from {where}'}) and alpha "
              f"{alpha:g} ({'--alpha' if args.alpha is not None else f'from {where}'})", file=sys.stderr)
    return beam, alpha


def _scoreboard_facts(args: argparse.Namespace, run: dict) -> dict:
    """What evaluate --scoreboard records besides the test scores, checked before any sentence is translated."""
    check_scoreboard_folder(args.scoreboard, "--scoreboard")
    checkpoint = checkpoint_file(args.checkpoint)
    decoding, where, record = decoding_source(checkpoint)
    if record is None:  # a preset's decoding was chosen on another run's validation, the defaults on none
        raise ValueError(f"--scoreboard records the decoding chosen on this run's validation split, and "
                         f"{checkpoint.parent} has no {DECODING_FILE} (it would decode with {where}); choose it "
                         f"first: python -m transformer_lib choose --checkpoint {checkpoint.parent}")
    return {**run_facts(checkpoint, run), "decoding": decoding, "validation": record.get("validation"),
            "weights": weights_label(checkpoint, decoding["average_last"])}


def cmd_choose(args: argparse.Namespace) -> int:
    """Decode the validation split for each (averaged weights, alpha); write the best, by BLEU, to decoding.json."""
    checkpoint = checkpoint_file(args.checkpoint)
    if not checkpoint.exists():
        _load(args.checkpoint)  # the one-line message for a missing checkpoint
    run = read_run_record(checkpoint)["run"]
    folder = checkpoint.parent
    final_only = args.average is not None and set(args.average) == {1}  # the final weights need no epoch file
    kept = 1 if final_only else len(kept_epochs(folder))  # every epoch the run should keep, or one line
    if any(n > max(kept, 1) for n in args.average or []):
        raise ValueError(f"--average {max(args.average)}: {folder} keeps the weights of {kept} epochs (training "
                         f"setting keep_checkpoints); give counts from 1 to {max(kept, 1)}")
    beam = args.beam if args.beam is not None else decoding_source(folder, run)[0]["beam_size"]
    with lock_run_folder(folder):  # no training changes these weights while they are chosen for (said before reading)
        print(f"choosing how {folder} decodes, on the validation split of {run['corpus']} {run['src_lang']}-"
              f"{run['tgt_lang']}, beam {beam}", flush=True)  # said before the split is read, which takes seconds
        pairs = split_pairs(run, "validation")
        used = pairs[: args.limit]  # all of them without --limit
        print(f"{'' if len(used) == len(pairs) else f'the first {len(used):,} of '}{len(pairs):,} sentences",
              flush=True)
        rows = sweep(folder, used, beam_size=beam, alphas=args.alpha, average_lasts=args.average, max_len=args.max_len,
                     device=args.device, progress=not args.no_progress, print_rows=True)
        best = best_decoding(rows)
        chosen = {key: best[key] for key in ("beam_size", "alpha", "average_last")}
        capped = {} if args.max_len is None else {"max_len": args.max_len}  # a cap on the translations, recorded
        path = write_decoding(folder, chosen, chosen_on="validation", validation={**best["scores"], **capped},
                              weights=best["weights"])
    print(f"chosen on the validation split: {best['weights']}, beam {beam}, alpha {best['alpha']}, BLEU "
          f"{best['scores']['bleu']:.2f}{f' (translations of at most {args.max_len} tokens)' * bool(capped)}; written "
          f"to {path} (translate and evaluate decode with it)")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    check_save_hyp(args.save_hyp, {"--src-file": args.src_file, "--ref-file": args.ref_file,
                                   "--hyp-file": args.hyp_file})
    if args.scoreboard is not None:
        if args.split != "test":
            raise UsageError("--scoreboard records a run's score on the test split, so it goes with --split test (the "
                             "decoding is chosen on the validation split beforehand, in decoding.json)")
        if args.beam is not None or args.alpha is not None or args.max_len is not None:
            raise UsageError("--scoreboard records the decoding chosen on the validation split (the run's "
                             "decoding.json), so --beam, --alpha and --max-len would not be what it records; drop "
                             "them")
    facts = None
    if args.hyp_file:
        if not args.ref_file or args.src_file or args.split or args.checkpoint:
            raise UsageError("--hyp-file goes with --ref-file alone")
        hypotheses, references = read_lines(args.hyp_file, "--hyp-file"), read_lines(args.ref_file, "--ref-file")
    else:
        if args.checkpoint is None:
            raise UsageError("give --checkpoint with --split or with --src-file/--ref-file, or --hyp-file with --ref-file")
        if bool(args.split) == bool(args.src_file):
            raise UsageError("give either --split or --src-file (with --ref-file), not both and not neither")
        if args.split and args.ref_file:
            raise UsageError("--split scores the corpus's own references, so --ref-file would be ignored; drop it, "
                             "or give --src-file with --ref-file instead of --split")
        if args.src_file and not args.ref_file:
            raise UsageError("--src-file needs --ref-file")
        if args.split:
            if not args.checkpoint.exists():
                _load(args.checkpoint)  # the one-line message for a missing checkpoint
            run = read_run_record(checkpoint_file(args.checkpoint))["run"]  # which corpus; one line if it lacks that
            if args.scoreboard is not None:
                facts = _scoreboard_facts(args, run)
            beam, alpha = _decoding(args)  # its note first: reading the model and the split takes seconds
            model, tokenizer = _load(args.checkpoint, args.device)
            sources, references = map(list, zip(*split_pairs(run, args.split)))
        else:
            sources, references = read_lines(args.src_file, "--src-file"), read_lines(args.ref_file, "--ref-file")
            check_sentences(sources, [f"--src-file {args.src_file}: line {n}" for n in range(1, len(sources) + 1)])
            if len(sources) != len(references):
                raise ValueError(f"{len(sources)} source lines but {len(references)} reference lines; the files "
                                 f"must pair up line by line")
            model, tokenizer = _load(args.checkpoint, args.device)
            beam, alpha = _decoding(args)
        hypotheses, scores = decode_and_score(model, tokenizer, sources, references, beam_size=beam, alpha=alpha,
                                              max_len=args.max_len, progress=not args.no_progress)
        warn_empty(hypotheses)
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references; the files must pair up "
                         f"line by line")
    if args.hyp_file:
        scores = score_translations(hypotheses, references)
    if args.save_hyp:
        atomic_write_text(args.save_hyp, "\n".join(hypotheses) + "\n")
    print(f"BLEU = {scores['bleu']:.2f}   ({scores['bleu_signature']})")
    print(f"chrF = {scores['chrf']:.2f}   ({scores['chrf_signature']})")
    print(f"on {scores['sentences']} sentences")
    if facts is not None:
        record = scoreboard_record(preset=run["preset"], device=facts["device"],
                                   training_minutes=facts["training_minutes"], steps=facts["steps"],
                                   validation=facts["validation"], test=scores, decoding=facts["decoding"],
                                   weights=facts["weights"], chosen_on="validation", notes=facts["notes"],
                                   precision=facts["precision"])
        replaced = replaced_record(record, args.scoreboard)
        print(f"scoreboard record written to {write_scoreboard(record, args.scoreboard)}{replaced}")
    return 0


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that report a user's mistake or their machine's limits, not a bug: shown as one line."""
    return (ValueError, OSError, DivergedError, getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError))


def main(argv: list[str] | None = None) -> int:
    """Run one command; a user's mistake is one line `error: ...` on stderr and exit code 1 (2 for usage)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except UsageError as error:
        args.parser.error(str(error))  # prints the usage line and the message, exits with 2
    except KeyboardInterrupt as error:
        if args.debug:
            raise
        resume = f"; continue with: python -m transformer_lib train --out {args.out} --resume" if (
            args.command == "train" and (args.out / "checkpoint.pt").is_file()) else ""
        print(f"interrupted{f' ({error})' if str(error) else ''}{resume}", file=sys.stderr)
        return 130
    except _user_errors() as error:
        if args.debug:
            raise
        message = str(error)
        if isinstance(error, OSError) and error.filename is not None and str(error.filename) not in message:
            message = f"{message}: {error.filename}"
        if type(error).__name__ == "OutOfMemoryError":
            message = f"out of GPU memory ({message.splitlines()[0]}); lower training.max_tokens or the model size"
        print(f"error: {message}", file=sys.stderr)
        return 1
    except Exception:
        traceback.print_exc()
        print("error: this is a bug in transformer_lib, not a mistake of yours; please report it with the traceback "
              "above", file=sys.stderr)
        return 1


if __name__ == "__main__":  # python -m transformer_lib.cli, as python -m transformer_lib
    sys.exit(main())
