"""The command line (transformer_lib.cli): each command's help, a bad argument refused in one line before anything is
written, and the commands end to end.

Most cases run in-process, through cli.main with capsys (no new Python process and torch start-up per case, as
`python -m transformer_lib` is only `sys.exit(main())`); a few run `python -m transformer_lib` in a process of its own
for what needs one: the module's entry point and its exit codes, and the trainings end to end."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer_lib import cli as cli_module
from transformer_lib.split_decoding import stdin_sentences, translate_with_progress, warn_empty

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("TRANSFORMER_LIB_DATA", ROOT.parent / "shared" / "data"))


def cli(*args: str, stdin: str | None = None, data: bool = True) -> subprocess.CompletedProcess:
    """python -m transformer_lib with args, in a process of its own (cwd: the repository)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    if data:
        env["TRANSFORMER_LIB_DATA"] = str(DATA)
    return subprocess.run([sys.executable, "-m", "transformer_lib", *args], input=stdin, env=env,
                          capture_output=True, text=True, timeout=600, cwd=ROOT)


def run_main(capsys, *args: str) -> tuple[int, str, str]:
    """cli.main(args) in this process: its exit code (argparse's SystemExit included), stdout and stderr."""
    try:
        code = cli_module.main(list(args))
    except SystemExit as exit:  # argparse's usage errors and --help
        code = exit.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_error_line(err: str) -> str:
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error:") or ": error:" in line]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def empty_folder(tmp_path, monkeypatch):
    """The working folder of an in-process case: empty but for the file README.md and the folder tests that cases
    name, no corpus reachable and the Hub offline; yields what it holds, so that a case can show it wrote nothing."""
    (tmp_path / "README.md").write_text("not a file of references\n", encoding="utf-8")
    (tmp_path / "tests").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRANSFORMER_LIB_DATA", str(tmp_path / "no-data"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    yield sorted(str(path.relative_to(tmp_path)) for path in tmp_path.rglob("*"))


def folder_now() -> list[str]:
    return sorted(str(path.relative_to(Path.cwd())) for path in Path.cwd().rglob("*"))


@pytest.mark.parametrize("command", [[], ["train"], ["translate"], ["choose"], ["evaluate"]])
def test_help_describes_every_command(capsys, command):
    code, out, err = run_main(capsys, *command, "--help")
    assert code == 0 and err == ""
    assert "usage: python -m transformer_lib" in out
    for word in {(): ["train", "translate", "choose", "evaluate"],
                 ("train",): ["--preset", "--resume", "--max-steps", "--out"],
                 ("translate",): ["--checkpoint", "--beam"], ("choose",): ["--alpha", "--average", "validation split"],
                 ("evaluate",): ["--src-file", "--ref-file", "--split"]}[
        tuple(command)
    ]:
        assert word in out


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["train"], 2, "the following arguments are required: --out"),
        (["train", "--out", "x", "--max-steps", "0"], 2, "expected a positive integer, got '0'"),
        (["train", "--out", "x", "--max-steps", "5", "--epochs", "2"], 2, "not allowed with argument"),
        (["train", "--out", "x", "--preset", "huge"], 2, "invalid choice: 'huge'"),
        (["train", "--out", "x", "--config", "missing.json"], 2, "file 'missing.json' does not exist"),
        (["train", "--out", "/nonexistent/run", "--resume"], 1, "resume needs /nonexistent/run/checkpoint.pt"),
        (["train", "--out", "x", "--resume", "--preset", "tiny", "--seed", "3"], 2,
         "--preset, --seed would be ignored"),
        (["train", "--out", "x", "--resume", "--valid-limit", "5"], 2,
         "--valid-limit would be ignored; drop it, or start a new run (another --out"),
        (["train", "--out", "x", "--resume", "--overwrite"], 1, "choose one"),
        (["translate", "--checkpoint", "x", "--beam", "33", "Hallo"], 2, "expected a beam size from 1 to 32, got '33'"),
        (["translate", "--checkpoint", "x", "Hallo", "  "], 1, "sentence 2 is empty"),
        (["translate", "--checkpoint", "nowhere", "Hallo"], 1, "--checkpoint 'nowhere' does not exist"),
        (["evaluate", "--hyp-file", "missing.txt", "--ref-file", "x"], 2, "file 'missing.txt' does not exist"),
        (["evaluate"], 2, "give --checkpoint with --split"),
        (["choose"], 2, "the following arguments are required: --checkpoint"),
        (["choose", "--checkpoint", "x", "--average", "0"], 2, "expected a positive integer, got '0'"),
        (["choose", "--checkpoint", "nowhere"], 1, "--checkpoint 'nowhere' does not exist"),
        (["train", "--out", ""], 2, "argument --out: expected a folder name, got ''"),
        (["train", "--out", "x", "--corpus", "opus_books", "--corpus-config", "../private/x"], 2,
         "argument --corpus-config: expected a language pair as the Hub names it, like 'en-it', got '../private/x'"),
        (["train", "--out", "x", "--corpus", "opus_books", "--corpus-config", "/etc/passwd"], 2, "got '/etc/passwd'"),
        (["train", "--out", "x", "--corpus-config", "en-it"], 2, "--corpus-config 'en-it' names an opus_books pair"),
        (["evaluate", "--checkpoint", "x", "--split", "test", "--ref-file", "README.md"], 2,
         "--split scores the corpus's own references"),
        (["translate", "--checkpoint", "x", "Ein Hund.", "Ein <eos> Hund."], 1,
         "sentence 2 contains '<eos>', the text of a special token"),
        (["translate", "--checkpoint", "x", "--device", "meta", "Hallo"], 2,
         "expected cpu, cuda, cuda:N or mps, got 'meta'"),
        (["train", "--out", "x", "--seed", "99999999999999999999999"], 2, "argument --seed: expected a seed from 0 to"),
        (["train", "--out", "x", "--config", "tests"], 2, "argument --config: 'tests' is a folder; expected a file"),
        (["evaluate", "--checkpoint", "x", "--split", "test", "--scoreboard", "board", "--max-len", "3"], 2,
         "--beam, --alpha and --max-len would not be what it records"),
    ],
)
def test_bad_arguments_get_clear_messages(capsys, empty_folder, args, code, message):
    """Each refused in one line (with the usage line where argparse or the command's own checks refuse it: exit
    status 2; else `error: ...` and 1), and nothing written: no run folder, no file."""
    got, out, err = run_main(capsys, *args)
    assert got == code and out == "", (got, out, err)
    assert message in one_error_line(err)
    assert folder_now() == empty_folder


