"""benchmarks/ablations.py: what each choice of the paper is worth. Its records are measured on a GPU; here its
variants, its runs and its table are checked on a made-up corpus in seconds."""

import json
import math
import random

import pytest

from test_cli import DATA
from test_translation import QUICK, tiny_corpus

import transformer_lib as tl
from transformer_lib import recipe
from transformer_lib import data
from transformer_lib.files import read_checked_json, write_checked_json
from transformer_lib.scoring import corpus_scores

import ablation_records
import ablation_tables
import ablations
import ablations_page


MEASURED = {**QUICK, "training": {**QUICK["training"], "bleu_every": 1}}  # greedy BLEU after every epoch: the curve


def _model(variant: str) -> tl.Transformer:
    """The model train_translator builds for a variant of the multi30k preset (a small vocabulary, to be quick)."""
    settings = recipe.resolve_settings("multi30k", ablation_records.VARIANTS[variant][1])
    model = {"share_embeddings": True, "tie_embeddings": True, **settings["model"]}  # as _new_model
    return tl.Transformer(tl.TransformerConfig(src_vocab_size=50, tgt_vocab_size=50, **model))


def test_every_variant_is_valid_and_changes_what_it_says():
    baseline = recipe.resolve_settings("multi30k")
    for variant, (description, changes) in ablation_records.VARIANTS.items():
        settings = recipe.resolve_settings("multi30k", changes)  # a key that is not a setting is refused
        assert (settings == baseline) == (variant == "baseline"), variant
        assert description
    paper = _model("baseline")
    assert not paper.cfg.norm_first and paper.src_embed is paper.tgt_embed
    assert paper.generator.weight is paper.tgt_embed.lookup.weight and paper.src_embed.scale == math.sqrt(256)
    assert _model("pre-norm").cfg.norm_first and _model("pre-norm-no-warmup").cfg.norm_first
    assert _model("no-embedding-scale").src_embed.scale == 1.0
    untied = _model("untied-output")
    assert untied.generator.weight is not untied.tgt_embed.lookup.weight
    separate = _model("separate-embeddings")
    assert separate.src_embed is not separate.tgt_embed and separate.generator.weight is separate.tgt_embed.lookup.weight
    assert isinstance(_model("learned-positions").src_positional, tl.LearnedPositionalEncoding)
    assert _model("dropout-0.3").cfg.dropout == 0.3
    warmup = recipe.resolve_settings("multi30k", ablation_records.VARIANTS["no-warmup"][1])["training"]["warmup"]
    assert warmup == 1 and tl.noam_lr(1, 256, warmup) == max(tl.noam_lr(s, 256, warmup) for s in range(1, 100))


