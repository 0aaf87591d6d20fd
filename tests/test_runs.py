"""transformer_lib.runs: a run folder is never replaced without being asked, a link or a folder among its files
stops a start before anything is read or removed, and a resume removes only the epoch files after its checkpoint."""

import re

import pytest

from transformer_lib import runs


def test_an_existing_run_is_never_replaced_without_being_asked(tmp_path):
    runs.check_run_folder(tmp_path / "new", resume=False, overwrite=False)  # a new folder is fine
    (tmp_path / "run").mkdir()
    runs.check_run_folder(tmp_path / "run", resume=False, overwrite=False)  # so is an empty one
    (tmp_path / "run" / "checkpoint.pt").write_bytes(b"a run")
    with pytest.raises(FileExistsError, match=r"already holds a run \(checkpoint.pt\); continue it with resume"):
        runs.check_run_folder(tmp_path / "run", resume=False, overwrite=False)
    runs.check_run_folder(tmp_path / "run", resume=False, overwrite=True)
    runs.check_run_folder(tmp_path / "run", resume=True, overwrite=False)
    (tmp_path / "run" / "checkpoint.pt").unlink()
    with pytest.raises(FileNotFoundError, match="resume needs .*checkpoint.pt"):
        runs.check_run_folder(tmp_path / "run", resume=True, overwrite=False)
    with pytest.raises(ValueError, match="choose one"):
        runs.check_run_folder(tmp_path / "run", resume=True, overwrite=True)
    (tmp_path / "file").write_text("mine")
    with pytest.raises(NotADirectoryError, match="is a file"):
        runs.check_run_folder(tmp_path / "file", resume=False, overwrite=True)
    runs.start_run_folder(tmp_path / "run", overwrite=True)
    assert list((tmp_path / "run").iterdir()) == []


@pytest.mark.parametrize("name, kind", [("checkpoint.pt", "link"), ("epoch-004.pt", "link"),
                                        ("decoding.json", "folder"), (".lock", "folder"), ("history.json", "link")])
def test_a_run_file_that_is_a_link_or_a_folder_stops_the_start_before_anything_is_read_or_removed(tmp_path, name,
                                                                                                   kind):
    """Found before training, resuming or overwriting begins: training an epoch and then failing on the link (or
    removing the other files and then failing on the folder) would lose work."""
    run, victim = tmp_path / "run", tmp_path / "victim"
    run.mkdir()
    victim.write_bytes(b"someone else's")
    for own in ("checkpoint.pt", "tokenizer.json", "epoch-003.pt"):
        if own != name:
            (run / own).write_bytes(b"the run's")
    if kind == "link":
        (run / name).symlink_to(victim)
    else:
        (run / name).mkdir()
    before = sorted(p.name for p in run.iterdir())
    for resume, overwrite in ((True, False), (False, True)):
        with pytest.raises(ValueError, match=rf"holds {re.escape(name)}, which is (a symbolic link|not a regular "
                                             rf"file).*move it away") as error:
            runs.check_run_folder(run, resume=resume, overwrite=overwrite)
        assert "\n" not in str(error.value)
    assert sorted(p.name for p in run.iterdir()) == before and victim.read_bytes() == b"someone else's"


def test_a_run_folder_that_is_a_link_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "checkpoint.pt").write_bytes(b"a run")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    for resume, overwrite in ((True, False), (False, True), (False, False)):
        with pytest.raises(ValueError, match="is a symbolic link .*give the folder's real path"):
            runs.check_run_folder(tmp_path / "link", resume=resume, overwrite=overwrite)
    assert (tmp_path / "real" / "checkpoint.pt").read_bytes() == b"a run"


def test_a_failed_start_is_not_called_a_run_and_both_messages_lead_out_of_the_folder(tmp_path):
    # A start that failed after writing tokenizer.json, before its first checkpoint: once, plain train called the
    # folder "a run" and sent the user to resume, and resume said there was no checkpoint: a circle.
    run = tmp_path / "run"
    run.mkdir()
    (run / "tokenizer.json").write_text("{}")
    messages = []
    for resume in (False, True):
        with pytest.raises((FileExistsError, FileNotFoundError)) as error:
            runs.check_run_folder(run, resume=resume, overwrite=False)
        messages.append(str(error.value))
    for message in messages:
        assert "already holds a run" not in message and "continue it with resume" not in message
        assert "tokenizer.json but no checkpoint.pt" in message and "overwrite (--overwrite)" in message
    runs.check_run_folder(run, resume=False, overwrite=True)  # the way out that both name


def test_a_resume_removes_only_the_epoch_files_after_its_checkpoint(tmp_path):
    """A run killed after epoch 9 whose last checkpoint was at epoch 3 leaves epoch-008/009.pt: training again from
    epoch 4 would prune its own new files in their favour, so they go first, named; earlier ones stay."""
    for name in ("epoch-002.pt", "epoch-003.pt", "epoch-008.pt", "epoch-009.pt", "checkpoint.pt", "notes.txt"):
        (tmp_path / name).write_bytes(b"x")
    assert runs.remove_epochs_after(tmp_path, 3) == ["epoch-008.pt", "epoch-009.pt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "epoch-002.pt", "epoch-003.pt", "notes.txt"]
    assert runs.remove_epochs_after(tmp_path, 3) == []