def test_the_module_entry_point_exits_with_mains_status_and_one_line():
    """python -m transformer_lib in a process of its own, as a shell sees it: --help exits 0, a usage error 2 with the
    usage line, a user's mistake 1 with one line `error: ...` and no traceback."""
    shown = cli("--help", data=False)
    assert shown.returncode == 0 and shown.stdout.startswith("usage: python -m transformer_lib") and not shown.stderr
    usage = cli("train", "--out", "x", "--max-steps", "0", data=False)
    assert usage.returncode == 2 and usage.stdout == "" and usage.stderr.startswith("usage: python -m transformer_lib")
    assert one_error_line(usage.stderr) == ("python -m transformer_lib train: error: argument --max-steps: expected a "
                                            "positive integer, got '0'")
    mistake = cli("translate", "--checkpoint", "nowhere", "Hallo", data=False)
    assert mistake.returncode == 1 and mistake.stdout == "" and mistake.stderr == (
        "error: --checkpoint 'nowhere' does not exist; give a run folder written by `train` or the checkpoint.pt "
        "inside it\n")


def test_ctrl_c_stops_a_training_with_status_130_and_says_how_to_resume(tmp_path):
    """SIGINT, as Ctrl-C sends it, to `python -m transformer_lib train`: the step under way ends, the checkpoint is
    saved, and the process exits with 130 and one line that names the resume command."""
    from test_translation import QUICK, tiny_corpus

    env = dict(os.environ, TRANSFORMER_LIB_DATA=str(tiny_corpus(tmp_path / "data")), HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1")
    config, run = tmp_path / "quick.json", tmp_path / "run"
    config.write_text(json.dumps(QUICK), encoding="utf-8")
    process = subprocess.Popen([sys.executable, "-m", "transformer_lib", "train", "--preset", "tiny", "--config",
                                str(config), "--epochs", "1000", "--no-validation", "--no-progress", "--out",
                                str(run)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                               env=env)
    try:
        lines = [process.stdout.readline()]
        while lines[-1] and not lines[-1].startswith("epoch 1: step"):  # the first epoch's line: training is under way
            lines.append(process.stdout.readline())
        assert lines[-1], (lines, process.stderr.read())
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 130, (out, err)
    step = torch.load(run / "checkpoint.pt", weights_only=True)["state"]["step"]
    assert err.splitlines()[-1] == (f"interrupted (stopped by Ctrl-C (SIGINT) at step {step}; saved "
                                    f"{run / 'checkpoint.pt'}); continue with: python -m transformer_lib train --out "
                                    f"{run} --resume"), err
    assert "Traceback" not in err


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
    history = json.loads((run / "history.json").read_text(encoding="utf-8"))  # strict JSON
    assert history["train_loss"][-1][0] == 50

    result = cli("train", "--preset", "tiny", "--max-steps", "40", "--out", str(run), "--no-progress")
    assert result.returncode == 1 and "already holds a run" in result.stderr and "Traceback" not in result.stderr

    result = cli("translate", "--checkpoint", str(run), "--beam", "2", "Ein Hund läuft.", "Zwei Männer.")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 2  # one line per sentence (an undertrained model may print empty ones)

    result = cli("translate", "--checkpoint", str(run / "checkpoint.pt"), "--beam", "1", stdin="Ein Hund.\n\nEine Frau.\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 2

    src, ref = tmp_path / "src.de", tmp_path / "ref.en"
    lines = [line for line in (DATA / "multi30k" / "test.jsonl").read_text(encoding="utf-8").splitlines()[:120]]
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


# ---- files and standard input: the evaluate and translate commands in-process ----


@pytest.mark.parametrize(
    "text, lines",
    [("a\nb\n", ["a", "b"]), ("a\nb", ["a", "b"]), ("a\n\n", ["a", ""]), ("\n", [""]), ("a\r\nb\r\n", ["a", "b"])],
)
def test_read_lines_counts_an_empty_last_line(tmp_path, text, lines):
    from transformer_lib.files import read_lines  # what evaluate reads --src-file, --hyp-file and --ref-file with

    path = tmp_path / "hyp.txt"
    path.write_bytes(text.encode("utf-8"))
    assert read_lines(path, "--hyp-file") == lines


def test_a_byte_order_mark_is_read_as_the_encoding_mark_it_is(tmp_path, capsys):
    """Notepad and Excel's "CSV UTF-8" write U+FEFF first: it was scored as part of the first hypothesis (99.94 BLEU
    for a file against its own text); one at the start of a later line (two such files joined) is refused."""
    sentences = [f"A dog runs after ball number {number} in the park." for number in range(120)]
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    ref.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    hyp.write_text("\n".join(sentences) + "\n", encoding="utf-8-sig")
    assert hyp.read_bytes().startswith(b"\xef\xbb\xbf")
    code, out, err = run_main(capsys, "evaluate", "--hyp-file", str(hyp), "--ref-file", str(hyp))
    assert code == 0 and "BLEU = 100.00" in out and "chrF = 100.00" in out, (out, err)
    code, out, err = run_main(capsys, "evaluate", "--hyp-file", str(hyp), "--ref-file", str(ref))
    assert code == 0 and "BLEU = 100.00" in out and "chrF = 100.00" in out, (out, err)

    from transformer_lib.files import read_lines

    assert read_lines(hyp, "--hyp-file") == sentences
    joined = tmp_path / "joined.txt"
    joined.write_bytes(hyp.read_bytes() + hyp.read_bytes())  # cat hyp.txt hyp.txt
    code, _, err = run_main(capsys, "evaluate", "--hyp-file", str(joined), "--ref-file", str(ref))
    line = one_error_line(err)
    assert code == 1 and f"--hyp-file {str(joined)!r} has a byte order mark (U+FEFF) at the start of line 121" in line


def test_a_byte_order_mark_on_standard_input_is_no_part_of_the_first_sentence():
    assert stdin_sentences(b"\xef\xbb\xbfEin Hund.\nEine Katze.\n") == ["Ein Hund.", "Eine Katze."]


def test_an_empty_file_is_no_sentences_not_one(tmp_path, capsys):
    empty, ref = tmp_path / "empty.txt", tmp_path / "ref.txt"
    empty.write_text("", encoding="utf-8")
    ref.write_text("A dog.\n", encoding="utf-8")
    code, _, err = run_main(capsys, "evaluate", "--hyp-file", str(ref), "--ref-file", str(empty))
    assert code == 1 and "--ref-file" in one_error_line(err) and "is empty" in err


def test_files_that_are_not_utf8_are_named(tmp_path, capsys):
    latin, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    latin.write_bytes("Ein M\u00e4dchen.\n".encode("latin-1"))
    ref.write_text("A girl.\n", encoding="utf-8")
    code, _, err = run_main(capsys, "evaluate", "--hyp-file", str(latin), "--ref-file", str(ref))
    line = one_error_line(err)
    assert code == 1 and "is not UTF-8 text (byte 0xe4 on line 1)" in line and "iconv" in line


def test_save_hyp_never_overwrites_an_input(tmp_path, capsys):
    src, ref = tmp_path / "src.de", tmp_path / "ref.en"
    src.write_text("Ein Hund.\n", encoding="utf-8")
    ref.write_text("A dog.\n", encoding="utf-8")
    code, _, err = run_main(capsys, "evaluate", "--checkpoint", str(tmp_path), "--src-file", str(src), "--ref-file",
                            str(ref), "--save-hyp", str(ref))
    assert code == 1 and "is the --ref-file and would be overwritten" in one_error_line(err)
    assert ref.read_text(encoding="utf-8") == "A dog.\n"


@pytest.mark.parametrize(
    "config, message",
    [
        ('{"training": {"lr": 0.1}}', "training.lr is not a setting; did you mean 'lr_factor'?"),
        ('{"training": {"warmup": 0}}', "training.warmup must be a positive integer (steps), got 0"),
        ('{"model": {"norm_first": "no"}}', "model.norm_first must be True or False, got 'no'"),
        ("null", "must hold a JSON object"),
        ("[1, 2]", "must hold a JSON object"),
        ('{"training": {', "is not valid JSON (line 1, column"),
    ],
)
def test_a_bad_config_is_refused_before_anything_is_written(tmp_path, capsys, config, message):
    path, out = tmp_path / "config.json", tmp_path / "run"
    path.write_text(config, encoding="utf-8")
    code, _, err = run_main(capsys, "train", "--preset", "tiny", "--config", str(path), "--out", str(out))
    assert code == 1 and message in one_error_line(err)
    assert not out.exists()


def test_an_existing_run_is_refused_without_resume_or_overwrite(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint.pt").write_bytes(b"a finished run")
    code, _, err = run_main(capsys, "train", "--preset", "tiny", "--out", str(run))
    line = one_error_line(err)
    assert code == 1 and "already holds a run (checkpoint.pt)" in line and "--resume" in line and "--overwrite" in line
    assert (run / "checkpoint.pt").read_bytes() == b"a finished run"
    (tmp_path / "file").write_text("mine", encoding="utf-8")
    code, _, err = run_main(capsys, "train", "--out", str(tmp_path / "file"))
    assert code == 1 and "is a file" in one_error_line(err)


def test_a_second_training_in_a_folder_in_use_stops_at_once_even_with_overwrite(tmp_path, capsys):
    """The holder is named by its command: here a `choose` (the argv python -m transformer_lib gives it), which a
    reader once took for a training, told to "wait until that run ends"."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint.pt").write_bytes(b"the first training's checkpoint")
    script = "import sys\nfrom transformer_lib import guards\n" \
             "sys.argv = ['/x/transformer_lib/__main__.py', 'choose', '--checkpoint', sys.argv[1]]\n" \
             "with guards.lock_run_folder(sys.argv[3]):\n    print('locked', flush=True)\n    sys.stdin.read()\n"
    holder = subprocess.Popen([sys.executable, "-c", script, str(run)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline() == "locked\n"
        for extra in ([], ["--overwrite"]):
            code, _, err = run_main(capsys, "train", "--preset", "tiny", "--out", str(run), *extra)
            line = one_error_line(err)
            assert code == 1 and f"{str(run)!r} is in use by process {holder.pid} (python -m transformer_lib choose " \
                f"--checkpoint {run}), which holds {run / '.lock'}; wait until it ends" in line, line
        assert (run / "checkpoint.pt").read_bytes() == b"the first training's checkpoint"
    finally:
        holder.stdin.close()
        holder.wait()
        holder.stdout.close()


def test_bad_checkpoints_are_one_line_and_run_no_code(tmp_path, capsys):
    import pickle

    marker = tmp_path / "ran"
    crafted = tmp_path / "crafted.pt"
    crafted.write_bytes(pickle.dumps({"config": Touch(marker)}))
    (tmp_path / "empty.pt").write_bytes(b"")
    for name, message in (("crafted.pt", "not a transformer_lib checkpoint"), ("empty.pt", "corrupt")):
        code, _, err = run_main(capsys, "translate", "--checkpoint", str(tmp_path / name), "Hallo")
        assert code == 1 and message in one_error_line(err)
    assert not marker.exists()


class Touch:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def test_debug_shows_the_traceback(tmp_path, capsys):
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(ValueError, match="corrupt"):
        cli_module.main(["translate", "--checkpoint", str(tmp_path / "empty.pt"), "--debug", "Hallo"])
    with pytest.raises(ValueError, match="corrupt"):
        cli_module.main(["--debug", "translate", "--checkpoint", str(tmp_path / "empty.pt"), "Hallo"])


def test_a_bug_still_shows_its_traceback(monkeypatch, capsys):
    def broken(args):
        raise TypeError("a bug")

    monkeypatch.setattr(cli_module, "cmd_translate", broken)
    code, _, err = run_main(capsys, "translate", "--checkpoint", "x", "Hallo")
    assert code == 1 and "Traceback" in err and "TypeError: a bug" in err and "this is a bug" in err


# ---- the files evaluate --save-hyp must never replace ----


def src_ref(tmp_path):
    src, ref = tmp_path / "src.de", tmp_path / "ref.en"
    src.write_text("Ein Hund.\n", encoding="utf-8")
    ref.write_text("A dog.\n", encoding="utf-8")
    return src, ref


@pytest.mark.parametrize("name", ["checkpoint.pt", "tokenizer.json", "history.json", "decoding.json", ".lock",
                                  "epoch-003.pt", "epoch-1000.pt"])  # an epoch file, kept or not, would be averaged
def test_save_hyp_never_overwrites_the_checkpoint_being_evaluated_or_its_run(tmp_path, capsys, name):
    src, ref = src_ref(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint.pt").write_bytes(b"the weights")
    for checkpoint in (run, run / "checkpoint.pt"):
        code, _, err = run_main(capsys, "evaluate", "--checkpoint", str(checkpoint), "--src-file", str(src),
                                "--ref-file", str(ref), "--save-hyp", str(run / name))
        line = one_error_line(err)
        assert code == 1 and f"--save-hyp {str(run / name)!r} is a run folder's file" in line
        assert "which only training writes" in line
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint.pt"]
    assert (run / "checkpoint.pt").read_bytes() == b"the weights"


@pytest.mark.parametrize("name", ["checkpoint.pt", "epoch-002.pt", "decoding.json", "record.json", "notes.md"])
def test_save_hyp_never_overwrites_another_runs_file_or_a_record_even_without_checkpoint(tmp_path, capsys, name):
    """--hyp-file scores saved translations: no run is named, and still no run's file, record or notebook of
    anyone's is replaced by translations; a file of translations saved before is."""
    src, ref = src_ref(tmp_path)
    other = tmp_path / "other-run"
    other.mkdir()
    (other / "checkpoint.pt").write_bytes(b"the weights")
    target = other / name if name != "record.json" and name != "notes.md" else tmp_path / name
    target.write_bytes(b"kept") if not target.exists() else None
    kept = target.read_bytes()
    code, _, err = run_main(capsys, "evaluate", "--hyp-file", str(ref), "--ref-file", str(ref),
                            "--save-hyp", str(target))
    assert code == 1 and f"--save-hyp {str(target)!r}" in one_error_line(err)
    assert target.read_bytes() == kept
    old = tmp_path / "hyp.en"
    old.write_text("Translations of an earlier run.\n", encoding="utf-8")
    lines = "\n".join(f"A dog number {n}." for n in range(100)) + "\n"
    ref.write_text(lines, encoding="utf-8")
    code, out, err = run_main(capsys, "evaluate", "--hyp-file", str(ref), "--ref-file", str(ref),
                              "--save-hyp", str(old))
    assert code == 0 and old.read_text(encoding="utf-8") == lines, err


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_save_hyp_refuses_a_link_or_a_special_file_before_translating(tmp_path, capsys, kind):
    src, ref = src_ref(tmp_path)
    target = tmp_path / "hyp.en"
    if kind == "link":
        target.symlink_to("/dev/stdout")
    else:
        os.mkfifo(target)
    code, _, err = run_main(capsys, "evaluate", "--checkpoint", str(tmp_path / "nowhere"), "--src-file", str(src),
                            "--ref-file", str(ref), "--save-hyp", str(target))
    line = one_error_line(err)
    assert code == 1 and ("is a symbolic link" if kind == "link" else "is a FIFO, not a regular file") in line
    assert target.is_symlink() == (kind == "link")


# ---- standard input ----


def fake_stdin(monkeypatch, text: str) -> None:
    import io

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode("utf-8"))))


def test_stdin_is_split_only_at_line_ends():
    text = "Ein\u2028Hund.\nEine\x0cKatze.\nZwei\x85Pferde.\nDrei V\u00f6gel.\r\n"
    assert stdin_sentences(text.encode("utf-8")) == ["Ein\u2028Hund.", "Eine\x0cKatze.", "Zwei\x85Pferde.",
                                                     "Drei V\u00f6gel."]


def test_special_token_text_on_stdin_is_refused_naming_the_line(monkeypatch, capsys):
    fake_stdin(monkeypatch, "Ein Hund.\n\nEine <pad> Katze.\n")
    code, _, err = run_main(capsys, "translate", "--checkpoint", "nowhere")
    assert code == 1 and "line 3 of standard input contains '<pad>'" in one_error_line(err)


@pytest.mark.parametrize("sentence, what", [("Ein \udcff Hund.", "byte 0xff at character 5"),
                                             ("\ud83d Hund.", "a lone surrogate, U+D83D, at character 1")])
def test_a_sentence_argument_that_was_not_utf8_is_one_line(capsys, sentence, what):
    # a terminal that is not UTF-8 passes bytes that Python keeps as lone surrogates: the tokenizer's TypeError was
    # called a bug in transformer_lib
    code, _, err = run_main(capsys, "translate", "--checkpoint", "nowhere", "Ein Hund.", sentence)
    assert code == 1 and f"sentence 2 is not UTF-8 text ({what})" in one_error_line(err)


# ---- checkpoints that load but do not fit ----


def run_record(**change) -> dict:
    """A run record with every key train_translator writes (runs.RUN_RECORD_KEYS), for a checkpoint built by hand.

    Its settings have no decoding part, so that a run decodes with the defaults unless a test gives one."""
    import uuid

    from transformer_lib import recipe, runs

    settings = recipe.resolve_settings("tiny")
    del settings["decoding"]
    record = {"id": uuid.uuid4().hex, "corpus": "multi30k", "src_lang": "de", "tgt_lang": "en", "corpus_config": None,
              "seed": 0, "train_limit": None, "valid_limit": None, "validate": True, "max_steps": 3, "epochs": None,
              "preset": "tiny", "overrides": None, "settings": settings}
    assert set(record) == set(runs.RUN_RECORD_KEYS)  # a key added to the run record is added here too
    return {**record, **change}


def fake_run(tmp_path, config_change=None, weights_config=None, with_run_record=True, decoding=None,
             drop=()) -> Path:
    """A run folder whose checkpoint.pt has the keys save_checkpoint writes, a small model, a tokenizer and (unless
    with_run_record is False) a full run record but the keys in drop, whose settings hold decoding when it is given;
    the run trained 1,234 steps, 3 epochs."""
    import torch

    import transformer_lib as tl

    tokenizer = tl.train_word_tokenizer(["ein Hund", "a dog", "eine Katze", "a cat"] * 3, vocab_size=20)
    config = dict(src_vocab_size=tokenizer.get_vocab_size(), tgt_vocab_size=tokenizer.get_vocab_size(), d_model=16,
                  n_heads=2, n_layers=1, d_ff=32, max_len=16, share_embeddings=True)
    model = tl.Transformer(tl.TransformerConfig(**{**config, **(weights_config or {})}))
    run = tmp_path / "run"
    run.mkdir(parents=True)
    extra = {"tokenizer": tokenizer.to_str()}
    if with_run_record:
        extra["run"] = {key: value for key, value in run_record().items() if key not in drop}
        if decoding is not None:
            extra["run"]["settings"]["decoding"] = decoding
    checkpoint = {"config": {**config, **(config_change or {})}, "model": model.state_dict(), "optimizer": {},
                  "scheduler": {}, "scaler": None, "state": {"step": 1234, "epoch": 3}, "rng": {}, "extra": extra}
    checkpoint["checksum"] = tl.checkpoint_checks.weights_checksum(checkpoint)  # intact: the checks after the checksum are tested
    torch.save(checkpoint, run / "checkpoint.pt")
    return run


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(config_change={"n_experts": 4}), "config does not fit this version of transformer_lib"),
        (dict(weights_config={"d_ff": 64}), "weights do not fit its config (size mismatch for"),
    ],
)
def test_a_checkpoint_whose_config_or_weights_do_not_fit_is_one_line(tmp_path, capsys, change, message):
    run = fake_run(tmp_path, **change)
    code, _, err = run_main(capsys, "translate", "--checkpoint", str(run), "Ein Hund.")
    line = one_error_line(err)
    assert code == 1 and message in line and str(run / "checkpoint.pt") in line


