"""benchmarks/recipe_trial.py: a recipe trial on the validation split. Its reports are measured by hand; here its
doors are checked, in seconds and without training: what --json may replace and what --config may hold."""

import shutil
from pathlib import Path

import pytest

from transformer_lib.files import write_checked_json

import ablations_page
import recipe_trial

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "benchmarks" / "results" / "recipe" / "multi30k-cpu-10-epochs.json"


def refused(capsys, argv: list[str], *expected: str) -> str:
    assert recipe_trial.main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    assert all(part in err for part in expected), err
    return err


def test_json_replaces_nothing_but_a_recipe_report(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint.pt").write_bytes(b"weights")
    scoreboard, ablation = tmp_path / "scoreboard.json", tmp_path / "baseline-seed0.json"
    shutil.copy(ablations_page.SCOREBOARD, scoreboard)  # records of other kinds, each with a valid checksum
    shutil.copy(ablations_page.RECORDS / "baseline-seed0.json", ablation)
    link = tmp_path / "link.json"
    link.symlink_to(scoreboard)
    for path, expected in [(run / "checkpoint.pt", "run folder's file"), (scoreboard, "is not a report of"),
                           (ablation, "is not a report of"), (link, "symbolic link"), (tmp_path, "is a folder")]:
        before = path.read_bytes() if path.is_file() else None
        refused(capsys, ["--json", str(path), "--epochs", "1"], "--json", str(path), expected)  # before training
        assert (path.read_bytes() if path.is_file() else None) == before
    assert recipe_trial.is_report(REPORT)  # its own kind, which a new trial replaces
    assert not recipe_trial.is_report(scoreboard) and not recipe_trial.is_report(ablation)
    own = tmp_path / "trial.json"
    write_checked_json(own, {"what": recipe_trial.WHAT})
    refused(capsys, ["--json", str(own), "--config", str(tmp_path / "none.json")], "--config")  # --json accepted


@pytest.mark.parametrize("config, expected", [(None, "does not exist"), ('{"training": 5}', "'training'"),
                                              ('{"model": [1, 2]}', "'model'"), ("[1]", "JSON object"),
                                              ('{"model": {"d_model": "big"}}', "model.d_model")])
def test_a_bad_config_is_one_line_naming_it(tmp_path, capsys, config, expected):
    path = tmp_path / "f" / "none.json"
    if config is not None:
        path.parent.mkdir()
        path.write_text(config, encoding="utf-8")
    out = tmp_path / "r.json"
    refused(capsys, ["--config", str(path), "--json", str(out)], "--config", str(path), expected)
    assert not out.exists()  # nothing written before the settings are checked


def test_the_report_records_the_length_it_trains(tmp_path, monkeypatch, capsys):
    import transformer_lib as tl
    from transformer_lib.files import read_checked_json
    from transformer_lib.recipe import PRESETS, resolve_settings

    trained = []  # the length train_translator was given, read from its settings as it reads them

    def no_training(out_dir, preset, overrides, **kwargs):
        trained.append(kwargs.get("epochs") or resolve_settings(preset, overrides)["training"]["epochs"])
        raise ValueError("no training in this test")

    monkeypatch.setattr(tl, "train_translator", no_training)
    config = tmp_path / "config.json"
    config.write_text('{"training": {"epochs": 2}}', encoding="utf-8")
    preset_length = PRESETS["multi30k-cpu"]["training"]["epochs"]
    for n, (argv, epochs) in enumerate([(["--epochs", "3"], 3), (["--config", str(config)], 2),
                                        (["--config", str(config), "--epochs", "5"], 5), ([], preset_length)]):
        out = tmp_path / f"report-{n}.json"
        refused(capsys, [*argv, "--json", str(out)], "no training in this test")
        report = read_checked_json(out, "recipe report", recipe_trial.WRITER)  # written before training starts
        assert report["epochs"] == report["settings"]["training"]["epochs"] == trained[-1] == epochs, argv
