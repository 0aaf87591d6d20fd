"""Decoding (transformer_lib.decoding): greedy search and the mode it leaves the model in, the key/value cache and
decode_step against the full recomputation, beam search against greedy search and with the model's own special ids,
and the caches, memories and sources they refuse."""

import pytest
import torch

import transformer_lib as tl
from transformer_lib import decoding
from transformer_lib.decoding import greedy_decode

from copy_task import CFG, fresh
from test_translation import small_model


# Every model option that changes a decoder layer (chapters 6 and 10): the cache must hold for each
MODEL_OPTIONS = {"post-norm": {}, "pre-norm": {"norm_first": True}, "rms-norm": {"norm_first": True, "norm": "rms"},
                 "post-rms-norm": {"norm": "rms"}, "swiglu": {"ffn": "swiglu"},
                 "rotary": {"positional": "rotary"}, "grouped-query": {"n_kv_heads": 2},
                 "multi-query": {"n_kv_heads": 1},
                 "all": {"norm_first": True, "norm": "rms", "ffn": "swiglu", "positional": "rotary", "n_kv_heads": 2}}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("options", list(MODEL_OPTIONS))
def test_cached_and_uncached_decoding_agree(options, device):
    # On CUDA too the products are float32 (TF32, 10 mantissa bits, is off by PyTorch's default), so the cache
    # changes only the order of the sums, and the tolerance below holds there as well.
    assert torch.get_float32_matmul_precision() == "highest", "this comparison needs float32 matrix products"
    torch.manual_seed(0)
    model = tl.Transformer(tl.TransformerConfig(**CFG, dropout=0.0, **MODEL_OPTIONS[options])).to(device).eval()
    src = torch.randint(4, 20, (5, 9)).to(device)
    src[1, 6:] = 0
    tgt = torch.randint(4, 20, (5, 7)).to(device)
    src_mask = tl.padding_mask(src, 0)
    memory = model.encode(src, src_mask)
    full = model.decode(tgt, memory, src_mask)
    cache = tl.KVCache(len(model.decoder.layers))
    steps = torch.cat([tl.decode_step(model, tgt[:, t : t + 1], memory, src_mask, cache) for t in range(7)], dim=1)
    # One position at a time against all at once: the same sums in another order (see test_model's padding test
    # for the estimate, some 1e-5 at the very worst). Seen: 6% of the former tolerance 1e-5 (1 and 2 threads, AMD
    # EPYC), a margin of 16, thin for another CPU; 1e-4 leaves one of over 150.
    torch.testing.assert_close(steps, full, atol=1e-4, rtol=1e-4)
    cached = tl.beam_search(model, src, 1, 12, use_cache=True)  # greedy search with the cache ...
    uncached = tl.beam_search(model, src, 1, 12, use_cache=False)  # ... and without it
    assert torch.equal(cached, uncached)
    assert torch.equal(cached, greedy_decode(model, src, 12, tl.BOS_ID, tl.EOS_ID)[:, : cached.size(1)])


def test_greedy_decoding_runs_in_eval_mode_and_leaves_the_mode_as_it_found_it():
    model, *_ = fresh()
    model.train()
    src = torch.randint(4, 20, (2, 5))
    first = greedy_decode(model, src, 8, tl.BOS_ID, tl.EOS_ID)
    assert model.training  # a call in the middle of training must not switch dropout off for the steps after it
    assert torch.equal(first, greedy_decode(model, src, 8, tl.BOS_ID, tl.EOS_ID))  # no dropout noise
    model.eval()
    greedy_decode(model, src, 8, tl.BOS_ID, tl.EOS_ID)
    assert not model.training


def test_beam_size_one_equals_greedy_and_cache_changes_nothing():
    model = small_model()
    src = torch.randint(4, 30, (6, 9))
    src[2, 5:] = tl.PAD_ID
    greedy = greedy_decode(model, src, 15, tl.BOS_ID, tl.EOS_ID)
    beam1 = decoding.beam_search(model, src, beam_size=1, max_len=15)
    assert torch.equal(beam1, greedy[:, : beam1.size(1)])
    for k in (2, 4):
        assert torch.equal(decoding.beam_search(model, src, k, 15), decoding.beam_search(model, src, k, 15, use_cache=False))


