"""transformer_lib.checkpoint_checks: a checkpoint is data (a crafted one runs nothing), a bad file is one line, and
the checksum over weights, config and training state refuses a file changed since it was written."""

import pickle
from pathlib import Path

import pytest
import torch

import transformer_lib as tl
from transformer_lib import checkpoint_checks
from transformer_lib.training import load_checkpoint, train

from copy_task import CFG, copy_batches, fresh


# ---- checkpoints are data ----


class RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))  # loading would create the marker file


@pytest.mark.parametrize("how", ["pickle", "torch.save"])
def test_a_crafted_checkpoint_runs_nothing(tmp_path, how):
    marker, path = tmp_path / "ran", tmp_path / "checkpoint.pt"
    payload = {key: RunsCode(marker) for key in ("config", "model", "state", "extra")}
    if how == "pickle":
        path.write_bytes(pickle.dumps(payload))
    else:
        torch.save(payload, path)
    with pytest.raises(checkpoint_checks.CheckpointError, match="is not a transformer_lib checkpoint"):
        load_checkpoint(path)
    assert not marker.exists()


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "corrupt or not a checkpoint"),
        (b"hello\n", "corrupt or not a checkpoint|not a transformer_lib checkpoint"),
        (b"a man\ntwo dogs\n", "corrupt or not a checkpoint"),  # torch.load's legacy reader: IndexError
        ("truncated", "corrupt or not a checkpoint"),
        ("foreign", r"lacks 'config', 'model'"),
        ("tensor", "holds a Tensor"),
    ],
)
def test_bad_checkpoint_files_give_one_line(tmp_path, content, message):
    path = tmp_path / "checkpoint.pt"
    if content == "truncated":
        model, optimizer, scheduler = fresh()
        train(model, copy_batches, optimizer, scheduler, max_steps=1, checkpoint_path=path, progress=False)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif content == "foreign":
        torch.save({"weights": torch.ones(2)}, path)
    elif content == "tensor":
        torch.save(torch.ones(2), path)
    else:
        path.write_bytes(content)
    with pytest.raises(checkpoint_checks.CheckpointError, match=message) as error:
        load_checkpoint(path)
    assert "\n" not in str(error.value) and str(path) in str(error.value)



# ---- the checksum ----


def checksummed(seed: int = 0) -> dict:
    torch.manual_seed(seed)
    model = tl.Transformer(tl.TransformerConfig(**CFG))
    checkpoint = {"config": dict(CFG), "model": model.state_dict(), "extra": {}}
    checkpoint["checksum"] = checkpoint_checks.weights_checksum(checkpoint)
    return checkpoint


def test_the_weights_checksum_is_deterministic_and_sees_every_name_dtype_shape_and_byte():
    checkpoint = checksummed()
    digest = checkpoint["checksum"]
    assert len(digest) == 64 and digest == checksummed()["checksum"]  # the same weights: the same sha256
    assert digest != checksummed(seed=1)["checksum"]
    weights = checkpoint["model"]
    name = "encoder.layers.0.feed_forward.linear1.weight"
    variants = {
        "a flipped byte": {**weights, name: weights[name].clone().view(torch.int32).bitwise_xor(1 << 7).view(torch.float32)},
        "another dtype": {**weights, name: weights[name].double()},
        "another shape": {**weights, name: weights[name].reshape(-1)},
        "another name": {("x" + k if k == name else k): v for k, v in weights.items()},
    }
    for what, model in variants.items():
        assert checkpoint_checks.weights_checksum({"config": CFG, "model": model}) != digest, what
    assert checkpoint_checks.weights_checksum({"config": {**CFG, "n_heads": 8}, "model": weights}) != digest


def test_a_checkpoint_whose_weights_or_config_changed_since_it_was_written_is_refused(tmp_path):
    path = tmp_path / "checkpoint.pt"
    checkpoint = checksummed()
    checkpoint_checks.check_checkpoint(checkpoint, path, ("config", "model"))  # intact
    checkpoint["config"]["n_heads"] = 8  # edited from 4 to 8 heads
    with pytest.raises(checkpoint_checks.CheckpointError, match="weights, config or training state changed since the file was "
                                                   "written") as error:
        checkpoint_checks.check_checkpoint(checkpoint, path, ("config", "model"))
    assert str(path) in str(error.value) and "\n" not in str(error.value)
    checkpoint = checksummed()
    name = "decoder.layers.1.feed_forward.linear2.bias"
    checkpoint["model"][name] = checkpoint["model"][name].clone()
    checkpoint["model"][name][3] += 1e-6  # flipped bits in one weight
    with pytest.raises(checkpoint_checks.CheckpointError, match="changed since"):
        checkpoint_checks.check_checkpoint(checkpoint, path, ("config", "model"))
    del checkpoint["checksum"]  # save_checkpoint always writes one: a file without is not its
    with pytest.raises(checkpoint_checks.CheckpointError, match="it has no checksum, which save_checkpoint always writes"):
        checkpoint_checks.check_checkpoint(checkpoint, path, ("config", "model"))


def test_a_flipped_byte_in_the_optimizer_state_or_the_run_record_is_refused_on_load(tmp_path):
    """The checksum covers what a resumed run continues from, not only the weights: a flipped bit in Adam's second
    moment would resume into weights of 1e12, one in the run record or its tokenizer would change a translation."""
    path = tmp_path / "checkpoint.pt"
    model, optimizer, scheduler = fresh()
    train(model, copy_batches, optimizer, scheduler, max_steps=3, progress=False, checkpoint_path=path,
          checkpoint_extra={"run": {"seed": 0}, "tokenizer": "{}"})
    load_checkpoint(path)  # intact
    saved = torch.load(path, weights_only=True)
    damaged = {
        "Adam's second moment": lambda c: c["optimizer"]["state"][0]["exp_avg_sq"].view(-1)[:1].add_(1e12),
        "the learning rate": lambda c: c["optimizer"]["param_groups"][0].update(lr=1.0),
        "the step": lambda c: c["state"].update(step=c["state"]["step"] + 1),
        "the run record": lambda c: c["extra"]["run"].update(seed=1),
        "the random state": lambda c: c["rng"]["torch"].view(-1)[:1].add_(1),
    }
    for what, damage in damaged.items():
        checkpoint = torch.load(path, weights_only=True)
        damage(checkpoint)
        torch.save(checkpoint, tmp_path / "damaged.pt")
        with pytest.raises(checkpoint_checks.CheckpointError, match="fails its checksum"):
            load_checkpoint(tmp_path / "damaged.pt")
        assert checkpoint_checks.weights_checksum(checkpoint) != saved["checksum"], what


def test_a_checkpoint_whose_weights_changed_on_disk_is_refused(tmp_path):
    path = tmp_path / "checkpoint.pt"
    model, optimizer, scheduler = fresh()
    train(model, copy_batches, optimizer, scheduler, max_steps=2, checkpoint_path=path, progress=False)
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["checksum"] == checkpoint_checks.weights_checksum(checkpoint)
    checkpoint["model"]["generator.weight"][0, 0] += 1e-3  # a few flipped bits
    torch.save(checkpoint, path)
    with pytest.raises(checkpoint_checks.CheckpointError, match="fails its checksum"):
        load_checkpoint(path)
    checkpoint = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    checkpoint["model"]["generator.weight"][0, 0] -= 1e-3
    checkpoint["config"]["n_heads"] = 8  # a config edited by hand
    torch.save(checkpoint, path)
    with pytest.raises(checkpoint_checks.CheckpointError, match="fails its checksum"):
        load_checkpoint(path)
