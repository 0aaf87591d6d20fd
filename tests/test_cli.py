import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("TRANSFORMER_LIB_DATA", ROOT.parent / "shared" / "data"))


def cli(*args: str, stdin: str | None = None, data: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    if data:
        env["TRANSFORMER_LIB_DATA"] = str(DATA)
    return subprocess.run([sys.executable, "-m", "transformer_lib", *args], input=stdin, env=env,
                          capture_output=True, text=True, timeout=600, cwd=ROOT)


@pytest.mark.parametrize("command", [[], ["train"], ["translate"], ["evaluate"]])
def test_help_describes_every_command(command):
    result = cli(*command, "--help")
    assert result.returncode == 0
    assert "usage: python -m transformer_lib" in result.stdout
    for word in {(): ["train", "translate", "evaluate"], ("train",): ["--preset", "--resume", "--max-steps", "--out"],
                 ("translate",): ["--checkpoint", "--beam"], ("evaluate",): ["--src-file", "--ref-file", "--split"]}[
        tuple(command)
    ]:
        assert word in result.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["train"], "the following arguments are required: --out"),
        (["train", "--out", "x", "--max-steps", "0"], "expected a positive integer, got '0'"),
        (["train", "--out", "x", "--max-steps", "5", "--epochs", "2"], "not allowed with argument"),
        (["train", "--out", "x", "--preset", "huge"], "invalid choice: 'huge'"),
        (["train", "--out", "x", "--config", "missing.json"], "file 'missing.json' does not exist"),
        (["train", "--out", "/nonexistent/run", "--resume"], "--resume needs /nonexistent/run/checkpoint.pt"),
        (["translate", "--checkpoint", "nowhere", "Hallo"], "--checkpoint 'nowhere' does not exist"),
        (["evaluate", "--hyp-file", "missing.txt", "--ref-file", "x"], "file 'missing.txt' does not exist"),
        (["evaluate"], "give --checkpoint with --split"),
    ],
)
def test_bad_arguments_get_clear_messages(args, message):
    result = cli(*args)
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_train_translate_evaluate_resume(tmp_path):
    if not (DATA / "multi30k" / "train.jsonl").is_file():
        pytest.skip(f"the offline Multi30k copy is not at {DATA}")
    run = tmp_path / "run"
    result = cli("train", "--preset", "tiny", "--train-limit", "1500", "--max-steps", "40", "--out", str(run),
                 "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "trained 40 steps" in result.stdout
    assert {"checkpoint.pt", "tokenizer.json", "history.json"} <= {p.name for p in run.iterdir()}

    result = cli("train", "--out", str(run), "--resume", "--max-steps", "50", "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "trained 50 steps" in result.stdout

    result = cli("translate", "--checkpoint", str(run), "--beam", "2", "Ein Hund läuft.", "Zwei Männer.")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 2  # one line per sentence (an undertrained model may print empty ones)

    result = cli("translate", "--checkpoint", str(run / "checkpoint.pt"), "--beam", "1", stdin="Ein Hund.\n\nEine Frau.\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 2

    src, ref = tmp_path / "src.de", tmp_path / "ref.en"
    lines = [line for line in (DATA / "multi30k" / "test.jsonl").read_text(encoding="utf-8").splitlines()[:120]]
    import json

    src.write_text("\n".join(json.loads(l)["de"] for l in lines) + "\n", encoding="utf-8")
    ref.write_text("\n".join(json.loads(l)["en"] for l in lines) + "\n", encoding="utf-8")
    hyp = tmp_path / "hyp.en"
    result = cli("evaluate", "--checkpoint", str(run), "--src-file", str(src), "--ref-file", str(ref), "--beam", "1",
                 "--save-hyp", str(hyp))
    assert result.returncode == 0, result.stderr
    assert "BLEU = " in result.stdout and "chrF = " in result.stdout and "nrefs:1|case:mixed" in result.stdout
    assert "on 120 sentences" in result.stdout
    assert hyp.read_text(encoding="utf-8").count("\n") == 120

    result = cli("evaluate", "--hyp-file", str(ref), "--ref-file", str(ref))
    assert result.returncode == 0 and "BLEU = 100.00" in result.stdout

    short = tmp_path / "short.en"
    short.write_text("A dog.\nA cat.\n", encoding="utf-8")
    result = cli("evaluate", "--hyp-file", str(short), "--ref-file", str(short))
    assert result.returncode != 0 and "BLEU on 2 sentences is noise" in result.stderr

    result = cli("evaluate", "--checkpoint", str(run), "--src-file", str(src), "--ref-file", str(short))
    assert result.returncode != 0 and "120 source lines but 2 reference lines" in result.stderr
