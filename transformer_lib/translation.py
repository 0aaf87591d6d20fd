import json
import os
import random
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor
from tokenizers import Tokenizer

from transformer_lib.embedding import BOS_ID, EOS_ID, PAD_ID, pad_batch, train_bpe_tokenizer
from transformer_lib.masks import padding_mask
from transformer_lib.model import Transformer, TransformerConfig
from transformer_lib.positional import check_length
from transformer_lib.runtime import get_device
from transformer_lib.training import (
    autocast_dtype,
    load_checkpoint,
    make_optimizer,
    model_from_checkpoint,
    resume_training,
    train,
)

DATA_ENV = "TRANSFORMER_LIB_DATA"
CORPORA = {
    # name: (Hugging Face dataset id, its layout)
    "multi30k": ("bentrevett/multi30k", "columns"),  # columns "en" and "de"; splits train/validation/test
    "opus_books": ("Helsinki-NLP/opus_books", "translation"),  # column "translation"; one "train" split
}
SPLITS = ("train", "validation", "test")


def _rows_to_pairs(rows, layout: str, src_lang: str, tgt_lang: str) -> list[tuple[str, str]]:
    """Read (source, target) sentence pairs out of a datasets.Dataset in either corpus layout."""
    if layout == "translation":
        rows = rows["translation"]
        return [(row[src_lang], row[tgt_lang]) for row in rows]
    for lang in (src_lang, tgt_lang):
        if lang not in rows.column_names:
            raise ValueError(f"language {lang!r} is not a column of this corpus; expected one of {rows.column_names}")
    return list(zip(rows[src_lang], rows[tgt_lang]))


def _split_single(pairs: list, split: str, seed: int = 0, held_out: int = 1000) -> list:
    """opus_books has only a train split: carve fixed validation and test sets out of it, the same on every machine."""
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    cut = {"test": order[:held_out], "validation": order[held_out : 2 * held_out], "train": order[2 * held_out :]}
    return [pairs[i] for i in sorted(cut[split])]