def test_a_sweep_writes_one_record_per_run_decides_on_validation_and_goes_on_where_it_stopped(tmp_path, monkeypatch,
                                                                                               capsys):
    monkeypatch.setenv(data.DATA_ENV, str(tiny_corpus(tmp_path / "data", rows=120)))  # BLEU needs 100 sentences
    out = tmp_path / "records"
    quick = ["--out", str(out), "--preset", "tiny", "--overrides", json.dumps(MEASURED), "--epochs", "2",
             "--max-len", "8", "--alpha", "0.6", "1.0", "--seeds", "3"]
    assert ablations.main([*quick, "--variants", "baseline", "separate-embeddings"]) == 0
    records = {r["variant"]: r for r in ablation_records.read_records(out)}
    assert sorted(records) == ["baseline", "separate-embeddings"]
    for record in records.values():
        assert record["seed"] == 3 and record["epochs"] == 2 and not record["diverged"]
        assert record["device"] == "cpu" and record["device_name"] and record["torch"]
        assert record["curve"] and record["minutes"] == record["curve"][-1]["minutes"] > 0
        assert record["final_valid_loss"] == record["curve"][-1]["valid_loss"]
        validation = [d for d in record["decodes"] if d["split"] == "validation" and d["beam_size"] > 1]
        assert {(d["average_last"], d["alpha"]) for d in validation} == {(1, 0.6), (1, 1.0), (2, 0.6), (2, 1.0)}
        best = max(validation, key=lambda d: d["bleu"])
        assert record["chosen"]["valid_bleu"] == best["bleu"] and record["chosen"]["chosen_on"] == "validation"
        assert record["test"]["bleu"] == next(d["bleu"] for d in record["decodes"] if d["split"] == "test")
        assert 0 <= record["test_greedy_final"] <= 100 and 0 <= record["test_beam_final"] <= 100
        kept = record["test_hypotheses"]  # the sentences, for the bootstrap intervals and the paired tests
        assert sorted(kept) == ["beam_final", "chosen", "greedy_final"]
        test_size = len(data.load_pairs("multi30k", "test", "de", "en"))
        assert all(len(hyps) == test_size and all(isinstance(h, str) for h in hyps) for hyps in kept.values())
        assert corpus_scores(kept["chosen"], [en for _, en in data.load_pairs("multi30k", "test", "de", "en")])[
            "bleu"] == record["test"]["bleu"]
        assert len(record["load_average"]) == len(record["curve"])
    assert records["baseline"]["steps"] == records["separate-embeddings"]["steps"]  # one seed: the same batches
    assert records["separate-embeddings"]["settings"]["model"]["share_embeddings"] is False
    assert records["baseline"]["settings"]["model"]["d_model"] == QUICK["model"]["d_model"]  # --overrides applied
    capsys.readouterr()
    assert ablations.main([*quick, "--variants", "baseline", "separate-embeddings"]) == 0
    assert "0 runs to do" in capsys.readouterr().out  # a run with a record is not repeated

    references = [en for _, en in data.load_pairs("multi30k", "test", "de", "en")]
    per_run = ablation_tables.runs_table(ablation_records.read_records(out), references).set_index("variant")
    assert list(per_run.index) == ["baseline", "separate-embeddings"] and set(per_run["seed"]) == {3}
    for variant, row in per_run.iterrows():  # sacreBLEU's bootstrap: an interval around the run's own score
        assert row["test BLEU"] == records[variant]["test"]["bleu"] and row["95% CI ±"] >= 0
        assert abs(row["bootstrap mean"] - row["test BLEU"]) <= row["95% CI ±"] + 1e-9
    assert math.isnan(per_run.loc["baseline", "paired p"]) and per_run.loc["baseline", "vs baseline"] == 0
    assert 0 <= per_run.loc["separate-embeddings", "paired p"] <= 1  # the paired test against the same seed's baseline
    assert per_run.loc["separate-embeddings", "vs baseline"] == (records["separate-embeddings"]["test"]["bleu"]
                                                                 - records["baseline"]["test"]["bleu"])
    def variant_with(name: str, chosen: list[str]) -> dict:  # a made-up run of the same seed, decoded as chosen
        return {**records["separate-embeddings"], "variant": name,
                "test_hypotheses": {**records["baseline"]["test_hypotheses"], "chosen": chosen}}

    kept = records["baseline"]["test_hypotheses"]["chosen"]
    assert len(kept) == len(references)
    stats = ablation_tables.significance([records["baseline"], variant_with("pre-norm", references)], references)
    assert stats["pre-norm", 3]["p_value"] < 0.01  # every reference itself: a difference no resampling explains
    assert stats["baseline", 3]["p_value"] is None and stats["pre-norm", 3]["mean"] == pytest.approx(100)

    table = ablation_tables.summary_table(ablation_records.read_records(out))
    assert list(table["variant"][:2]) == ["baseline", "separate-embeddings"]  # in VARIANTS' order
    row = table.set_index("variant").loc["baseline"]
    assert row["test BLEU"] == records["baseline"]["test"]["bleu"] and math.isnan(row["test BLEU spread"])
    assert "baseline decoded by greedy search, final weights" in set(table["variant"])
    ax = ablation_tables.plot_curves(ablation_records.read_records(out))
    lines = ax.get_lines()
    assert len(lines) == 2 and [line.get_label() for line in lines] == ["baseline", "separate-embeddings"]
    assert list(lines[0].get_xdata()) == [p["step"] for p in records["baseline"]["curve"]]  # every epoch's BLEU


class Killed(Exception):
    """What stops the run in the test below (a kill leaves no chance to save; nor does this)."""


