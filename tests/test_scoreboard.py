"""The scoreboard (transformer_lib.scoreboard), decoding.json (runs.write_decoding) and the command line's use of them."""

import inspect
import json
import math
import os

import pytest

from test_cli import DATA, ROOT, cli, fake_run, one_error_line, run_main
import transformer_lib as tl
from transformer_lib import cli as cli_module
from transformer_lib import checkpoint_checks, runs, split_decoding
from transformer_lib.files import read_checked_json, write_checked_json
from transformer_lib.scoreboard import (
    COLUMNS,
    METRICS,
    TUTORIAL_COLUMN,
    TUTORIAL_ROWS,
    read_scoreboard,
    scoreboard_record,
    scoreboard_table,
    write_scoreboard,
)

SIGNATURES = {"bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.0",
              "chrf_signature": "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.4.0"}
TEST = {"bleu": 37.1, "chrf": 60.2, "sentences": 1000, "bp": 0.985, "ratio": 0.985, "hyp_len": 12000,
        "ref_len": 12180, "bleu_line": "BLEU = 37.10 ...", **SIGNATURES}
VALIDATION = {"bleu": 38.1, "chrf": 61.0, "sentences": 1014, **SIGNATURES}
DECODING = {"beam_size": 4, "alpha": 1.0, "average_last": 2}


def record(**change):
    arguments = dict(preset="multi30k-cpu", device="cpu", training_minutes=33.3, steps=3187, validation=VALIDATION,
                     test=TEST, decoding=DECODING, weights="the average of epochs 2-3", chosen_on="validation")
    return scoreboard_record(**{**arguments, **change})


# ---- records ----


def test_a_record_round_trips_and_keeps_every_score_key(tmp_path):
    first = record(test_lowercase_tokenized_bleu=39.0, code_hash="abc123", notes="trial")
    assert first["test"] == TEST and first["validation"] == VALIDATION  # bp, ratio, bleu_line...: kept
    assert first["device_name"] and first["cores"] == os.cpu_count() and first["chosen_on"] == "validation"
    second = record(preset="multi30k", validation=None)
    paths = [write_scoreboard(r, tmp_path / "scoreboard") for r in (second, first)]
    assert [p.name for p in paths] == ["multi30k-cpu.json", "multi30k-cpu-cpu.json"]
    json.loads(paths[0].read_text(encoding="utf-8"))  # strict JSON
    assert read_scoreboard(tmp_path / "scoreboard") == [second, first]  # sorted by preset
    assert not list((tmp_path / "scoreboard").glob(".*.tmp"))