@pytest.mark.parametrize("command", [["train", "--resume", "--out"], ["evaluate", "--split", "test", "--checkpoint"]])
def test_a_checkpoint_without_its_run_record_is_one_line(tmp_path, capsys, command):
    run = fake_run(tmp_path, with_run_record=False)
    code, _, err = run_main(capsys, *command, str(run))
    line = one_error_line(err)
    assert code == 1 and "holds no run record" in line and str(run / "checkpoint.pt") in line


@pytest.mark.parametrize("command", [["translate", "--checkpoint"], ["train", "--resume", "--out"],
                                     ["choose", "--checkpoint"]])
def test_a_run_record_without_the_keys_of_this_version_is_one_line(tmp_path, capsys, command):
    run = fake_run(tmp_path, drop=("id", "validate"))  # e.g. a run of an older version, before runs had an id
    before = (run / "checkpoint.pt").read_bytes()
    code, out, err = run_main(capsys, *command, str(run), *(["Ein Hund."] if command[0] == "translate" else []))
    line = one_error_line(err)
    assert code == 1 and out == "" and line.startswith(
        f"error: {run / 'checkpoint.pt'} holds a run record without 'id', 'validate': it was not written by "
        f"this version's train_translator")
    assert sorted(p.name for p in run.iterdir()) == ["checkpoint.pt"] and (run / "checkpoint.pt").read_bytes() == before