def test_a_stopped_run_goes_on_from_its_last_checkpoint_and_its_record_says_where(tmp_path, monkeypatch):
    """A run stopped after its first epoch's checkpoint (here: at its second epoch's record) keeps its folder under
    --work; called again, it resumes there, and its record holds both epochs, where it was resumed, and the same
    steps as a run that was never stopped. The folder goes once the record is written."""
    monkeypatch.setenv(data.DATA_ENV, str(tiny_corpus(tmp_path / "data", rows=120)))
    work = tmp_path / "work"
    work.mkdir()
    # Checkpoints at epochs' ends only (QUICK saves one every step, and a kill right after the last step's save,
    # before that epoch's end was handled, is a case of its own: see the closing note of issue 49).
    settings = {**MEASURED, "training": {**MEASURED["training"], "checkpoint_every": 10_000}}
    one = ["--preset", "tiny", "--overrides", json.dumps(settings), "--epochs", "2", "--max-len", "8",
           "--alpha", "0.6", "--variant", "baseline", "--seed", "3", "--work", str(work)]
    train_translator = tl.train_translator

    def stopped_at_the_second_epoch(*args, on_record, **kwargs):
        def on_record_then_stop(point):
            if point["epoch"] == 2:
                raise Killed  # as a kill would, after epoch 1's checkpoint and before epoch 2's
            on_record(point)
        return train_translator(*args, on_record=on_record_then_stop, **kwargs)

    monkeypatch.setattr(tl, "train_translator", stopped_at_the_second_epoch)
    with pytest.raises(Killed):
        ablations.main(["--out", str(tmp_path / "records"), *one])
    [folder] = [p for p in work.glob("*/baseline-seed3")]
    assert (folder / "run" / "checkpoint.pt").is_file() and not (tmp_path / "records" / "baseline-seed3.json").exists()
    monkeypatch.setattr(tl, "train_translator", train_translator)
    assert ablations.main(["--out", str(tmp_path / "records"), *one]) == 0
    record = ablation_records.read_record(tmp_path / "records" / "baseline-seed3.json")
    assert [point["epoch"] for point in record["curve"]] == [1, 2] and len(record["load_average"]) == 2
    assert [(part["epoch"], part["step"] > 0) for part in record["resumed"]] == [(1, True)]
    assert not folder.exists()  # the record written, the run's folder is gone
    assert ablations.main(["--out", str(tmp_path / "whole"), *one]) == 0  # never stopped: the same run
    whole = ablation_records.read_record(tmp_path / "whole" / "baseline-seed3.json")
    assert whole["resumed"] == [] and whole["steps"] == record["steps"]
    assert [p["step"] for p in whole["curve"]] == [p["step"] for p in record["curve"]]


def test_the_table_keeps_a_diverged_run_apart_and_shows_the_spread_over_seeds():
    def record(seed: int, bleu: float | None, minutes: float = 1.5, load: float = 2.0) -> dict:
        trained = bleu is not None
        return {"variant": "no-warmup", "seed": seed, "diverged": not trained, "steps": 100 if trained else None,
                "test": {"bleu": bleu} if trained else None, "valid_bleu_greedy": bleu, "final_valid_loss": 2.0,
                "minutes": minutes if trained else None, "device": "cpu", "torch_threads": 2, "jobs": 1,
                "load_average": [load, load]}

    table = ablation_tables.summary_table([record(0, 30.0), record(1, 33.0, minutes=3.0, load=3.1), record(2, None)])
    row = table.set_index("variant").loc["no-warmup"]
    assert (row["seeds"], row["diverged"], row["test BLEU"], row["test BLEU spread"]) == (3, 1, 31.5, 3.0)
    assert (row["minutes"], row["runs alone"]) == (1.5, 1)  # the run beside other work is left out of the price


