"""The named check of chapter 6's coding exercise (book/06_encoder_decoder.ipynb): the parameter count of a
configuration."""

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from transformer_lib.model import Transformer, TransformerConfig, count_parameters

from .engine import ExerciseGradeError, _generator, _name_of, _randint, _refuse_calls, _run


def _parameter_formula(cfg: Any, final_norms: bool = True, tie: bool = True, share: bool = True,
                       position_tables: int = 2, attention_bias: bool = True, norm_terms: int = 2) -> Tensor:
    """count_parameters(Transformer(cfg)) by formula, with optional mistakes to recognise them; a 0-d int64 tensor."""
    d, d_ff, n = cfg.d_model, cfg.d_ff, cfg.n_layers
    attention = 4 * d * d + (4 * d if attention_bias else 0)  # W^Q, W^K, W^V, W^O (and their biases)
    feed_forward = 2 * d * d_ff + d_ff + d
    layer_norm = norm_terms * d  # a gain and a bias
    stacks = n * ((attention + feed_forward + 2 * layer_norm) + (2 * attention + feed_forward + 3 * layer_norm))
    stacks += 2 * layer_norm if cfg.norm_first and final_norms else 0  # one final LayerNorm per pre-norm stack
    src_embed = cfg.src_vocab_size * d
    tgt_embed = 0 if cfg.share_embeddings and share else cfg.tgt_vocab_size * d
    generator = 0 if cfg.tie_embeddings and tie else cfg.tgt_vocab_size * d
    positions = position_tables * cfg.max_len * d if cfg.positional == "learned" else 0
    return torch.tensor(stacks + src_embed + tgt_embed + generator + positions)


def grade_parameter_count(fn: Callable[[Any], int], seed: int | None = None) -> None:
    """Check fn(cfg) -> count_parameters(Transformer(cfg)), computed without building the model, on random configs."""
    g, seed = _generator(seed)

    def reference(cfg: TransformerConfig) -> Tensor:
        with torch.random.fork_rng(devices=[]):  # building the model draws its initial weights
            return torch.tensor(count_parameters(Transformer(cfg)))

    def config(**switches: Any) -> TransformerConfig:
        heads = _randint(1, 4, g)
        vocab = _randint(5, 60, g)
        sizes = dict(src_vocab_size=vocab, tgt_vocab_size=vocab if switches.get("share_embeddings") else
                     _randint(5, 60, g), d_model=2 * heads * _randint(1, 4, g), n_heads=heads,
                     n_layers=_randint(1, 3, g), d_ff=_randint(1, 40, g), max_len=_randint(4, 40, g))
        return TransformerConfig(**{**sizes, **switches})

    cases = [
        ("the paper's choices: post-norm, sinusoidal positions, tied generator", config()),
        ("pre-norm", config(norm_first=True)),
        ("learned positions", config(positional="learned")),
        ("the generator not tied", config(tie_embeddings=False)),
        ("one embedding shared by source and target", config(share_embeddings=True)),
        ("everything at once", config(norm_first=True, positional="learned", share_embeddings=True)),
        ("a single layer, pre-norm, untied", config(n_layers=1, norm_first=True, tie_embeddings=False)),
    ]
    cases = [(note, {"cfg": cfg}) for note, cfg in cases]
    hints = {
        "the final LayerNorm of each pre-norm stack is missing: with norm_first=True the encoder and the decoder each "
        "end with one more LayerNorm (2 * d_model numbers)":
            lambda cfg: _parameter_formula(cfg, final_norms=False),
        "the tied generator is counted as a matrix of its own; with tie_embeddings=True it is the target embedding":
            lambda cfg: _parameter_formula(cfg, tie=False),
        "the shared embedding is counted twice; with share_embeddings=True source and target use one matrix":
            lambda cfg: _parameter_formula(cfg, share=False),
        "the learned positional tables are missing: with positional='learned' each side has a (max_len, d_model) table":
            lambda cfg: _parameter_formula(cfg, position_tables=0),
        "only one learned positional table is counted; the source and the target each have their own":
            lambda cfg: _parameter_formula(cfg, position_tables=1),
        "the biases of the attention projections are missing: each of W^Q, W^K, W^V and W^O has d_model of them":
            lambda cfg: _parameter_formula(cfg, attention_bias=False),
        "each LayerNorm is counted with d_model numbers; it has a gain and a bias, 2 * d_model":
            lambda cfg: _parameter_formula(cfg, norm_terms=1),
    }

    def as_tensor(cfg: TransformerConfig) -> Any:
        count = fn(cfg=cfg)
        if isinstance(count, float):
            raise ExerciseGradeError(f"return the count as an int, got the float {count!r}")
        if isinstance(count, bool) or not isinstance(count, int):  # a tensor is compared as it is
            return count
        return torch.tensor(count)  # a 0-d int64 tensor, compared exactly

    def refusal(label: str, built: type | None) -> str:
        what = "the model, Transformer(cfg)," if label == "model" else f"a module, {getattr(built, '__name__', '?')},"
        return (f"your function built {what} to count parameters; the exercise is to compute the count from cfg "
                f"alone, without building the model: add up the pieces of the chapter's table.")

    # The exercise's own rule, "without building the model": building the model (or any piece of it) and counting
    # its parameters would pass every value check below.
    _refuse_calls(fn, [case for _, case in cases], {Transformer.__init__: "model", nn.Module.__init__: "module"},
                  refusal, "grade_parameter_count", seed)
    as_tensor.__name__ = _name_of(fn)
    _run("grade_parameter_count", as_tensor, reference, cases, seed, atol=0, rtol=0, hints=hints)