def test_beam_search_uses_the_models_special_ids_not_the_defaults():
    """A model whose <pad>, <bos> and <eos> are not ids 0, 2, 3: beam 1 must still be greedy search, exactly."""
    torch.manual_seed(0)
    pad, bos, eos = 7, 5, 6
    model = tl.Transformer(tl.TransformerConfig(src_vocab_size=24, tgt_vocab_size=24, d_model=32, n_heads=4,
                                                n_layers=2, d_ff=64, dropout=0.1, max_len=48, pad_id=pad))
    src = torch.randint(8, 24, (4, 9))
    src[1, 6:] = pad  # one padded sentence
    greedy = greedy_decode(model, src, 20, bos, eos)
    for k in (1, 3):
        model.train()
        out = decoding.beam_search(model, src, beam_size=k, max_len=20, bos_id=bos, eos_id=eos)
        assert model.training, "beam_search must leave the model in the mode it found it"
        if k == 1:
            assert torch.equal(out, greedy)
        for row in out.tolist():  # after <eos> only the model's <pad>, never the default PAD_ID
            if eos in row:
                assert set(row[row.index(eos) + 1:]) <= {pad}
    with torch.no_grad():  # the special ids change the result: the defaults would start from another token
        assert not torch.equal(decoding.beam_search(model, src, beam_size=1, max_len=20), greedy)


def test_beam_search_finds_a_sequence_at_least_as_likely_as_greedy():
    model = small_model()
    src = torch.randint(4, 30, (8, 7))

    def log_prob(out):
        tgt = torch.cat([torch.full((out.size(0), 1), tl.BOS_ID), out], dim=1)
        logits = model(src, tgt[:, :-1]).log_softmax(-1)
        token_lp = logits.gather(-1, tgt[:, 1:, None])[..., 0]
        return token_lp.masked_fill(tgt[:, 1:] == tl.PAD_ID, 0).sum(-1)

    greedy = decoding.beam_search(model, src, 1, 12, alpha=0.0)
    beam = decoding.beam_search(model, src, 5, 12, alpha=0.0)
    assert (log_prob(beam) >= log_prob(greedy) - 1e-4).all()


def test_decode_step_refuses_a_cache_or_memory_that_does_not_fit():
    torch.manual_seed(0)
    model = tl.Transformer(tl.TransformerConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=16, n_heads=2,
                                                n_layers=2, d_ff=32, dropout=0.0)).eval()
    src = torch.randint(4, 20, (3, 5))
    src_mask = tl.padding_mask(src, 0)
    memory = model.encode(src, src_mask)
    bos = torch.full((3, 1), tl.BOS_ID)
    with pytest.raises(ValueError, match=r"cache holds 3 layers but the decoder has 2; expected KVCache\(len"):
        tl.decode_step(model, bos, memory, src_mask, tl.KVCache(3))
    with pytest.raises(ValueError, match=r"same batch size, got shapes \(2, 1\) and \(3, 5, 16\)"):
        tl.decode_step(model, bos[:2], memory, src_mask, tl.KVCache(2))
    cache = tl.KVCache(2)
    assert tl.decode_step(model, bos, memory, src_mask, cache).shape == (3, 1, 20) and cache.length == 1


def test_beam_search_refuses_a_source_row_of_padding_only():
    model = small_model()
    src = torch.tensor([[5, 6, 7], [0, 0, 0]])
    with pytest.raises(ValueError, match=r"src row 1 is all padding \(pad_id=0\)"):
        tl.beam_search(model, src, beam_size=2, max_len=5)
    with pytest.raises(ValueError, match=r"src must be \(batch, S\)"):
        tl.beam_search(model, torch.zeros(2, 0, dtype=torch.long), beam_size=2, max_len=5)