def test_a_run_s_minutes_are_the_recipe_s_only_when_it_had_the_machine_to_itself():
    run = {"device": "cpu", "torch_threads": 2, "jobs": 1, "load_average": [2.0, 2.1, 1.9]}
    assert ablation_tables.had_the_machine(run)
    assert not ablation_tables.had_the_machine({**run, "load_average": [2.0, 3.5, 2.4]})  # a mean of 2.63: shared
    assert ablation_tables.had_the_machine({**run, "torch_threads": 1, "jobs": 2})  # two runs of one thread: their own
    assert not ablation_tables.had_the_machine({**run, "torch_threads": 1})  # one thread, and a second core's worth beside
    assert not ablation_tables.had_the_machine({**run, "load_average": None})  # the first records: cannot tell
    assert ablation_tables.had_the_machine({**run, "device": "cuda", "load_average": [9.0]})  # the CPU's load does not time a GPU
    steady = [{"minutes": 3.0 * epoch} for epoch in range(1, 5)]
    assert ablation_tables.slowest_epoch({"curve": steady}) == pytest.approx(1.0)
    assert ablation_tables.had_the_machine({**run, "curve": steady})
    burst = steady[:2] + [{"minutes": 6.0 + 12.0}, {"minutes": 21.0}]  # the third epoch 12 minutes, 4 times 3
    assert ablation_tables.slowest_epoch({"curve": burst}) == pytest.approx(4.0)
    assert not ablation_tables.had_the_machine({**run, "curve": burst})  # its loads are a calm 2.0: the minutes tell
    assert ablation_tables.slowest_epoch({"curve": steady[:2]}) is None  # two epochs: no median to speak of


def test_bad_options_are_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        ablations.main(["--variants", "no-such-variant", "--out", str(tmp_path)])
    assert "invalid choice: 'no-such-variant'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ablations.main([])
    assert "give --out" in capsys.readouterr().err


def test_the_records_are_checked_when_read_and_a_bad_or_foreign_one_is_named_in_one_line(tmp_path, monkeypatch,
                                                                                         capsys):
    monkeypatch.setenv(data.DATA_ENV, str(tiny_corpus(tmp_path / "data", rows=120)))
    out = tmp_path / "records"
    quick = ["--out", str(out), "--preset", "tiny", "--overrides", json.dumps(MEASURED), "--epochs", "1",
             "--max-len", "8", "--alpha", "1.0", "--seeds", "0", "--variants", "baseline"]
    assert ablations.main(quick) == 0
    path = ablation_records.record_path(out, "baseline", 0)
    good = read_checked_json(path, "record", "the test")
    capsys.readouterr()

    def refused(argv: list[str], *expected: str) -> None:
        assert ablations.main(argv) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
        assert all(part in err for part in expected), err

    # a sweep of another length (a quick trial's records in the sweep's folder) is not taken for a finished run
    refused([*quick[:7], "2", *quick[8:]], str(path), "epochs_asked 1 where this sweep has 2")
    # nor does a new seed of another preset or length land among the folder's records: refused before it trains
    new_seed = [*quick[:13], "1", *quick[14:]]
    assert new_seed[2:4] == ["--preset", "tiny"] and new_seed[6:8] == ["--epochs", "1"] and "0" not in new_seed
    for argv, differs in (([*new_seed[:7], "2", *new_seed[8:]], "epochs_asked 1 where this sweep has 2"),
                          ([*new_seed[:3], "multi30k-cpu", *new_seed[4:]], "preset 'tiny' where this sweep has")):
        refused(argv, str(path), f"--out {str(out)!r}", differs, "nothing was trained", "the folder's own settings")
        assert sorted(p.name for p in out.glob("*.json")) == ["baseline-seed0.json"]
        assert not (out / "logs" / "baseline-seed1.log").exists()
    damaged = {
        "is not valid JSON": lambda: path.write_text('{"variant": "baseline", ', encoding="utf-8"),
        "lacks": lambda: write_checked_json(path, {k: v for k, v in good.items() if k != "test"}),
        "a run cut short": lambda: write_checked_json(path, {**good, "curve": good["curve"] + good["curve"]}),
        "minutes up to a year": lambda: write_checked_json(path, {**good, "minutes": 1e308}),
        "not a number from 0 to 100": lambda: write_checked_json(path, {**good, "test_greedy_final": 101}),
    }
    # a valid checksum over a wrong structure: every field that the sweep, the tables and the page read is checked
    kept = good["test_hypotheses"]
    for key, value in {"test": {"bleu": 30}, "chosen": {"valid_bleu": 30.0, "chosen_on": "validation",
                                                        "average_last": 1},
                       "settings": "x", "decodes": 5, "load_average": "xy", "final_valid_loss": "low",
                       "epochs_asked": "12", "curve": [{"epoch": 1}], "date": 5, "variant": ["baseline"]}.items():
        damaged[f"{key} "] = lambda key=key, value=value: write_checked_json(path, {**good, key: value})
    damaged["holds 2 test hypotheses per decoding where test2016 has"] = lambda: write_checked_json(
        path, {**good, "test_hypotheses": {name: hypotheses[:2] for name, hypotheses in kept.items()}})
    for expected, damage in damaged.items():
        damage()
        refused(["--summary", str(out)], str(path), expected)  # the table, too, stops at it in one line
        refused(quick, str(path), expected)  # and the sweep neither counts it as done nor runs over it
    write_checked_json(path, {**good, "test_greedy_final": 100.00000000000004})
    assert ablations.main(["--summary", str(out)]) == 0  # sacreBLEU's own rounding of a perfect score is a score
    capsys.readouterr()

    # two sweeps' records in one folder are not one table: "vs baseline" and p-values would compare across them
    changes = ablation_records.VARIANTS["pre-norm"][1]
    other = ablation_records.record_path(out, "pre-norm", 0)
    for key, value in {"preset": "multi30k-cpu", "train_limit": 500}.items():
        write_checked_json(other, {**good, "variant": "pre-norm", "changes": changes,
                                   "overrides": ablation_records.merge(good["overrides"], changes), key: value})
        refused(["--summary", str(out)], str(path), str(other), "are of two sweeps", f"{key} {value!r}")
        monkeypatch.setattr(ablations_page, "RECORDS", out)  # and the appendix reads them through the same reader
        refused_page = ablations_page.main(["--check"])
        err = capsys.readouterr().err.strip()
        assert refused_page == 1 and "\n" not in err and str(other) in err and "are of two sweeps" in err, err
    other.unlink()
    empty = tmp_path / "empty"
    empty.mkdir()
    refused(["--summary", str(empty)], str(empty), "holds no ablation records")