# ---- choosing the preset and the device; decoding options; empty translations ----


def test_without_a_gpu_and_without_a_preset_the_cpu_preset_is_chosen_and_said(tmp_path):
    if not (DATA / "multi30k" / "train.jsonl").is_file():
        pytest.skip(f"the offline Multi30k copy is not at {DATA}")
    run = tmp_path / "run"
    result = cli("train", "--train-limit", "300", "--max-steps", "2", "--out", str(run), "--no-progress",
                 "--device", "cpu")
    assert result.returncode == 0, result.stderr
    assert "note: no GPU here (cpu), so the preset is multi30k-cpu" in result.stderr
    from transformer_lib.runs import read_run_record

    assert read_run_record(run / "checkpoint.pt")["run"]["preset"] == "multi30k-cpu"


@pytest.mark.parametrize(("args", "message"), [
    (["train", "--out", "x", "--device", "tpu"], "expected a device such as cpu, cuda or cuda:1, got 'tpu'"),
    (["translate", "--checkpoint", "x", "--alpha", "-1", "a"], "length penalty exponent from 0 (none) to 10"),
    (["translate", "--checkpoint", "x", "--max-len", "0", "a"], "expected a positive integer, got '0'"),
    (["evaluate", "--checkpoint", "x", "--split", "test", "--alpha", "inf"], "got 'inf'"),
])
def test_device_and_decoding_options_are_checked_where_they_enter(capsys, empty_folder, args, message):
    code, out, err = run_main(capsys, *args)  # (empty_folder: no corpus either)
    assert code == 2 and out == "" and message in one_error_line(err), err
    assert folder_now() == empty_folder


