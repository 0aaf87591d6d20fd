"""Data-parallel training (transformer_lib/distributed.py): two gloo processes on the CPU train exactly like one."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import transformer_lib as tl
from transformer_lib.distributed import (
    TorchrunProcess,
    data_parallel,
    init_distributed,
    is_main_process,
    launch_info,
    shard_batch,
    token_share,
    unwrap,
)
from transformer_lib.training import SingleProcess, train

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("TRANSFORMER_LIB_DATA", ROOT.parent / "shared" / "data"))
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
PAD, STEPS = 0, 4


def random_batch(sizes: list[tuple[int, int]], vocab: int = 20, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A right-padded (src, tgt) batch with the given (source, target) lengths; ids 1 .. vocab-1 are real tokens."""
    g = torch.Generator().manual_seed(seed)
    src = [torch.randint(1, vocab, (s,), generator=g).tolist() for s, _ in sizes]
    tgt = [torch.randint(1, vocab, (t,), generator=g).tolist() for _, t in sizes]
    return tl.pad_batch(src, PAD), tl.pad_batch(tgt, PAD)


def global_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed batches: with 2 processes, rank 0 gets 3 short sentences and rank 1 two long ones; the last has one."""
    return [
        random_batch([(3, 4), (4, 3), (5, 5), (9, 11), (12, 8)], seed=1),
        random_batch([(6, 2), (2, 6), (7, 7), (7, 3), (10, 12)], seed=2),
        random_batch([(4, 4), (11, 5), (3, 9), (8, 8), (5, 2)], seed=3),
        random_batch([(7, 6)], seed=4),  # like an epoch's last batch: smaller than the group, so every process gets it
    ]


def sgd(model: torch.nn.Module) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """Plain SGD: its update is the gradient times 0.5, so equal gradients give equal weights.

    Adam divides each gradient by its own running size. Some gradients are zero in exact arithmetic (the key biases':
    adding one vector to every key shifts all scores of a query equally, which the softmax ignores) and rounding
    leaves ~1e-9 in them, which Adam blows up to full-size steps of random sign. Their values then differ between any
    two runs whose additions happen in another order, without changing what the model computes.
    """
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def new_model() -> tl.Transformer:
    """A small model without dropout, so that every process computes the same function of its data."""
    torch.manual_seed(0)
    return tl.Transformer(tl.TransformerConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=32, n_heads=4, n_layers=2,
                                               d_ff=64, dropout=0.0, max_len=32, pad_id=PAD))


def free_port() -> int:
    """A TCP port nobody listens on now, chosen by the operating system (so parallel test workers do not clash)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- one process: every helper does nothing ---------------------------------------------------------------------


def test_shards_hold_every_sentence_once_in_order():
    src, tgt = random_batch([(3, 4), (4, 3), (5, 5), (9, 11), (12, 8), (2, 2), (6, 7)])
    for world in (2, 3, 7):
        shards = [shard_batch(src, tgt, PAD, rank, world) for rank in range(world)]
        sizes = [s.size(0) for s, _ in shards]
        assert sum(sizes) == src.size(0) and max(sizes) - min(sizes) <= 1
        for part, whole in ((0, src), (1, tgt)):
            pieces = [shard[part] for shard in shards]
            assert all((piece[:, -1] != PAD).any() for piece in pieces), "a shard kept an all-padding column"
            padded = [torch.nn.functional.pad(p, (0, whole.size(1) - p.size(1)), value=PAD) for p in pieces]
            assert torch.equal(torch.cat(padded), whole)  # the union of the shards is exactly the batch


def test_a_batch_smaller_than_the_world_is_refused():
    src, tgt = random_batch([(3, 4), (4, 3)])
    with pytest.raises(ValueError, match=r"a batch of 2 sentences cannot be shared by world_size=3 processes"):
        shard_batch(src, tgt, PAD, rank=0, world_size=3)
    for rank in range(3):  # or, when asked, every process gets the whole batch (token_share keeps the gradient exact)
        assert shard_batch(src, tgt, PAD, rank=rank, world_size=3, whole_if_small=True) == (src, tgt)
    with pytest.raises(ValueError, match=r"rank=2 and world_size=2: expected 0 <= rank < world_size"):
        shard_batch(src, tgt, PAD, rank=2, world_size=2)
    with pytest.raises(ValueError, match=r"src has 2 sentences but tgt has 1"):
        shard_batch(src, tgt[:1], PAD, rank=0, world_size=1)


def test_on_one_process_every_helper_does_nothing(monkeypatch):
    for name in TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert launch_info() == (0, 1, 0)
    assert not init_distributed() and is_main_process()
    src, tgt = random_batch([(3, 4), (4, 3)])
    assert shard_batch(src, tgt, PAD) == (src, tgt)
    model = new_model()
    assert data_parallel(model) is model and unwrap(model) is model
    loss = torch.tensor(2.5, requires_grad=True)
    share = token_share(loss, torch.tensor(7))
    assert share.weight == 1.0 and share.loss.item() == 2.5 and int(share.tokens) == 7