def test_a_log_is_never_written_through_a_link(tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n", encoding="utf-8")
    out = tmp_path / "abl"
    quick = ["--out", str(out), "--preset", "tiny", "--seeds", "0", "--variants", "baseline"]
    (out / "logs").mkdir(parents=True)
    (out / "logs" / "baseline-seed0.log").symlink_to(victim)
    assert ablations.main(quick) == 1  # refused before any run starts
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ablation log") and "symbolic link" in err and "\n" not in err, err
    (out / "logs" / "baseline-seed0.log").unlink()
    (out / "logs").rmdir()
    (out / "logs").symlink_to(tmp_path, target_is_directory=True)  # the folder of the logs itself a link
    assert ablations.main(quick) == 1
    err = capsys.readouterr().err.strip()
    assert str(out / "logs") in err and "is a link or a file" in err and "\n" not in err, err
    assert victim.read_text(encoding="utf-8") == "keep me\n" and sorted(p.name for p in tmp_path.iterdir()) == [
        "abl", "victim.txt"]


@pytest.mark.parametrize("overrides", ['{"model": 5}', '{"training": [1, 2]}', '{"model": {"d_model": [1]}}'])
def test_overrides_of_the_wrong_shape_are_one_line(tmp_path, capsys, overrides):
    assert ablations.main(["--out", str(tmp_path / "ab1"), "--preset", "tiny", "--overrides", overrides]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --overrides") and "\n" not in err and "Traceback" not in err, err


@pytest.mark.parametrize("argument, value", [("--train-limit", "-1000"), ("--epochs", "0"), ("--beam", "33"),
                                             ("--alpha", "nan"), ("--seeds", "-1"), ("--jobs", "0"),
                                             ("--stop-after", "inf"), ("--preset", "huge"),
                                             ("--work", "no-such-folder")])
def test_a_bad_argument_is_refused_naming_it(capsys, argument, value):
    with pytest.raises(SystemExit) as stop:
        ablations.main(["--out", "unused", argument, value])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and f"argument {argument}" in err and value in err, err


# ---- the appendix "What each choice is worth" ----


def test_the_appendix_was_made_from_the_records_in_the_repository():
    assert ablations_page.main(["--check"]) == 0, "run `python benchmarks/ablations_page.py` after adding a record"
    assert ablations_page.FIGURE.is_file()
    text = ablations_page.PAGE.read_text(encoding="utf-8")
    names = [m["name"] for m in ablations_page.BLOCK.finditer(text)]
    verdicts = {v for name in names if name.startswith("verdict") for v in name.split()[1:]}
    assert verdicts == set(ablation_records.VARIANTS) - {"baseline"}, "every variant has its sentences on the page"
    assert {"status", "runs", "summary", "reproduction", "schedule", "speed"} <= set(names)


def test_the_appendix_blocks_are_what_the_records_give():
    """Every block, made again from the records (with test2016's references for the bootstrap), is the page's."""
    if not (DATA / "multi30k" / "test.jsonl").is_file():
        pytest.skip(f"the offline Multi30k copy is not at {DATA}; with the Hub, run benchmarks/ablations_page.py")
    records = ablation_records.read_records(ablations_page.RECORDS)
    references = [en for _, en in data.load_pairs("multi30k", "test", "de", "en")]
    stats = ablation_tables.significance(records, references)
    judged = ablation_tables.judge(records, ablation_tables.sentence_noise(records, references))
    digest = ablations_page.records_digest()
    for match in ablations_page.BLOCK.finditer(ablations_page.PAGE.read_text(encoding="utf-8")):
        assert match["body"] == ablations_page.render(match["name"], records, stats, judged, digest), match["name"]


def run(variant: str, seed: int, bleu: float, valid: float | None = None) -> dict:
    """A made-up trained run: its test BLEU, and the validation BLEU of the decoding it chose."""
    return {"variant": variant, "seed": seed, "diverged": False, "test": {"bleu": bleu},
            "chosen": {"valid_bleu": bleu if valid is None else valid}}


def test_the_seeds_noise_is_pooled_over_variants_and_does_not_grow_with_the_seeds():
    """seed_noise pools each variant's gaps around its own mean gap: two variants of gaps (+1, +2) and (0, -1, +1)
    give squares 0.5 + 2 over 1 + 2 degrees of freedom; a run that never learned is left out; a spread (max - min)
    of the same gaps would grow with more seeds, this estimate's expectation does not."""
    base = [run("baseline", s, 37.0) for s in range(3)]
    records = base + [run("pre-norm", 0, 38.0), run("pre-norm", 1, 39.0),
                      run("rms-norm", 0, 37.0), run("rms-norm", 1, 36.0), run("rms-norm", 2, 38.0)]
    sd, freedom = ablation_tables.seed_noise(records)
    assert freedom == 3 and sd == pytest.approx(math.sqrt(2.5 / 3))
    assert ablation_tables.seed_noise(records + [run("no-warmup", 0, 0.5), run("no-warmup", 1, 30.0)]) == (
        sd, freedom)  # the seed that never learned leaves no-warmup one gap: nothing to pool
    assert ablation_tables.seed_noise(base + [run("pre-norm", 0, 38.0)]) == (None, 0)
    # Made-up gaps of a null effect with a seed sd of 1: the mean of the pooled variance stays near 1 for 2 or 6
    # seeds a variant, where the mean spread grows (about 1.13 and 2.53 for normal draws)
    rng = random.Random(0)
    for seeds, spread in ((2, 1.13), (6, 2.53)):
        variances, spreads = [], []
        for _ in range(2000):
            draws = [rng.gauss(0, 1) for _ in range(seeds)]
            made_up = [run("baseline", s, 37.0) for s in range(seeds)] + [
                run("pre-norm", s, 37.0 + d) for s, d in enumerate(draws)]
            variances.append(ablation_tables.seed_noise(made_up)[0] ** 2)
            spreads.append(max(draws) - min(draws))
        # 2,000 draws: the mean variance's standard error is at most sqrt(2 / 2000) = 0.032; four of them
        assert abs(sum(variances) / len(variances) - 1) < 0.13
        assert abs(sum(spreads) / len(spreads) - spread) < 0.1


def test_holm_adjusts_over_the_whole_family_run_or_not():
    adjusted = ablation_tables.holm({"a": 0.01, "b": 0.04, "c": 0.03}, family_size=5)
    assert adjusted == pytest.approx({"a": 0.05, "c": 0.12, "b": 0.12})  # 5 x 0.01; 4 x 0.03; max(3 x 0.04, 0.12)
    assert ablation_tables.holm({"a": 0.5}, family_size=3) == {"a": 1.0}
    with pytest.raises(ValueError, match="family_size must count every comparison"):
        ablation_tables.holm({"a": 0.1, "b": 0.2}, family_size=1)


def test_the_mean_gap_is_judged_against_the_sentences_and_the_seeds_noise_together():
    base = [run("baseline", s, 37.0) for s in range(3)]
    records = base + [run("pre-norm", 0, 38.0), run("pre-norm", 1, 39.0)]  # gaps +1, +2: a seed sd of 0.71, 1 df
    noise = {"pre-norm": {"gap": 1.5, "seeds": [0, 1], "se": 0.3, "p_value": 0.0}}
    j = ablation_tables.judge(records, noise)["pre-norm"]
    se = math.sqrt(0.3 ** 2 + 0.5 / 2)  # the sentences' variance and the seeds' (0.5, over 2 seeds)
    assert j["se"] == pytest.approx(se) and j["freedom"] == 1
    assert j["p_value"] == pytest.approx(1 - 2 * math.atan(1.5 / se) / math.pi)  # Student's t with 1 df: Cauchy
    family = len(ablation_records.VARIANTS) - 1
    assert j["family"] == family and j["holm"] == pytest.approx(min(1, family * j["p_value"]))
    alone = ablation_tables.judge(base + [run("pre-norm", 0, 38.0)], {**noise, "pre-norm": {**noise["pre-norm"],
                                                                                             "seeds": [0]}})
    assert not alone["pre-norm"]["seeds_measured"] and alone["pre-norm"]["se"] == pytest.approx(0.3)


def test_the_verdict_follows_the_declared_method():
    def said(records: list[dict], sentences_se: float = 0.3, variant: str = "pre-norm") -> str:
        stats = {(r["variant"], r["seed"]): {"mean": r["test"]["bleu"], "ci": 1.5, "p_value": 0.01} for r in records}
        noise = {v: {"gap": sum(g) / len(g), "seeds": sorted(ablation_tables.gaps(records, v)), "se": sentences_se,
                     "p_value": 0.01}
                 for v in {r["variant"] for r in records} - {"baseline"}
                 if (g := list(ablation_tables.gaps(records, v).values()))}
        return ablations_page.verdict(variant, records, stats, ablation_tables.judge(records, noise))

    base = [run("baseline", s, 37.0) for s in range(3)]
    one_seed = base + [run("pre-norm", 0, 35.0)]
    assert "the seeds' noise is not measured yet" in said(one_seed) and "Beyond" not in said(one_seed)
    pooled = base + [run("rms-norm", 0, 37.2), run("rms-norm", 1, 36.8)]  # gaps +0.2, -0.2: a seed sd of 0.28
    far = pooled + [run("pre-norm", 0, 25.0), run("pre-norm", 1, 25.5)]
    assert said(far).endswith(" Beyond the noise.") and "Every seed's gap points the same way." in said(far)
    assert "-11.75, has a standard error of" in said(far)
    near = pooled + [run("pre-norm", 0, 37.6), run("pre-norm", 1, 37.2)]  # +0.4 on average: within either noise
    assert said(near).endswith(" Within the noise: these runs cannot tell it from the baseline.")
    both_ways = pooled + [run("pre-norm", 0, 36.0), run("pre-norm", 1, 38.5)]
    assert "The seeds' gaps point opposite ways." in said(both_ways)
    assert ablations_page._seeds([0, 1, 2]) == "seeds 0, 1 and 2"
    assert ablations_page._p(0.0004) == "< 0.001" and ablations_page._p(0.0123) == "= 0.012"
    assert ablations_page.verdict("dropout-0.3", base, {}, {}) == "*dropout-0.3*: not run yet."
    curve = [{"train_loss": 6.27}]
    stuck = [{**base[0], "curve": [{"train_loss": 2.41}]}, {**run("pre-norm", 0, 0.01), "curve": curve}]
    assert "never learned to translate, its training loss ending at 6.27 against the baseline's 2.41" in said(stuck)


def test_the_seed_plan_is_decided_on_validation():
    records = [run("baseline", 0, 37.0, valid=39.0), run("dropout-0.3", 0, 15.0, valid=33.9),
               run("untied-output", 0, 30.0, valid=34.1)]  # its test gap is large; its validation gap is not
    assert ablations_page.planned_seeds("dropout-0.3", records) == (0,)  # 5.1 from the baseline on validation
    assert ablations_page.planned_seeds("untied-output", records) == (0, 1)  # 4.9: a second seed, whatever the test
    assert ablations_page.planned_seeds("swiglu", records) == (0, 1)  # not run yet
    assert ablations_page.planned_seeds("block-2026", records) == (0, 1, 2)  # declared
    diverged = {"variant": "no-warmup", "seed": 0, "diverged": True, "error": "loss nan at step 12"}
    assert ablations_page.planned_seeds("no-warmup", records + [diverged]) == (0,)


def test_the_schedule_block_and_a_diverged_run_are_told_from_the_records():
    seeds = [run("baseline", s, 37.0) for s in range(3)]

    def with_warmup(variant: str, warmup: int) -> dict:  # d_model 16, lr_factor 1: a peak of 16**-0.5 * 16**-0.5
        settings = {"model": {"d_model": 16}, "training": {"warmup": warmup, "lr_factor": 1.0}}
        return {**run(variant, 0, 30.0), "settings": settings}

    assert ablations_page.schedule_block([with_warmup("baseline", 16), with_warmup("no-warmup", 1)]) == (
        r"Here the warm-up climbs for 16 steps to a peak of $6.2 \times 10^{-2}$. Without it (warmup = 1 in the "
        r"formula) the decay starts at the first step, from $2.5 \times 10^{-1}$: 4 times the warm-up's peak, still "
        "2.0 times it at step 4, and the same rate as the baseline's from step 16 on.\n")
    assert "come with the first baseline" in ablations_page.schedule_block(seeds)
    diverged = seeds[:1] + seeds[2:] + [{"variant": "pre-norm", "seed": 0, "diverged": True, "error": "loss nan at step 12"}]
    assert "seed 0 diverged (loss nan at step 12)" in ablations_page.verdict("pre-norm", diverged, {}, {})


def test_time_to_baseline_finds_the_first_epoch_at_or_above_the_baselines_final_validation_bleu():
    def run(variant: str, seed: int, bleus: list[float], diverged: bool = False) -> dict:
        curve = [{"epoch": e, "step": 100 * e, "minutes": 2.0 * e, "valid_bleu": b} for e, b in enumerate(bleus, 1)]
        return {"variant": variant, "seed": seed, "diverged": diverged, "curve": curve, "epochs": len(bleus)}

    records = [run("baseline", 0, [10.0, 20.0, 30.0, 35.0]), run("pre-norm", 0, [15.0, 36.0, 35.5, 37.0]),
               run("dropout-0.3", 0, [5.0, 10.0, 20.0, 34.9]), run("untied-output", 1, [40.0]),
               run("no-warmup", 0, [1.0], diverged=True)]
    found = ablation_tables.time_to_baseline(records)
    assert found["baseline", 0]["epoch"] == 4  # its own last epoch
    assert found["pre-norm", 0] == {"epoch": 2, "step": 200, "minutes": 4.0, "target": 35.0}  # the first, not the best
    assert found["dropout-0.3", 0] is None  # 34.9 < 35.0: never
    assert ("untied-output", 1) not in found and ("no-warmup", 0) not in found  # no baseline of seed 1; diverged
    block = ablations_page.speed_block(records)
    assert "| pre-norm | 0 | 35.00 | 2 of 4 | 200 | 8.0 |" not in block  # minutes are the curve's, 4.0
    assert "| pre-norm | 0 | 35.00 | 2 of 4 | 200 | 4.0 |" in block and "| dropout-0.3 | 0 | 35.00 | not reached |" in block
