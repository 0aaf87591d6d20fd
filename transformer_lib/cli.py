"""The command line: python -m transformer_lib train|translate|evaluate (hand-written; the book teaches the pieces)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EPILOG = """examples:
  python -m transformer_lib train --preset multi30k --out runs/de-en
  python -m transformer_lib train --preset tiny --max-steps 200 --train-limit 2000 --out runs/tiny
  python -m transformer_lib train --out runs/de-en --resume
  torchrun --standalone --nproc_per_node=2 -m transformer_lib train --preset tiny --max-steps 200 --out runs/ddp
  python -m transformer_lib translate --checkpoint runs/de-en "Ein Mann fährt Fahrrad."
  echo "Zwei Hunde spielen im Schnee." | python -m transformer_lib translate --checkpoint runs/de-en
  python -m transformer_lib evaluate --checkpoint runs/de-en --split test
  python -m transformer_lib evaluate --checkpoint runs/de-en --src-file test.de --ref-file test.en
  python -m transformer_lib evaluate --hyp-file output.en --ref-file test.en
"""


def _existing_file(value: str) -> Path:
    path = Path(value)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"file {value!r} does not exist")
    return path


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return number


def build_parser() -> argparse.ArgumentParser:
    from transformer_lib.translation import CORPORA, PRESETS, SPLITS

    parser = argparse.ArgumentParser(
        prog="python -m transformer_lib",
        description="Train, run and score the book's encoder-decoder Transformer.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="{train,translate,evaluate}")

    train = commands.add_parser("train", help="train a translator and save checkpoint.pt, tokenizer.json, history.json")
    train.add_argument("--preset", choices=sorted(PRESETS), default="multi30k", help="model and training sizes (default: %(default)s)")
    train.add_argument("--config", type=_existing_file, help='JSON file overriding the preset: {"model": {...}, "training": {...}}')
    train.add_argument("--corpus", choices=sorted(CORPORA), default="multi30k", help="default: %(default)s")
    train.add_argument("--corpus-config", help="opus_books language pair as the Hub names it, e.g. en-it")
    train.add_argument("--src", default="de", help="source language (default: %(default)s)")
    train.add_argument("--tgt", default="en", help="target language (default: %(default)s)")
    length = train.add_mutually_exclusive_group()
    length.add_argument("--max-steps", type=_positive, help="stop after this many optimizer steps")
    length.add_argument("--epochs", type=_positive, help="stop after this many passes over the data")
    train.add_argument("--train-limit", type=_positive, help="use only the first N training pairs (quick runs)")
    train.add_argument("--out", type=Path, required=True, help="run folder for checkpoint, tokenizer and history")
    train.add_argument("--resume", action="store_true", help="continue the run saved in --out")
    train.add_argument("--compile", action="store_true", help="compile the model with torch.compile")
    train.add_argument("--seed", type=int, default=0, help="default: %(default)s")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")

    translate = commands.add_parser("translate", help="translate sentences given as arguments or on standard input")
    translate.add_argument("--checkpoint", type=Path, required=True, help="checkpoint.pt or the run folder holding it")
    translate.add_argument("--beam", type=_positive, default=4, help="beam size; 1 is greedy search (default: %(default)s)")
    translate.add_argument("sentences", nargs="*", help="sentences to translate (default: one per line from stdin)")

    evaluate = commands.add_parser("evaluate", help="corpus BLEU and chrF with sacreBLEU")
    evaluate.add_argument("--checkpoint", type=Path, help="checkpoint.pt or the run folder holding it")
    evaluate.add_argument("--split", choices=SPLITS, help="score the checkpoint's own corpus split")
    evaluate.add_argument("--src-file", type=_existing_file, help="source sentences, one per line")
    evaluate.add_argument("--hyp-file", type=_existing_file, help="translations already made, one per line")
    evaluate.add_argument("--ref-file", type=_existing_file, help="reference translations, one per line")
    evaluate.add_argument("--beam", type=_positive, default=4, help="beam size (default: %(default)s)")
    evaluate.add_argument("--save-hyp", type=Path, help="write the translations to this file")
    return parser


def _read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").rstrip("\n").split("\n")


def _load(checkpoint: Path):
    from transformer_lib.translation import load_translator

    if not checkpoint.exists():
        raise SystemExit(f"error: --checkpoint {str(checkpoint)!r} does not exist")
    return load_translator(checkpoint)


def cmd_train(args: argparse.Namespace) -> int:
    from transformer_lib.distributed import is_main_process
    from transformer_lib.translation import train_translator

    overrides = json.loads(args.config.read_text(encoding="utf-8")) if args.config else None
    if args.resume and not (args.out / "checkpoint.pt").is_file():
        raise SystemExit(f"error: --resume needs {args.out / 'checkpoint.pt'}, which does not exist")
    summary = train_translator(
        args.out, corpus=args.corpus, src_lang=args.src, tgt_lang=args.tgt, corpus_config=args.corpus_config,
        preset=args.preset, overrides=overrides, max_steps=args.max_steps, epochs=args.epochs,
        train_limit=args.train_limit, resume=args.resume, compile=args.compile, seed=args.seed,
        progress=not args.no_progress,
    )
    if not is_main_process():  # under torchrun, rank 0 speaks for all processes
        return 0
    last = summary["history"][-1][1] if summary["history"] else float("nan")
    where = summary["device"] if summary["processes"] == 1 else f"{summary['processes']} processes ({summary['device']})"
    print(f"trained {summary['steps']} steps on {where}; last logged loss {last:.3f}; saved in {args.out}")
    return 0


def cmd_translate(args: argparse.Namespace) -> int:
    from transformer_lib.translation import translate

    sentences = args.sentences or [line.strip() for line in sys.stdin if line.strip()]
    if not sentences:
        raise SystemExit("error: no sentences: give them as arguments or one per line on standard input")
    model, tokenizer = _load(args.checkpoint)
    for line in translate(model, tokenizer, sentences, beam_size=args.beam):
        print(line)
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from transformer_lib.translation import corpus_scores, load_pairs, translate
    from transformer_lib.training import load_checkpoint

    if args.hyp_file:
        if not args.ref_file or args.src_file or args.split or args.checkpoint:
            raise SystemExit("error: --hyp-file goes with --ref-file alone")
        hypotheses, references = _read_lines(args.hyp_file), _read_lines(args.ref_file)
    else:
        if args.checkpoint is None:
            raise SystemExit("error: give --checkpoint with --split or with --src-file/--ref-file, or --hyp-file with --ref-file")
        if bool(args.split) == bool(args.src_file):
            raise SystemExit("error: give either --split or --src-file (with --ref-file), not both and not neither")
        if args.src_file and not args.ref_file:
            raise SystemExit("error: --src-file needs --ref-file")
        model, tokenizer = _load(args.checkpoint)
        if args.split:
            path = args.checkpoint / "checkpoint.pt" if args.checkpoint.is_dir() else args.checkpoint
            run = load_checkpoint(path)["extra"]["run"]
            pairs = load_pairs(run["corpus"], args.split, run["src_lang"], run["tgt_lang"], run["corpus_config"])
            sources, references = [s for s, _ in pairs], [t for _, t in pairs]
        else:
            sources, references = _read_lines(args.src_file), _read_lines(args.ref_file)
        if len(sources) != len(references):
            raise SystemExit(f"error: {len(sources)} source lines but {len(references)} reference lines")
        hypotheses = translate(model, tokenizer, sources, beam_size=args.beam)
    if args.save_hyp:
        args.save_hyp.write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
    try:
        scores = corpus_scores(hypotheses, references)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    print(f"BLEU = {scores['bleu']:.2f}   ({scores['bleu_signature']})")
    print(f"chrF = {scores['chrf']:.2f}   ({scores['chrf_signature']})")
    print(f"on {scores['sentences']} sentences")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return {"train": cmd_train, "translate": cmd_translate, "evaluate": cmd_evaluate}[args.command](args)
