import math

import pytest
import torch

import transformer_lib as tl


def test_embedding_scales_by_sqrt_d_model():
    emb = tl.TokenEmbedding(vocab_size=10, d_model=16, pad_id=0)
    ids = torch.tensor([[1, 2, 0]])
    torch.testing.assert_close(emb(ids), emb.lookup.weight[ids] * math.sqrt(16))
    assert (emb(ids)[0, 2] == 0).all()  # the padding vector starts at zero
    unscaled = tl.TokenEmbedding(vocab_size=10, d_model=16, pad_id=0, scale=False)  # only for the ablations
    torch.testing.assert_close(unscaled(ids), unscaled.lookup.weight[ids])
    with pytest.raises(ValueError, match="scale_embeddings must be True or False, got 'no'"):
        tl.TransformerConfig(src_vocab_size=10, tgt_vocab_size=10, scale_embeddings="no")


@pytest.mark.parametrize("bad", [10, 99, -1])
def test_out_of_vocabulary_ids_get_a_clear_error(bad):
    emb = tl.TokenEmbedding(vocab_size=10, d_model=4)
    with pytest.raises(ValueError, match=rf"token id {bad}, outside the vocabulary.*\[0, 9\]"):
        emb(torch.tensor([[1, bad]]))


def test_non_integer_ids_are_rejected():
    emb = tl.TokenEmbedding(vocab_size=10, d_model=4)
    with pytest.raises(TypeError, match="integer token ids.*torch.float32"):
        emb(torch.tensor([[1.0, 2.0]]))
    with pytest.raises(TypeError, match="must be a torch.Tensor.*list"):
        emb([[1, 2]])


def test_pad_batch():
    batch = tl.pad_batch([[5, 6, 7], [8]], pad_id=0)
    assert batch.tolist() == [[5, 6, 7], [8, 0, 0]] and batch.dtype == torch.long
    with pytest.raises(ValueError, match=r"sequences\[1\] is empty"):
        tl.pad_batch([[1], []], pad_id=0)
    with pytest.raises(ValueError, match="sequences is empty"):
        tl.pad_batch([], pad_id=0)
    with pytest.raises(TypeError, match=r"sequences\[1\] must hold integer token ids, got dtype torch.float32"):
        tl.pad_batch([[5, 6], [7.9, 8.2]], pad_id=0)  # would have become 7 and 8


@pytest.mark.parametrize("train", [tl.train_bpe_tokenizer, tl.train_word_tokenizer])
@pytest.mark.parametrize("texts", [[], ["", "  \t "], iter([])])
def test_a_tokenizer_is_not_trained_on_no_text(train, texts):
    with pytest.raises(ValueError, match="texts must hold some text to learn from"):
        train(texts, vocab_size=50, min_frequency=1)


def test_a_tokenizer_may_learn_from_a_generator():
    tokenizer = tl.train_word_tokenizer((text for text in ["a dog", "a cat"]), vocab_size=50, min_frequency=1)
    assert tokenizer.token_to_id("dog") is not None


def test_bpe_tokenizer_round_trip_and_special_tokens():
    texts = ["Ein Mann fährt Fahrrad .", "Eine Frau liest ein Buch .", "Zwei Kinder spielen im Park ."] * 3
    tokenizer = tl.train_bpe_tokenizer(texts, vocab_size=80, min_frequency=1)
    for token, expected in zip(tl.SPECIAL_TOKENS, (tl.PAD_ID, tl.BOS_ID, tl.EOS_ID, tl.UNK_ID)):
        assert tokenizer.token_to_id(token) == expected
    sentence = "Ein Kind fährt im Park ."
    ids = tokenizer.encode(sentence).ids
    assert ids[0] == tl.BOS_ID and ids[-1] == tl.EOS_ID and tl.UNK_ID not in ids
    assert tokenizer.decode(ids) == sentence
    with pytest.raises(ValueError, match="vocab_size must exceed the 4 special tokens, got 4"):
        tl.train_bpe_tokenizer(texts, vocab_size=4)