def test_empty_translations_are_kept_in_place_and_named_in_a_warning(capsys):
    warn_empty(["a dog", "", " "])
    err = capsys.readouterr().err
    assert "warning: 2 of 3 translations are empty (sentence 2, 3)" in err and err.count("\n") == 1


def test_a_max_len_beyond_the_models_positions_is_the_librarys_one_line(capsys):
    from test_translation import small_model

    import transformer_lib as tl

    model = small_model()  # max_len=40
    tokenizer = tl.train_bpe_tokenizer(["ein hund", "eine katze"] * 5, vocab_size=30, min_frequency=1)
    with pytest.raises(ValueError, match=r"^max_len must be a positive integer of at most 39 for this model \(its "
                                         r"max_len is 40, and <bos> takes one position\), got 200$"):
        translate_with_progress(model, tokenizer, ["ein hund"], beam_size=4, alpha=0.6, max_len=200, progress=False)


def test_choose_decides_on_validation_and_translate_and_evaluate_decode_as_it_chose(tmp_path, capsys):
    """The command line's way to chapter 8's choice: every (weights, alpha) decoded on the validation split, the best
    by BLEU written to decoding.json, and evaluate, given no --beam or --alpha, decoding exactly that way."""
    if not (DATA / "multi30k" / "train.jsonl").is_file():
        pytest.skip(f"the offline Multi30k copy is not at {DATA}")
    from transformer_lib.runs import read_run_record

    run = tmp_path / "run"
    result = cli("train", "--preset", "tiny", "--train-limit", "1500", "--epochs", "2", "--out", str(run),
                 "--no-progress")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("epoch ")]
    assert [line.split(":")[0] for line in lines] == ["epoch 1", "epoch 2"], result.stdout  # no bar, still a line each
    assert all("training loss" in line and "validation loss" in line for line in lines)
    state = torch.load(run / "checkpoint.pt", weights_only=True)["state"]
    final = f"the final weights (step {state['step']:,})"

    result = cli("choose", "--checkpoint", str(run), "--average", "5")
    line = one_error_line(result.stderr)
    assert result.returncode == 1 and "--average 5: " in line and "keeps the weights of 2 epochs" in line
    assert "training setting keep_checkpoints" in line and "give counts from 1 to 2" in line
    assert not (run / "decoding.json").exists()

    result = cli("choose", "--checkpoint", str(run), "--beam", "2", "--alpha", "0.6", "1.0", "--max-len", "30")
    assert result.returncode == 0, result.stderr
    tried = [line for line in result.stdout.splitlines() if " alpha " in line and "BLEU" in line and "chosen" not in line]
    assert len(tried) == 4, result.stdout  # the final weights and the average of the 2 epochs kept, two alphas each
    assert [line.split(" alpha ")[0].strip() for line in tried] == [final] * 2 + ["the average of epochs 1-2"] * 2
    best = max(float(line.split("BLEU")[1].split()[0]) for line in tried)
    chosen = json.loads((run / "decoding.json").read_text(encoding="utf-8"))
    assert chosen["chosen_on"] == "validation" and chosen["beam_size"] == 2 and chosen["alpha"] in (0.6, 1.0)
    assert chosen["average_last"] in (1, 2) and f"{chosen['validation']['bleu']:.2f}" == f"{best:.2f}"
    assert chosen["weights"] == {1: final, 2: "the average of epochs 1-2"}[chosen["average_last"]]
    assert chosen["run_id"] == read_run_record(run / "checkpoint.pt")["run"]["id"]
    assert f"chosen on the validation split: {chosen['weights']}, beam 2" in result.stdout

    result = cli("evaluate", "--checkpoint", str(run), "--split", "validation", "--max-len", "30")
    assert result.returncode == 0, result.stderr
    assert f"decoding.json (chosen on the validation split), with {chosen['weights']}" in result.stderr
    assert f"BLEU = {chosen['validation']['bleu']:.2f}" in result.stdout  # the same weights, beam and alpha

    # translate names the weights it decodes with, and refuses a --max-len beyond the model's positions in one line
    code, out, err = run_main(capsys, "translate", "--checkpoint", str(run), "Ein Hund läuft.")
    assert code == 0 and out.count("\n") == 1 and f"alpha {chosen['alpha']:g}, from " in err
    assert f"with {chosen['weights']}\n" in err, err
    code, out, err = run_main(capsys, "translate", "--checkpoint", str(run), "--max-len", "128", "Ein Hund läuft.")
    line = one_error_line(err)
    assert code == 1 and out == "" and line == (
        "error: max_len must be a positive integer of at most 127 for this model (its max_len is 128, and <bos> takes "
        "one position), got 128")

    # A quick trial chooses on the first sentences only, and says so (decoding.json keeps how many)
    result = cli("choose", "--checkpoint", str(run), "--beam", "2", "--alpha", "1.0", "--max-len", "30", "--limit",
                 "150", "--average", "1")
    assert result.returncode == 0 and "the first 150 of 1,014 sentences" in result.stdout, result.stderr
    chosen = json.loads((run / "decoding.json").read_text(encoding="utf-8"))
    assert chosen["validation"]["sentences"] == 150 and chosen["weights"] == final and chosen["alpha"] == 1.0
    assert chosen["validation"]["max_len"] == 30 and "(translations of at most 30 tokens)" in result.stdout
    result = cli("choose", "--checkpoint", str(run), "--limit", "99")
    assert result.returncode == 2 and "argument --limit: expected an integer >= 100" in result.stderr

    # An epoch file gone: choose does not quietly try fewer weights, it says which epochs are missing
    (run / "epoch-001.pt").unlink()
    result = cli("choose", "--checkpoint", str(run), "--beam", "1", "--limit", "100")
    line = one_error_line(result.stderr)
    assert result.returncode == 1 and f"{run} finished 2 epochs and keeps 2 of them, so it should hold the weights " \
        "of epochs 1, 2, but holds those of epochs 2: the file of epoch 1 was removed" in line, result.stderr
    assert "resume" not in line  # a finished run has nothing to train: the final weights alone need no epoch file
    result = cli("choose", "--checkpoint", str(run), "--beam", "1", "--limit", "100", "--average", "1")
    assert result.returncode == 0 and "error" not in result.stderr, result.stderr


