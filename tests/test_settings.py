"""transformer_lib.settings: a run's settings checked before anything is written, each bad one named in one line
with its value and what is allowed, huge sizes refused with the bound and its reason."""

import dataclasses

import pytest

import transformer_lib as tl
from transformer_lib import recipe, settings


def settings_with(overrides):
    """The tiny preset with overrides, checked as the recipe checks a run's settings (the model by TransformerConfig)."""
    return recipe.resolve_settings("tiny", overrides)


def test_good_overrides_are_applied():
    settings = settings_with({"model": {"d_model": 128, "norm_first": True}, "training": {"lr_factor": 1}})
    assert settings["model"]["d_model"] == 128 and settings["model"]["norm_first"] is True
    assert settings["training"]["lr_factor"] == 1 and recipe.PRESETS["tiny"]["model"]["d_model"] == 64  # untouched


def test_what_a_model_may_be_is_said_once_by_transformer_config():
    """The settings refuse a model value with TransformerConfig's own words (chapter 6), and keep no second list of
    the model's allowed values: only the translation's own need (max_len >= 3) is a rule of theirs."""
    assert set(settings.RULES["model"]) == {"max_len"}
    assert set(recipe.MODEL_SETTINGS) == {f.name for f in dataclasses.fields(tl.TransformerConfig)} - {
        "src_vocab_size", "tgt_vocab_size", "pad_id"}
    for key, value in [("positional", "rope"), ("dropout", 1.0), ("n_heads", 3), ("tie_embeddings", 1)]:
        with pytest.raises(ValueError) as config_says:
            tl.TransformerConfig(src_vocab_size=1000, tgt_vocab_size=1000, **{**recipe.PRESETS["tiny"]["model"],
                                                                             key: value})
        with pytest.raises(ValueError) as settings_say:
            settings_with({"model": {key: value}})
        assert str(settings_say.value) == f"setting model.{config_says.value}"


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"training": {"lr": 0.1}}, r"training.lr is not a setting; did you mean 'lr_factor'\?"),
        ({"training": {"warmpu": 10}}, r"did you mean 'warmup'\?"),
        ({"trainig": {"warmup": 10}}, r"'trainig' is not a part of the settings; did you mean 'training'\?"),
        ({"model": {"dmodel": 8}}, r"did you mean 'd_model'\?"),
        ("null", "must be a JSON object.*got str"),
        ([1, 2], "must be a JSON object.*got list"),
        ({"model": 3}, "'model' must be an object of settings, got int"),
        ({"training": {"warmup": 0}}, r"training.warmup must be a positive integer \(steps\), got 0"),
        ({"training": {"warmup": -5}}, "got -5"),
        ({"training": {"warmup": 2.5}}, "got 2.5"),
        ({"training": {"lr_factor": 0}}, r"training.lr_factor must be a number > 0, got 0"),
        ({"training": {"lr_factor": -1.0}}, "got -1.0"),
        ({"training": {"label_smoothing": 1.0}}, r"label_smoothing must be a number in \[0, 1\), got 1.0"),
        ({"training": {"label_smoothing": -0.1}}, "got -0.1"),
        ({"training": {"epochs": 0}}, "training.epochs must be a positive integer, got 0"),
        ({"training": {"checkpoint_every": 0}}, "checkpoint_every must be a positive integer"),
        ({"model": {"norm_first": "no"}}, "model.norm_first must be True or False, got 'no'"),
        ({"model": {"d_model": True}}, "model.d_model must be a positive integer"),
        ({"model": {"dropout": None}}, r"model.dropout must be a number in \[0, 1\), got None"),
        ({"model": {"n_heads": 5}}, "setting model.d_model must be divisible by n_heads"),
        ({"training": {"max_tokens": 64}}, "max_tokens must be at least model.max_len=128"),
        ({"training": {"keep_checkpoints": 10**18}}, r"keep_checkpoints must be an integer from 1 to 1,000 \(epochs"),
        ({"decoding": {"average_last": 10**18}}, r"average_last must be an integer from 1 \(the final weights\) to "
                                                 r"1,000 \(epochs averaged\), got 1000000000000000000"),
    ],
)
def test_bad_settings_name_the_key_the_value_and_what_is_allowed(overrides, message):
    with pytest.raises(ValueError, match=message):
        settings_with(overrides)


def test_a_setting_without_a_rule_keeps_its_type():
    preset = {"model": {}, "training": {"schedule": "noam"}}
    settings.validate_settings(settings.merge_settings(preset, {"training": {"schedule": "cosine"}}), preset)
    with pytest.raises(ValueError, match="training.schedule must be a str like its default 'noam', got 3"):
        settings.validate_settings(settings.merge_settings(preset, {"training": {"schedule": 3}}), preset)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"model": {"d_model": 10**9, "n_heads": 1}}, r"model.d_model must be at most 65536, got 1000000000"),
        ({"model": {"d_ff": 10**12}}, r"model.d_ff must be at most 1048576"),
        ({"model": {"n_layers": 5000}}, r"model.n_layers must be at most 1024"),
        ({"training": {"vocab_size": 10**9}}, r"training.vocab_size must be at most 1048576"),
        ({"model": {"max_len": 10**8}}, r"model.max_len must be at most 1048576"),
        ({"model": {"d_model": 16384, "n_heads": 16, "n_layers": 64, "d_ff": 65536}},
         r"would have about \d\.\de\+11 parameters.*at most 1e\+10"),
    ],
)
def test_huge_model_sizes_are_refused_with_the_bound_and_its_reason(overrides, message):
    with pytest.raises(ValueError, match=message) as error:
        settings_with(overrides)
    assert "\n" not in str(error.value)


def test_the_parameter_estimate_behind_the_bound_is_close_to_the_true_count():
    model = dict(d_model=64, n_heads=4, n_layers=3, d_ff=256, max_len=50, positional="learned")
    estimate = settings.estimate_parameters(model, vocab_size=300)
    cfg = tl.TransformerConfig(src_vocab_size=300, tgt_vocab_size=300, share_embeddings=True, tie_embeddings=True,
                               **model)
    true = sum(p.numel() for p in tl.Transformer(cfg).parameters())
    # The estimate leaves out biases and LayerNorms: per layer about 9 d_model + d_ff of 4 d_model^2 + 2 d_model d_ff
    # in the encoder (and more of both in the decoder), under 2% here.
    assert 0.98 * true <= estimate <= true