def test_a_float16_run_has_a_record_of_its_own_beside_the_devices_own_precision(tmp_path):
    own, fp16 = record(), record(precision="fp16")  # a T4's path, or a newer GPU with it forced
    assert "precision" not in own and fp16["precision"] == "fp16"
    paths = [write_scoreboard(r, tmp_path) for r in (fp16, own)]
    assert [p.name for p in paths] == ["multi30k-cpu-cpu-fp16.json", "multi30k-cpu-cpu.json"]  # neither replaces
    assert read_scoreboard(tmp_path) == [own, fp16]
    trained = list(scoreboard_table([own, fp16], tutorials=())["trained"])
    assert trained[0].startswith("cpu, ") and trained[1].startswith("cpu (fp16, GradScaler), ")
    with pytest.raises(ValueError, match=r"precision must be None .* or one of 'fp16', got 'int8'"):
        record(precision="int8")
    write_checked_json(tmp_path / paths[0].name, {**fp16, "precision": None})
    with pytest.raises(ValueError, match="precision, when present, must not be None"):
        read_scoreboard(tmp_path)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(chosen_on="test"), "chosen_on must be 'validation', got 'test': decoding settings are chosen on the "
                                 "validation split"),
        (dict(test={"bleu": 30.0, "chrf": 50.0}), "test lacks bleu_signature, chrf_signature"),
        (dict(validation=[30.0]), "validation must be a dict of scores"),
        (dict(test={**TEST, "bleu": "37"}), "test: bleu must be a number from 0 to 100, got '37'"),
        (dict(steps=True), "steps must be an integer from 1 to 1e+10"),
        (dict(steps=0), "steps must be an integer from 1 to 1e+10"),
        (dict(steps=10**11), "steps must be an integer from 1 to 1e+10"),
        (dict(training_minutes=float("nan")), "training_minutes must be a number of minutes above 0 and at most a year"),
        (dict(training_minutes=1e308), "training_minutes must be a number of minutes above 0 and at most a year"),
        (dict(device="gpu"), "device must be 'cpu' or 'cuda' (where the run trained), got 'gpu'"),
        (dict(preset="../x"), "preset must be a preset's name"),
        (dict(decoding={"beam_size": 4, "alpha": 1.0}), "decoding must hold exactly beam_size, alpha, average_last; "
                                                        "it lacks average_last"),
        (dict(decoding={**DECODING, "beam_size": 0}), "decoding: beam_size must be an integer from 1"),
        (dict(decoding={**DECODING, "lenght": 1}), "'lenght' is not a decoding setting"),
        (dict(notes=3), "notes must be a string or None"),
        (dict(weights="the average of epochs 1-3"), "weights must name the weights decoded, 'the average of epochs "
                                                    "a-b' with 2 epochs (decoding's average_last), got 'the average of "
                                                    "epochs 1-3'"),  # which epochs, and as many as decoding says
        (dict(weights="the final weights (step 3,187)"), "with 2 epochs (decoding's average_last)"),
        (dict(decoding={**DECODING, "average_last": 1}), "'the final weights (step N)', got 'the average of epochs"),
        (dict(weights=None), "weights must name the weights decoded"),
        (dict(test_lowercase_tokenized_bleu=101), "test_lowercase_tokenized_bleu must be a number from 0 to 100"),
        (dict(test_tutorial_bleu="36"), "test_tutorial_bleu must be a number from 0 to 100"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(change, message):
    with pytest.raises(ValueError) as error:
        record(**change)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_record_is_read_back_only_with_facts_a_machine_could_have_made(tmp_path):
    folder = tmp_path / "scoreboard"
    path = write_scoreboard(record(), folder)
    made = read_checked_json(path, "record", "the test")
    for change, message in [({"cores": 10**9}, "cores must be an integer from 1 to 65536"),
                            ({"training_minutes": 1e308}, "at most a year"),
                            ({"date": "yesterday"}, "date must be the ISO date"),
                            ({"torch": ""}, "torch must be a non-empty string"),
                            ({"test": {**made["test"], "bleu": 100.1}}, "bleu must be a number from 0 to 100")]:
        write_checked_json(path, {**made, **change})
        with pytest.raises(ValueError, match=message):
            read_scoreboard(folder)
    perfect = {**made["test"], "bleu": 100.00000000000004}  # what sacreBLEU returns for a perfect translation
    write_checked_json(path, {**made, "test": perfect})
    assert read_scoreboard(folder)[0]["test"]["bleu"] == perfect["bleu"]


def test_a_malformed_or_misnamed_scoreboard_file_is_named(tmp_path):
    folder = tmp_path / "scoreboard"
    path = write_scoreboard(record(), folder)
    path.write_text('{"preset": ', encoding="utf-8")
    with pytest.raises(ValueError, match=r"multi30k-cpu-cpu.json' is not valid JSON \(line 1"):
        read_scoreboard(folder)
    broken = {**record(), "chosen_on": "test"}
    write_checked_json(path, broken)
    with pytest.raises(ValueError, match="multi30k-cpu-cpu.json': chosen_on must be 'validation'"):
        read_scoreboard(folder)
    path.unlink()
    write_checked_json(folder / "other.json", record())
    with pytest.raises(ValueError, match="belongs in multi30k-cpu-cpu.json; rename it"):
        read_scoreboard(folder)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_scoreboard(tmp_path / "nowhere")


def test_a_scoreboard_folder_or_file_that_is_a_link_is_never_written_through(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(ValueError, match="is a symbolic link"):
        write_scoreboard(record(), tmp_path / "link")
    (real / "multi30k-cpu-cpu.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(ValueError, match="is a symbolic link"):
        write_scoreboard(record(), real)
    assert not (tmp_path / "elsewhere.json").exists()


# ---- the table ----


def test_the_table_has_one_row_per_record_then_the_tutorials_in_the_column_of_their_metric():
    records = [record(test_tutorial_bleu=35.1, notes="test2016 was scored twice"),
               record(preset="multi30k", validation=None, test={k: v for k, v in TEST.items() if k != "bp"})]
    table = scoreboard_table(records)
    assert list(table.columns) == list(COLUMNS) and len(table) == len(records) + len(TUTORIAL_ROWS)
    assert len(COLUMNS) <= 7 and set(METRICS) <= set(COLUMNS)  # a table that fits the page, its metrics named
    for (_, row), r in zip(table.iterrows(), records):
        assert row["system"] == f"transformer_lib {r['preset']}"
        assert row["trained"] == f"cpu, {r['device_name']} ({r['cores']} cores): 33.3 min, 3,187 steps"
        assert row["test BLEU"] == r["test"]["bleu"] and row["test chrF"] == r["test"]["chrf"]
        assert row["decoding"] == "beam 4, alpha 1.0, the average of epochs 2-3"  # alpha as the chapter writes it
    assert table["validation BLEU"].iloc[0] == 38.1 and math.isnan(table["validation BLEU"].iloc[1])
    assert table[TUTORIAL_COLUMN].iloc[0] == 35.1 and math.isnan(table[TUTORIAL_COLUMN].iloc[1])  # without spaCy
    trevett = table.iloc[-1]
    assert trevett[TUTORIAL_COLUMN] == 36.52 and math.isnan(trevett["test BLEU"]) and math.isnan(trevett["test chrF"])
    assert trevett["decoding"].startswith("greedy")
    assert "36.52" in table.to_html(index=False) and "Attention is All You Need" in table.to_html(index=False)
    assert len(scoreboard_table([], tutorials=())) == 0
    with pytest.raises(ValueError, match="must name its system and its reference"):
        scoreboard_table([], tutorials=({"system": "x", "metric": "y"},))


def test_the_tutorials_score_is_kept_only_where_it_was_measured(tmp_path):
    measured, without = record(test_tutorial_bleu=35.14), record(preset="multi30k")
    assert measured["test_tutorial_bleu"] == 35.14 and "test_tutorial_bleu" not in without
    write_scoreboard(measured, tmp_path)
    write_scoreboard(without, tmp_path)
    assert read_scoreboard(tmp_path) == [without, measured]
    path = tmp_path / "multi30k-cpu-cpu.json"
    write_checked_json(path, {**measured, "test_tutorial_bleu": None})
    with pytest.raises(ValueError, match="test_tutorial_bleu, when present, must not be None"):
        read_scoreboard(tmp_path)


def test_the_notes_may_disclose_every_look_at_the_test_set():
    looks = ("test2016 was scored for three successive recipes of this preset: 8 epochs (34.53), 10 epochs (36.67) "
             "and 12 epochs (this record)")
    assert record(notes=looks)["notes"] == looks


def test_the_tutorials_key_is_in_the_bibliography():
    bib = (ROOT / "book" / "references.bib").read_text(encoding="utf-8")
    for row in TUTORIAL_ROWS:
        assert f"{{{row['reference']}," in bib


# ---- decoding.json ----


def run_id(run) -> str:
    return runs.read_run_record(run / "checkpoint.pt")["run"]["id"]


def test_decoding_json_round_trips_and_refuses_the_test_split(tmp_path):
    run = fake_run(tmp_path)
    assert runs.read_decoding(run, run_id(run)) is None
    path = runs.write_decoding(run, DECODING, "validation", weights="the average of epochs 2-3", validation=VALIDATION)
    assert path == run / "decoding.json"
    saved = runs.read_decoding(run, run_id(run))
    assert {k: saved[k] for k in DECODING} == DECODING and saved["chosen_on"] == "validation"
    assert saved["validation"] == VALIDATION and len(saved["date"]) == 10
    assert saved["weights"] == "the average of epochs 2-3" and saved["run_id"] == run_id(run)
    written = read_checked_json(path, "record", "the test")  # the file itself carries the run's id and the weights
    assert written["run_id"] == run_id(run) and written["weights"] == "the average of epochs 2-3"
    with pytest.raises(ValueError, match="chosen_on must be 'validation', got 'test'"):
        runs.write_decoding(run, DECODING, "test", weights="the average of epochs 2-3")
    with pytest.raises(ValueError, match="alpha must be a number from 0"):
        runs.write_decoding(run, {**DECODING, "alpha": -1}, "validation", weights="the average of epochs 2-3")
    with pytest.raises(ValueError, match="weights must name the weights decoded"):
        runs.write_decoding(run, DECODING, "validation", weights="")
    assert read_checked_json(path, "record", "the test") == written  # a refused write leaves the file as it was
    write_checked_json(path, {"beam_size": 4})
    with pytest.raises(ValueError, match="decoding.json' must hold exactly beam_size, alpha, average_last"):
        runs.read_decoding(run, run_id(run))
    path.write_text("[", encoding="utf-8")
    with pytest.raises(ValueError, match=r"decoding.json' is not valid JSON \(line 1"):
        runs.read_decoding(run, run_id(run))


def test_a_signed_decoding_json_with_an_absurd_average_last_is_one_line(tmp_path):
    # load_translator listed every epoch it asked for: 10**18 of them was a MemoryError, called a bug
    run = fake_run(tmp_path)
    path = runs.write_decoding(run, DECODING, "validation", weights="the average of epochs 2-3")
    huge = 10**18
    write_checked_json(path, {**read_checked_json(path, "record", "the test"), "average_last": huge,
                              "weights": f"the average of epochs 1-{huge}"})  # a valid checksum
    expected = f"decoding file '{path}': average_last must be an integer from 1 (the final weights) to 1,000"
    for read in (lambda: runs.read_decoding(run, run_id(run)), lambda: tl.load_translator(run, "cpu")):
        with pytest.raises(ValueError) as refused:
            read()
        assert str(refused.value).startswith(expected) and "\n" not in str(refused.value)


def test_decoding_json_of_another_run_or_lacking_its_keys_is_refused_in_one_line(tmp_path):
    """A decoding chosen for one run is never used for another: the run id of the folder's checkpoint must be the one
    decoding.json was written for, and a decoding.json without its run id, weights, split or date is refused."""
    mine, other = fake_run(tmp_path / "mine"), fake_run(tmp_path / "other")
    assert run_id(mine) != run_id(other)
    path = runs.write_decoding(other, DECODING, "validation", weights="the average of epochs 2-3")
    (mine / "decoding.json").write_bytes(path.read_bytes())  # copied in from the other run
    message = f"decoding file '{mine / 'decoding.json'}' was chosen for another run (run {run_id(other)}, and this " \
              f"folder's checkpoint is run {run_id(mine)})"
    with pytest.raises(ValueError) as refused:
        runs.read_decoding(mine, run_id(mine))
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)
    with pytest.raises(ValueError, match="was chosen for another run"):
        tl.decoding_settings(mine)  # so translate, evaluate and load_translator refuse it too
    with pytest.raises(ValueError, match="was chosen for another run"):
        tl.load_translator(mine, "cpu")
    record = read_checked_json(path, "record", "the test")
    for key in ("run_id", "weights", "chosen_on", "date"):
        write_checked_json(mine / "decoding.json", {k: v for k, v in record.items() if k != key})
        with pytest.raises(ValueError, match=f"decoding.json' lacks {key}; choose again on validation"):
            runs.read_decoding(mine, run_id(mine))
    write_checked_json(mine / "decoding.json", {**record, "run_id": ""})
    with pytest.raises(ValueError, match="run_id must be a non-empty string, got ''"):
        runs.read_decoding(mine, run_id(mine))


def test_write_decoding_needs_the_checkpoint_of_the_run_it_is_for(tmp_path):
    (tmp_path / "run").mkdir()
    with pytest.raises(FileNotFoundError):
        runs.write_decoding(tmp_path / "run", DECODING, "validation", weights="the average of epochs 2-3")
    assert not (tmp_path / "run" / "decoding.json").exists()


def test_decoding_json_is_a_run_file_that_overwrite_removes(tmp_path):
    run = fake_run(tmp_path)
    runs.write_decoding(run, DECODING, "validation", weights="the average of epochs 2-3")
    (run / "checkpoint.pt").unlink()
    with pytest.raises(FileExistsError, match="holds decoding.json but no checkpoint.pt: its checkpoint.pt was removed"):
        runs.check_run_folder(run, resume=False, overwrite=False)
    (run / "checkpoint.pt").write_bytes(b"a run")
    with pytest.raises(FileExistsError, match=r"already holds a run \(checkpoint.pt, decoding.json\)"):
        runs.check_run_folder(run, resume=False, overwrite=False)
    runs.start_run_folder(run, overwrite=True)
    assert list(run.iterdir()) == []


# ---- the command line ----


def test_the_last_logged_loss_says_how_many_steps_it_is_the_mean_of():
    assert runs.last_loss([]) == "no loss logged"
    assert runs.last_loss([(10, 3.1, 10), (13, 2.95, 3)]) == "last logged loss 2.950 (mean of 3 steps)"
    assert runs.last_loss([[1, 2.0, 1]]) == "last logged loss 2.000 (mean of 1 step)"


def args_for(*argv):
    return cli_module.build_parser().parse_args(["train", "--out", "x", *argv])


@pytest.mark.parametrize(
    "argv, expected",
    [
        ([], {}),
        (["--train-limit", "30"], {"valid_limit": 30}),
        (["--train-limit", "30", "--valid-limit", "100"], {"valid_limit": 100}),
        (["--valid-limit", "100"], {"valid_limit": 100}),
        (["--train-limit", "30", "--no-validation"], {"validate": False}),
    ],
)
def test_validation_options_reach_train_translator(monkeypatch, argv, expected):
    def train_translator(out_dir, valid_limit=None, validate=True):  # the parameters the command line passes
        pass

    monkeypatch.setattr(cli_module, "train_translator", train_translator)
    assert cli_module._validation_arguments(args_for(*argv)) == expected


def test_a_validation_limit_without_validation_is_a_usage_error(capsys):
    code, _, err = run_main(capsys, "train", "--out", "x", "--valid-limit", "5", "--no-validation")
    assert code == 2 and "not allowed with argument" in err


def test_train_translator_accepts_the_validation_options():
    parameters = inspect.signature(cli_module.train_translator).parameters
    assert parameters["valid_limit"].default is None and parameters["validate"].default is True


def test_decoding_comes_from_decoding_json_then_the_settings_then_the_defaults(tmp_path, capsys, monkeypatch):
    seen = []
    monkeypatch.setattr(split_decoding, "translate", lambda model, tokenizer, sentences, beam_size, alpha, **options:
                        seen.append((beam_size, alpha)) or ["a dog"] * len(sentences))  # the command line's decoder
    run = fake_run(tmp_path)  # a run record whose settings have no decoding part
    code, _, err = run_main(capsys, "translate", "--checkpoint", str(run), "Ein Hund.")
    assert code == 0 and seen[-1] == (4, 0.6) and "note: decoding with beam 4 and alpha 0.6, from the defaults" in err
    assert "with the final weights (step 1,234)" in err
    runs.write_decoding(run, {"beam_size": 2, "alpha": 1.5, "average_last": 1}, "validation",
                        weights="the final weights (step 1,234)")
    code, _, err = run_main(capsys, "translate", "--checkpoint", str(run / "checkpoint.pt"), "Ein Hund.")
    assert code == 0 and seen[-1] == (2, 1.5)
    assert f"from {run / 'decoding.json'} (chosen on the validation split), with the final weights (step 1,234)" in err
    code, _, err = run_main(capsys, "translate", "--checkpoint", str(run), "--beam", "3", "Ein Hund.")
    assert code == 0 and seen[-1] == (3, 1.5) and "beam 3 (--beam) and alpha 1.5 (from" in err
    code, _, err = run_main(capsys, "translate", "--checkpoint", str(run), "--beam", "3", "--alpha", "0", "Ein Hund.")
    assert code == 0 and seen[-1] == (3, 0.0) and "note:" not in err
    write_checked_json(run / "decoding.json", {})
    code, _, err = run_main(capsys, "translate", "--checkpoint", str(run), "Ein Hund.")
    assert code == 1 and "decoding.json' must hold exactly" in one_error_line(err)


def test_decoding_from_the_runs_settings(tmp_path, capsys, monkeypatch):
    seen = []
    monkeypatch.setattr(split_decoding, "translate", lambda model, tokenizer, sentences, beam_size, alpha, **options:
                        seen.append((beam_size, alpha)) or ["a dog"] * len(sentences))  # the command line's decoder
    run = fake_run(tmp_path, decoding={"beam_size": 5, "alpha": 0.8, "average_last": 1})
    code, _, err = run_main(capsys, "translate", "--checkpoint", str(run), "Ein Hund.")
    assert code == 0 and seen[-1] == (5, 0.8)
    assert "from the run's settings (settings['decoding']), with the final weights (step 1,234)" in err


def test_a_recorded_average_the_folder_cannot_provide_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    """The run's settings average the last 3 epochs, and the folder keeps none of their weights (only checkpoint.pt
    was copied): translate refuses in one line and decodes nothing, never with the final weights instead."""
    seen = []
    monkeypatch.setattr(split_decoding, "translate", lambda *args, **kwargs: seen.append(kwargs) or ["a dog"])
    run = fake_run(tmp_path, decoding={"beam_size": 5, "alpha": 0.8, "average_last": 3})
    code, out, err = run_main(capsys, "translate", "--checkpoint", str(run), "Ein Hund.")
    line = one_error_line(err)
    assert code == 1 and out == "" and seen == [] and "note:" not in err
    assert line.startswith("error: average_last=3 averages the weights of the run's last 3 epochs, but the run finished "
                           f"3 epochs and {run} keeps those of epochs none")


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--split", "validation"], "--scoreboard records a run's score on the test split, so it goes with --split test"),
        (["--split", "test", "--beam", "2"], "so --beam, --alpha and --max-len would not be what it records"),
    ],
)
def test_evaluate_scoreboard_refuses_what_it_would_not_record(tmp_path, capsys, extra, message):
    code, _, err = run_main(capsys, "evaluate", "--checkpoint", str(tmp_path), "--scoreboard", str(tmp_path / "s"),
                            *extra)
    assert code == 2 and message in err