def test_torchrun_process_has_chapter_7s_members_and_on_one_process_behaves_like_it(monkeypatch):
    """train and train_translator use only SingleProcess's members: TorchrunProcess must have each of them."""
    for name in TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    members = {name for name in dir(SingleProcess) if not name.startswith("_")}
    assert members == {"is_main", "world_size", "device", "broadcast", "shard", "wrap", "unwrap", "share"}
    single, torchrun = SingleProcess(), TorchrunProcess()
    assert members <= {name for name in dir(TorchrunProcess) if not name.startswith("_")}
    assert not torchrun.joined  # a single process joins no group
    src, tgt = random_batch([(3, 4), (4, 3)])
    model = new_model()
    for process in (single, torchrun):
        assert process.is_main and process.world_size == 1 and process.device() == tl.get_device()
        assert process.broadcast("tokenizer") == "tokenizer" and process.shard(src, tgt, PAD) == (src, tgt)
        assert process.wrap(model) is model and process.unwrap(model) is model
        weight, loss, tokens = process.share(torch.tensor(2.5), torch.tensor(7))
        assert weight == 1.0 and loss.item() == 2.5 and int(tokens) == 7
    torchrun.close()


def test_a_wrong_torchrun_environment_is_named(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"RANK=2, WORLD_SIZE=2, LOCAL_RANK=0: expected 0 <= RANK < WORLD_SIZE"):
        launch_info()
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match=r"WORLD_SIZE must be an integer, got 'two'"):
        launch_info()


# ---- two processes: DDP with the loss weighting equals one process on the whole batch ------------------------------


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """One of the spawned processes: join the group as torchrun would, train STEPS steps and record what happened."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), CUDA_VISIBLE_DEVICES="")
    torch.set_num_threads(1 + rank)  # other thread counts split the reductions differently: rounding must not matter
    process = TorchrunProcess()  # joins the group, as the command line does under torchrun
    assert process.joined and dist.get_backend() == "gloo"
    model = data_parallel(new_model())
    optimizer, scheduler = sgd(unwrap(model))
    batches = [shard_batch(src, tgt, PAD, whole_if_small=True) for src, tgt in global_batches()]
    state, spread = None, []
    for step in range(1, STEPS + 1):  # one step per call, to compare the replicas after every step
        state = train(model, lambda epoch: batches, optimizer, scheduler, max_steps=step, state=state, log_every=1,
                      progress=False, process=process)
        flat = torch.nn.utils.parameters_to_vector(unwrap(model).parameters()).detach()  # (n_params,)
        everyone = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(everyone, flat)
        spread.append(max(float((other - flat).abs().max()) for other in everyone))
    tokens = [int((tgt[:, 1:] != PAD).sum()) for _, tgt in batches[:3]]
    torch.save({"history": state.history, "spread": spread, "tokens": tokens, "weights": unwrap(model).state_dict(),
                "main": process.is_main}, Path(out_dir) / f"rank{rank}.pt")
    process.close()


def test_two_gloo_processes_train_exactly_like_one_on_the_global_batch(tmp_path, monkeypatch):
    for name in TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    mp.spawn(_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert [r["main"] for r in ranks] == [True, False]
    assert ranks[0]["tokens"] != ranks[1]["tokens"]  # the ranks hold different numbers of target tokens
    for r in ranks:
        assert r["spread"] == [0.0] * STEPS  # the replicas are bit-identical after every step
        assert all(not name.startswith("module.") for name in r["weights"])

    model = new_model()  # the same run on one process, on the whole batches
    optimizer, scheduler = sgd(model)
    state = train(model, lambda epoch: global_batches(), optimizer, scheduler, max_steps=STEPS, log_every=1,
                  progress=False)
    for r in ranks:
        # Not bit-exact: each process sums over its own sentences and the all-reduce adds the two partial
        # gradients, so the floating-point additions happen in another order; they agree to rounding. A gradient
        # element sums ~4,000 products (tokens x d_ff): rounding ~ eps 1.2e-7 x sqrt(4,000) = 8e-6 of its size, which
        # is ~1e-2 after clipping to norm 1; 4 SGD steps of lr 0.5 then part weights (|w| <= 1) by ~1.6e-7. Seen:
        # 1.2e-7 with every mix of 1 and 2 threads and batch orders, losses (~3) 4e-7. 1e-5 leaves 25x; without
        # token_share's weight the weights differ by 2e-2 and the losses by 0.2.
        assert [s for s, *_ in r["history"]] == [s for s, *_ in state.history] == list(range(1, STEPS + 1))
        torch.testing.assert_close([v for _, v, _ in r["history"]], [v for _, v, _ in state.history], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(r["weights"], model.state_dict(), rtol=1e-5, atol=1e-5)


def test_without_the_weighting_plain_averaging_is_wrong():
    """Why token_share exists: the mean of the per-process means is not the mean over the global batch's tokens."""
    losses = torch.tensor([1.0, 1.0, 1.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0])  # per-token losses of one global batch
    rank0, rank1 = losses[:3], losses[3:]  # 3 tokens on rank 0, 6 on rank 1
    mean_of_means = (rank0.mean() + rank1.mean()) / 2
    weighted = (rank0.mean() * 3 * 2 / 9 + rank1.mean() * 6 * 2 / 9) / 2  # what DDP averages after token_share
    assert mean_of_means.item() == 2.5 and losses.mean().item() == 3.0
    torch.testing.assert_close(weighted, losses.mean())