def load_pairs(
    corpus: str = "multi30k", split: str = "train", src_lang: str = "de", tgt_lang: str = "en", config: str | None = None
) -> list[tuple[str, str]]:
    """Sentence pairs (source, target) of a translation corpus, through Hugging Face datasets.

    multi30k reads $TRANSFORMER_LIB_DATA/multi30k/{split}.jsonl when that variable names such a folder, else the Hub.
    opus_books needs config, the language pair as the Hub names it (e.g. "en-it").
    """
    import datasets

    if corpus not in CORPORA:
        raise ValueError(f"corpus must be one of {sorted(CORPORA)}, got {corpus!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if src_lang == tgt_lang:
        raise ValueError(f"src_lang and tgt_lang must differ, got {src_lang!r} twice")
    hub_id, layout = CORPORA[corpus]
    local = os.environ.get(DATA_ENV)
    if corpus == "multi30k" and local:
        path = Path(local) / "multi30k" / f"{split}.jsonl"
        if not path.is_file():
            raise FileNotFoundError(f"{DATA_ENV}={local!r} but {path} does not exist; expected multi30k/{split}.jsonl there")
        rows = datasets.load_dataset("json", data_files={split: str(path)}, split=split)
        return _rows_to_pairs(rows, layout, src_lang, tgt_lang)
    if corpus == "opus_books" and config is None:
        raise ValueError(f"opus_books needs config, the language pair as the Hub names it, e.g. '{src_lang}-{tgt_lang}'")
    try:
        if corpus == "opus_books":
            rows = datasets.load_dataset(hub_id, config, split="train")
            return _split_single(_rows_to_pairs(rows, layout, src_lang, tgt_lang), split)
        rows = datasets.load_dataset(hub_id, split=split)
    except (ConnectionError, OSError) as error:
        raise RuntimeError(
            f"could not load {hub_id!r} from the Hugging Face Hub ({type(error).__name__}: {error}). Either connect "
            f"to the internet so that datasets can download it, or set {DATA_ENV} to a folder holding "
            f"multi30k/{{train,validation,test}}.jsonl (one JSON object with 'en' and 'de' per line)."
        ) from error
    return _rows_to_pairs(rows, layout, src_lang, tgt_lang)


def encode_pairs(
    pairs: Sequence[tuple[str, str]], tokenizer: Tokenizer, max_len: int
) -> tuple[list[tuple[list[int], list[int]]], int]:
    """Token ids <bos> ... <eos> for each pair; pairs with a side longer than max_len are set aside and counted."""
    sources = tokenizer.encode_batch([src for src, _ in pairs])
    targets = tokenizer.encode_batch([tgt for _, tgt in pairs])
    kept, too_long = [], 0
    for src, tgt in zip(sources, targets):
        if len(src.ids) > max_len or len(tgt.ids) > max_len:
            too_long += 1
        else:
            kept.append((src.ids, tgt.ids))
    return kept, too_long


def token_budget_batches(
    encoded: Sequence[tuple[list[int], list[int]]], max_tokens: int, seed: int | None = None
) -> list[tuple[Tensor, Tensor]]:
    """Group pairs of similar length into padded batches of at most max_tokens (padded) tokens on either side.

    Every pair lands in exactly one batch. With a seed, lengths are sorted within shuffled chunks and the batch order
    is shuffled, so each epoch sees new batches; without one, the order is by length (for evaluation).
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive integer, got {max_tokens}")
    order = list(range(len(encoded)))
    if seed is not None:
        rng = random.Random(seed)
        rng.shuffle(order)
        chunk = 100 * max(1, max_tokens // 32)  # sort within chunks: similar lengths, yet a different mix each epoch
        order = [i for start in range(0, len(order), chunk) for i in sorted(order[start : start + chunk], key=lambda i: len(encoded[i][0]))]
    else:
        order.sort(key=lambda i: (len(encoded[i][0]), len(encoded[i][1])))
    groups, current, longest = [], [], 0
    for i in order:
        length = max(len(encoded[i][0]), len(encoded[i][1]))
        if length > max_tokens:
            raise ValueError(f"pair {i} has {length} tokens, more than max_tokens={max_tokens}; raise max_tokens")
        if current and max(longest, length) * (len(current) + 1) > max_tokens:
            groups.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, length)
    if current:
        groups.append(current)
    if seed is not None:
        rng.shuffle(groups)
    return [
        (pad_batch([encoded[i][0] for i in group], PAD_ID), pad_batch([encoded[i][1] for i in group], PAD_ID))
        for group in groups
    ]


def length_penalty(length: Tensor, alpha: float) -> Tensor:
    """GNMT's length penalty ((5 + length) / 6) ** alpha (Wu et al., 2016); alpha = 0 turns it off."""
    return ((5.0 + length.float()) / 6.0) ** alpha


@torch.no_grad()
def beam_search(
    model: Transformer,
    src: Tensor,
    beam_size: int = 4,
    max_len: int | None = None,
    alpha: float = 0.6,
    use_cache: bool = True,
) -> Tensor:
    """Batched beam search; returns the best hypothesis per sentence, (B, <= max_len) ids after <bos>, padded."""
    if beam_size < 1:
        raise ValueError(f"beam_size must be a positive integer, got {beam_size}")
    model.eval()
    batch, k = src.size(0), beam_size
    max_len = max_len or min(model.cfg.max_len - 1, src.size(1) + 50)
    src_mask = padding_mask(src, model.cfg.pad_id)  # (B, 1, 1, S)
    memory = model.encode(src, src_mask)  # (B, S, d_model)
    memory, src_mask = memory.repeat_interleave(k, 0), src_mask.repeat_interleave(k, 0)  # (B*k, S, d_model)
    tokens = torch.full((batch * k, 1), BOS_ID, dtype=torch.long, device=src.device)  # (B*k, 1)
    scores = torch.zeros(batch, k, device=src.device)  # summed log-probabilities, (B, k)
    scores[:, 1:] = float("-inf")  # all beams start identical: keep only the first alive
    lengths = torch.zeros(batch * k, dtype=torch.long, device=src.device)  # tokens after <bos>, <eos> included
    finished = torch.zeros(batch * k, dtype=torch.bool, device=src.device)
    cache = model.init_cache() if use_cache else None
    for _ in range(max_len):
        step_input = tokens[:, -1:] if use_cache else tokens  # (B*k, 1) or (B*k, t)
        logits = model.decode(step_input, memory, src_mask, cache=cache)[:, -1]  # (B*k, V)
        log_probs = torch.log_softmax(logits.float(), dim=-1)  # (B*k, V)
        log_probs[finished] = float("-inf")  # a finished hypothesis only extends with <pad>, at no cost
        log_probs[finished, PAD_ID] = 0.0
        vocab = log_probs.size(-1)
        candidates = scores.view(-1, 1) + log_probs  # (B*k, V)
        new_lengths = lengths + (~finished).long()  # (B*k,)
        ranked = candidates / length_penalty(new_lengths, alpha)[:, None]  # compare hypotheses of unequal length
        _, best = ranked.view(batch, k * vocab).topk(k, dim=1)  # (B, k)
        beam, token = best // vocab, best % vocab  # (B, k) each
        chosen = (torch.arange(batch, device=src.device)[:, None] * k + beam).view(-1)  # (B*k,) rows to keep
        scores = candidates.view(batch, k * vocab).gather(1, best)  # (B, k)
        tokens = torch.cat([tokens[chosen], token.view(-1, 1)], dim=1)  # (B*k, t + 1)
        lengths = new_lengths[chosen]
        finished = finished[chosen] | (token.view(-1) == EOS_ID)
        if cache is not None:
            model.reorder_cache(cache, chosen)
        if finished.all():
            break
    final = (scores.view(-1) / length_penalty(lengths, alpha)).view(batch, k)  # (B, k)
    best_beam = final.argmax(dim=1)  # (B,)
    return tokens.view(batch, k, -1)[torch.arange(batch), best_beam, 1:]  # (B, t)


def ids_to_text(ids: Tensor, tokenizer: Tokenizer) -> list[str]:
    """Decode rows of generated ids, stopping at <eos> and skipping special tokens."""
    texts = []
    for row in ids.tolist():
        if EOS_ID in row:
            row = row[: row.index(EOS_ID)]
        texts.append(tokenizer.decode(row, skip_special_tokens=True))
    return texts


def translate(
    model: Transformer, tokenizer: Tokenizer, sentences: Sequence[str], beam_size: int = 4, batch_size: int = 64
) -> list[str]:
    """Translate sentences (beam_size=1 is greedy search), in batches of similar length, returned in input order."""
    device = next(model.parameters()).device
    encoded = [enc.ids for enc in tokenizer.encode_batch(list(sentences))]
    for index, ids in enumerate(encoded):
        check_length(len(ids), model.cfg.max_len, name=f"sentence {index} ({len(ids)} tokens)")
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    results: list[str] = [""] * len(encoded)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        src = pad_batch([encoded[i] for i in chunk], PAD_ID).to(device)  # (b, S)
        out = beam_search(model, src, beam_size=beam_size)  # (b, t)
        for i, text in zip(chunk, ids_to_text(out, tokenizer)):
            results[i] = text
    return results


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str], min_sentences: int = 100) -> dict:
    """Corpus BLEU and chrF with sacreBLEU on detokenized text, with their signatures."""
    import sacrebleu

    if len(hypotheses) != len(references):
        raise ValueError(f"got {len(hypotheses)} hypotheses but {len(references)} references; expected one each")
    if len(hypotheses) < min_sentences:
        raise ValueError(
            f"BLEU on {len(hypotheses)} sentences is noise; expected at least min_sentences={min_sentences} "
            f"(score a whole test set)"
        )
    bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(list(hypotheses), [list(references)])
    chrf_score = chrf.corpus_score(list(hypotheses), [list(references)])
    return {
        "bleu": bleu_score.score,
        "chrf": chrf_score.score,
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "sentences": len(hypotheses),
    }