def test_sentences_are_named_as_the_user_gave_them(tmp_path, capsys, monkeypatch):
    """check_sentences with the command line's names: the argument's number, the line of standard input, the line of
    --src-file; each refused before any checkpoint is read (here there is none)."""
    code, _, err = run_main(capsys, "translate", "--checkpoint", str(tmp_path / "nowhere"), "Ein Hund.", " ", "Ja.")
    assert code == 1 and one_error_line(err).startswith("error: sentence 2 is empty or only spaces")
    fake_stdin(monkeypatch, "Ein Hund.\nEine <unk> Katze.\n")
    code, _, err = run_main(capsys, "translate", "--checkpoint", str(tmp_path / "nowhere"))
    assert code == 1 and one_error_line(err).startswith("error: line 2 of standard input contains '<unk>'")
    src, ref = tmp_path / "src.de", tmp_path / "ref.en"
    src.write_text("Ein Hund.\nEine Katze.\nZwei Männer.\n   \n", encoding="utf-8")
    ref.write_text("A dog.\nA cat.\nTwo men.\nNothing.\n", encoding="utf-8")
    code, _, err = run_main(capsys, "evaluate", "--checkpoint", str(tmp_path / "nowhere"), "--src-file", str(src),
                            "--ref-file", str(ref))
    assert code == 1 and one_error_line(err).startswith(f"error: --src-file {src}: line 4 is empty or only spaces")