# ---- the command line under torchrun --------------------------------------------------------------------------------


def run_cli(*args: str, processes: int = 1, threads: int = 1) -> subprocess.CompletedProcess:
    """python -m transformer_lib ..., under `python -m torch.distributed.run` when processes > 1, on the CPU."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARIABLES}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMER_LIB_DATA=str(DATA),
               OMP_NUM_THREADS=str(threads), CUDA_VISIBLE_DEVICES="")
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"] if processes > 1 else []
    return subprocess.run([sys.executable, *launcher, "-m", "transformer_lib", *args], env=env, capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


def test_the_command_line_under_torchrun_matches_one_process(tmp_path):
    if not (DATA / "multi30k" / "train.jsonl").is_file():
        pytest.skip(f"the offline Multi30k copy is not at {DATA}")
    config = tmp_path / "no_dropout.json"  # dropout masks differ with the batch's shape, so compare without them
    config.write_text(json.dumps({"model": {"dropout": 0.0}}))
    common = ["train", "--preset", "tiny", "--config", str(config), "--train-limit", "200", "--max-steps", "20",
              "--no-progress"]
    two = run_cli(*common, "--out", str(tmp_path / "two"), processes=2)
    assert two.returncode == 0, two.stderr[-3000:]
    assert two.stdout.count("trained 20 steps on 2 processes (cpu)") == 1, two.stdout  # rank 0 alone prints
    names = sorted(p.name for p in (tmp_path / "two").iterdir())
    assert [n for n in names if not n.startswith("epoch-")] == ["checkpoint.pt", "history.json", "tokenizer.json"]
    assert len([n for n in names if n.startswith("epoch-")]) <= 2  # the last epochs' weights (keep_checkpoints)
    one = run_cli(*common, "--out", str(tmp_path / "one"), threads=2)  # another thread count: rounding must not matter
    assert one.returncode == 0, one.stderr[-3000:]

    two_history = json.loads((tmp_path / "two" / "history.json").read_text())["train_loss"]
    one_history = json.loads((tmp_path / "one" / "history.json").read_text())["train_loss"]
    assert [s for s, *_ in two_history] == [s for s, *_ in one_history] == [10, 20]
    # The same global batches in the same order, so the same losses up to the order of floating-point additions: a
    # step's loss sums ~1,000 tokens pairwise, rounding ~ eps 1.2e-7 x log2(1,000) ~ 1.2e-6 of it, and the weights
    # Adam scatters (below) do not move it to first order. Seen: 1e-7 of it (1 or 2 threads, either process count);
    # without token_share's weight, 2.5e-5.
    torch.testing.assert_close([v for _, v, _ in two_history], [v for _, v, _ in one_history], rtol=1e-5, atol=0)
    assert (tmp_path / "two" / "tokenizer.json").read_text() == (tmp_path / "one" / "tokenizer.json").read_text()

    model, tokenizer = tl.load_translator(tmp_path / "two", device="cpu")  # saved unwrapped: no 'module.' prefix
    reference, _ = tl.load_translator(tmp_path / "one", device="cpu")
    # Adam steps by about the learning rate whatever the gradient's size (see sgd above): a weight whose gradient is
    # rounding noise takes random steps of up to lr, the largest of which is at step 20 of the warm-up. The key biases
    # (pure noise) are left out; the other weights drift ~lr apart at most: 3 x peak_lr = 1.1e-3. Seen: 5e-5 with
    # 1 or 2 threads, either process count; without token_share's weight, 2e-3.
    tiny = tl.recipe.resolve_settings("tiny")["training"]
    peak_lr = tiny["lr_factor"] * tl.noam_lr(20, 64, tiny["warmup"])  # 3.5e-4
    weights, expected = model.state_dict(), reference.state_dict()
    for name in [name for name in weights if name.endswith("w_k.bias")]:
        del weights[name], expected[name]
    torch.testing.assert_close(weights, expected, rtol=0, atol=3 * peak_lr)
    src = tl.pad_batch([enc.ids for enc in tokenizer.encode_batch(["Ein Hund läuft.", "Zwei Männer essen."])], tl.PAD_ID)
    tgt = tl.pad_batch([enc.ids for enc in tokenizer.encode_batch(["A dog runs.", "Two men eat."])], tl.PAD_ID)
    # A logit sums d_model = 64 products with such weights: ~sqrt(20 steps) x sqrt(64) x peak_lr ~ 30 x peak_lr.
    # Seen: 6e-4 with 1 or 2 threads (one process on 1 and on 2 threads differs as much); without the weight, 4e-2.
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt[:, :-1]), reference(src, tgt[:, :-1]), rtol=0, atol=30 * peak_lr)