PRESETS: dict[str, dict] = {
    # Model sizes (TransformerConfig fields) and training settings, by name.
    "multi30k": {
        "model": dict(d_model=256, n_heads=8, n_layers=3, d_ff=1024, dropout=0.1, max_len=128),
        "training": dict(vocab_size=8000, max_tokens=4096, warmup=1000, lr_factor=1.0, epochs=20, label_smoothing=0.1),
    },
    "base": {  # the paper's base model (Table 3)
        "model": dict(d_model=512, n_heads=8, n_layers=6, d_ff=2048, dropout=0.1, max_len=256),
        "training": dict(vocab_size=37000, max_tokens=25000, warmup=4000, lr_factor=1.0, epochs=20, label_smoothing=0.1),
    },
    "tiny": {  # a few minutes on a laptop CPU; for smoke tests and CI
        "model": dict(d_model=64, n_heads=4, n_layers=2, d_ff=256, dropout=0.1, max_len=128),
        "training": dict(vocab_size=1000, max_tokens=1024, warmup=200, lr_factor=0.4, epochs=1, label_smoothing=0.1),
    },
}


def resolve_settings(preset: str = "multi30k", overrides: dict | None = None) -> dict:
    """A preset's model and training settings, with overrides ({"model": {...}, "training": {...}}) applied."""
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
    settings = {part: dict(values) for part, values in PRESETS[preset].items()}
    for part, values in (overrides or {}).items():
        if part not in settings:
            raise ValueError(f"settings have parts 'model' and 'training', got {part!r}")
        settings[part].update(values)
    return settings