def test_resume_takes_a_new_length_refuses_a_shorter_one_and_a_finished_run_trains_nothing(tmp_path, capsys,
                                                                                            monkeypatch):
    from test_translation import QUICK, tiny_corpus

    from transformer_lib import data

    monkeypatch.setenv(data.DATA_ENV, str(tiny_corpus(tmp_path / "data")))
    config, run = tmp_path / "quick.json", tmp_path / "run"
    config.write_text(json.dumps(QUICK), encoding="utf-8")
    code, out, err = run_main(capsys, "train", "--preset", "tiny", "--config", str(config), "--max-steps", "2",
                              "--out", str(run), "--no-progress")
    assert code == 0 and "trained 2 steps" in out, err
    code, out, err = run_main(capsys, "train", "--out", str(run), "--resume", "--max-steps", "3", "--no-progress")
    assert code == 0 and "trained 3 steps" in out, err
    before = {path.name: path.read_bytes() for path in run.iterdir()}
    code, out, err = run_main(capsys, "train", "--out", str(run), "--resume", "--max-steps", "2", "--no-progress")
    assert code == 1 and one_error_line(err).startswith(
        f"error: max_steps=2 is shorter than what the run in {run} has already trained, 3 steps (0 epochs)")
    for length in ([], ["--max-steps", "3"]):  # finished: no length, or the one it has reached
        code, out, err = run_main(capsys, "train", "--out", str(run), "--resume", *length, "--no-progress")
        assert code == 0 and f"the run in {run} is finished: it has trained its full length, 3 steps; nothing to " \
            "train" in out, err
        assert f"nothing was trained or saved: the run in {run} stays as it was, 3 steps; last logged loss" in out
        assert "trained 3 steps" not in out and "saved in" not in out
    assert {path.name: path.read_bytes() for path in run.iterdir()} == before
    code, out, err = run_main(capsys, "train", "--out", str(run), "--resume", "--max-steps", "4", "--epochs", "1")
    assert code == 2 and "not allowed with argument" in err
    code, out, _ = run_main(capsys, "train", "--help")
    assert code == 0 and "one shorter than what it has trained is refused" in " ".join(out.split())  # the rule