def test_evaluate_scoreboard_writes_the_runs_record(tmp_path):
    if not (DATA / "multi30k" / "train.jsonl").is_file():
        pytest.skip(f"the offline Multi30k copy is not at {DATA}")
    run, board = tmp_path / "run", tmp_path / "scoreboard"
    result = cli("train", "--preset", "tiny", "--train-limit", "600", "--epochs", "1", "--out", str(run),
                 "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "last logged loss" in result.stdout
    # Without decoding.json there is no decoding chosen on this run's validation split (the preset's was chosen on
    # another run's, the defaults on none): nothing is recorded.
    result = cli("evaluate", "--checkpoint", str(run), "--split", "test", "--scoreboard", str(board))
    assert result.returncode == 1 and not board.exists()
    assert f"{run} has no decoding.json (it would decode with " in result.stderr and "choose it first" in result.stderr
    runs.write_decoding(run, {"beam_size": 1, "alpha": 0.6, "average_last": 1}, "validation", validation=VALIDATION,
                        weights="the final weights")
    result = cli("evaluate", "--checkpoint", str(run), "--split", "test", "--scoreboard", str(board))
    assert result.returncode == 0, result.stderr
    assert "replacing" not in result.stdout
    assert "note: decoding with beam 1 and alpha 0.6, from" in result.stderr
    assert f"scoreboard record written to {board / 'tiny-cpu.json'}" in result.stdout
    [saved] = read_scoreboard(board)
    history = json.loads((run / "history.json").read_text(encoding="utf-8"))
    assert saved["preset"] == "tiny" and saved["device"] == "cpu" and saved["chosen_on"] == "validation"
    assert saved["training_minutes"] == history["epochs"][-1]["minutes"]
    assert saved["steps"] == history["epochs"][-1]["step"] and saved["validation"] == VALIDATION
    assert saved["weights"] == f"the final weights (step {saved['steps']:,})"  # named, not only counted
    assert saved["test"]["sentences"] == 1000 and f"BLEU = {saved['test']['bleu']:.2f}" in result.stdout
    assert saved["notes"] == "trained on the first 600 pairs only" and "precision" not in saved

    # A run trained in float16 keeps its GradScaler's state in the checkpoint: its record gets a file of its own.
    import torch

    checkpoint = torch.load(run / "checkpoint.pt", weights_only=True)
    checkpoint["scaler"] = {"scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000,
                            "_growth_tracker": 0}  # what GradScaler.state_dict() holds
    checkpoint["checksum"] = checkpoint_checks.weights_checksum(checkpoint)  # as save_checkpoint would have written it
    torch.save(checkpoint, run / "checkpoint.pt")
    result = cli("evaluate", "--checkpoint", str(run), "--split", "test", "--scoreboard", str(board))
    assert result.returncode == 0, result.stderr
    assert f"scoreboard record written to {board / 'tiny-cpu-fp16.json'}" in result.stdout
    assert [r.get("precision") for r in read_scoreboard(board)] == [None, "fp16"]
    # The same preset on the same device again: the new record replaces the old one, and says which
    result = cli("evaluate", "--checkpoint", str(run), "--split", "test", "--scoreboard", str(board))
    assert result.returncode == 0, result.stderr
    assert (f"written to {board / 'tiny-cpu-fp16.json'}, replacing the record of {saved['date']} (test BLEU "
            f"{saved['test']['bleu']:.2f}, ") in result.stdout


def test_a_decoding_file_whose_weights_disagree_with_its_average_last_is_refused(tmp_path):
    """"the average of epochs 2-3" with average_last 1 would decode the final weights under the averaged ones' name:
    refused on writing and, re-checksummed by hand, on reading."""
    run = fake_run(tmp_path / "run")
    with pytest.raises(ValueError, match="weights must name the weights decoded, 'the final weights"):
        runs.write_decoding(run, {**DECODING, "average_last": 1}, "validation", weights="the average of epochs 2-3")
    path = runs.write_decoding(run, DECODING, "validation", weights="the average of epochs 2-3")
    record = {k: v for k, v in json.loads(path.read_text(encoding="utf-8")).items() if k != "sha256"}
    write_checked_json(path, {**record, "average_last": 1})
    with pytest.raises(ValueError, match=r"decoding file .*: weights must name the weights decoded, 'the final"):
        runs.read_decoding(run, run_id(run))


def test_an_evidence_file_changed_after_it_was_written_is_refused_by_its_checksum(tmp_path):
    """A flipped byte that still reads as a valid value (alpha 1.0 become 1.5, a BLEU of 37.5 become 97.5) passes
    every range check; the sha256 each evidence file carries of its own content refuses it, naming the file."""
    run = fake_run(tmp_path / "run")
    decoding = runs.write_decoding(run, {**DECODING, "alpha": 1.0}, "validation", weights="the average of epochs 2-3")
    scoreboard = write_scoreboard(record(), tmp_path / "scoreboard")
    for path, old, new, read in [
        (decoding, '"alpha": 1.0', '"alpha": 1.5', lambda: runs.read_decoding(run, run_id(run))),
        (scoreboard, '"steps": ', '"steps": 1', lambda: read_scoreboard(tmp_path / "scoreboard")),
    ]:
        read()  # as written, it reads
        text = path.read_text(encoding="utf-8")
        assert old in text
        path.write_text(text.replace(old, new, 1), encoding="utf-8")
        with pytest.raises(ValueError) as refused:
            read()
        assert f"{str(path)!r} fails its sha256 checksum" in str(refused.value) and "\n" not in str(refused.value)
        without = {k: v for k, v in json.loads(text).items() if k != "sha256"}
        path.write_text(json.dumps(without), encoding="utf-8")  # the checksum removed: refused too, not trusted
        with pytest.raises(ValueError, match="has no 'sha256' checksum"):
            read()
    with pytest.raises(ValueError, match="without a 'sha256' key"):
        write_checked_json(tmp_path / "x.json", {"sha256": "mine"})  # the writer adds it; a caller cannot


def test_the_stored_evidence_files_pass_their_checksums():
    """Every record the book reads (scoreboard, ablations, recipe reports) is as its writer left it."""
    results = ROOT / "benchmarks" / "results"
    paths = [*(results / "scoreboard").glob("*.json"), *(results / "recipe").glob("*.json"),
             *(results / "ablations").glob("*/*-seed*.json")]
    assert len(paths) >= 4
    for path in paths:
        read_checked_json(path, "evidence file", "its writer")