def train_translator(
    out_dir: str | Path,
    corpus: str = "multi30k",
    src_lang: str = "de",
    tgt_lang: str = "en",
    corpus_config: str | None = None,
    preset: str = "multi30k",
    overrides: dict | None = None,
    max_steps: int | None = None,
    epochs: int | None = None,
    train_limit: int | None = None,
    resume: bool = False,
    compile: bool = False,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """Train a translator end to end and write checkpoint.pt, tokenizer.json and history.json into out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint_path = out / "checkpoint.pt"
    device = get_device()
    checkpoint = load_checkpoint(checkpoint_path, device) if resume else None
    if checkpoint is not None:
        run = checkpoint["extra"]["run"]
        tokenizer = Tokenizer.from_str(checkpoint["extra"]["tokenizer"])
    else:
        run = dict(corpus=corpus, src_lang=src_lang, tgt_lang=tgt_lang, corpus_config=corpus_config, seed=seed,
                   train_limit=train_limit, settings=resolve_settings(preset, overrides))
    settings = run["settings"]
    training = settings["training"]
    pairs = load_pairs(run["corpus"], "train", run["src_lang"], run["tgt_lang"], run["corpus_config"])
    if run["train_limit"] is not None:
        pairs = pairs[: run["train_limit"]]
    if checkpoint is None:
        tokenizer = train_bpe_tokenizer([text for pair in pairs for text in pair], training["vocab_size"])
    tokenizer.save(str(out / "tokenizer.json"))
    max_len = settings["model"]["max_len"]
    encoded, too_long = encode_pairs(pairs, tokenizer, max_len)
    print(f"{len(encoded):,} training pairs; {too_long} set aside because a side is longer than max_len={max_len}")
    epoch_batches: dict[int, list] = {}

    def batches_for_epoch(epoch: int) -> list:
        if epoch not in epoch_batches:
            epoch_batches.clear()
            epoch_batches[epoch] = token_budget_batches(encoded, training["max_tokens"], seed=run["seed"] * 100_003 + epoch)
        return epoch_batches[epoch]

    if max_steps is None:
        max_steps = (epochs or training["epochs"]) * len(batches_for_epoch(0))
    torch.manual_seed(run["seed"])
    cfg = TransformerConfig(
        src_vocab_size=tokenizer.get_vocab_size(), tgt_vocab_size=tokenizer.get_vocab_size(), pad_id=PAD_ID,
        share_embeddings=True, tie_embeddings=True, **settings["model"],
    )
    model = Transformer(cfg).to(device)
    optimizer, scheduler = make_optimizer(model, cfg.d_model, training["warmup"], training["lr_factor"])
    scaler = torch.amp.GradScaler("cuda") if autocast_dtype(device) == torch.float16 else None
    state = resume_training(checkpoint, model, optimizer, scheduler, scaler) if checkpoint is not None else None
    if compile:
        model.compile()
    extra = {"run": run, "tokenizer": tokenizer.to_str()}
    state = train(model, batches_for_epoch, optimizer, scheduler, max_steps, state=state,
                  label_smoothing=training["label_smoothing"], scaler=scaler, checkpoint_path=checkpoint_path,
                  checkpoint_every=500, checkpoint_extra=extra, progress=progress)
    (out / "history.json").write_text(json.dumps(state.history))
    return {"steps": state.step, "epochs": state.epoch, "too_long": too_long, "pairs": len(encoded),
            "device": str(device), "history": state.history}


def load_translator(path: str | Path, device: torch.device | str | None = None) -> tuple[Transformer, Tokenizer]:
    """The model (in evaluation mode) and tokenizer of a checkpoint file, or of a run folder holding checkpoint.pt."""
    path = Path(path)
    if path.is_dir():
        path = path / "checkpoint.pt"
    device = device or get_device()
    checkpoint = load_checkpoint(path, device)
    return model_from_checkpoint(checkpoint, device), Tokenizer.from_str(checkpoint["extra"]["tokenizer"])
