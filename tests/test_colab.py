"""The Colab install cell that tools/colab.py writes, run as Colab would run it, with pip and the versions faked
(CONTRIBUTING.md, 'Colab install cell and runtime')."""

import importlib.metadata
import subprocess
import sys
import types

import pytest

import colab

URL, COMMIT = "https://github.com/o/r", "0123456789abcdef0123456789abcdef01234567"


def run_cell(monkeypatch, capsys, upgrades: dict[str, str], extras=()):
    """Execute the install cell in 'Colab' (a fake google.colab module); pip 'installs' by changing the versions
    named in upgrades. Returns (the pip command, what the cell printed)."""
    versions = {"torch": "2.11.0+cu128", "numpy": "2.1.3", "tokenizers": "0.22.0"}
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.setattr(importlib.metadata, "version", lambda name: versions[name])
    monkeypatch.setattr(importlib.metadata, "packages_distributions",
                        lambda: {"torch": ["torch"], "numpy": ["numpy"], "tokenizers": ["tokenizers"]})
    for name in ("torch", "numpy"):  # already imported by the kernel, as Colab's numpy is
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    monkeypatch.delitem(sys.modules, "tokenizers", raising=False)  # not imported yet (whatever this process did)
    commands = []

    def pip(command, check):
        assert check is True
        commands.append(command)
        versions.update(upgrades)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(subprocess, "run", pip)
    exec(compile(colab.install_cell_source(URL, COMMIT, extras), "install-cell", "exec"), {})
    return commands[0], capsys.readouterr().out


def test_the_cell_installs_the_pinned_commit_and_keeps_colabs_torch_and_numpy(monkeypatch, capsys):
    command, printed = run_cell(monkeypatch, capsys, upgrades={}, extras=("lightning",))
    assert f"transformer-lib[lightning] @ git+{URL}@{COMMIT}" in command
    assert "torch==2.11.0+cu128" in command and "numpy==2.1.3" in command  # pinned to what is there: never upgraded
    assert printed == ""  # nothing changed under the kernel: nothing to say


def test_a_version_changed_under_the_running_kernel_asks_for_a_restart_in_one_line(monkeypatch, capsys):
    _, printed = run_cell(monkeypatch, capsys, upgrades={"numpy": "2.3.0", "tokenizers": "0.23.0"})
    lines = printed.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Restart the runtime"), printed
    assert "numpy 2.1.3 -> 2.3.0" in printed  # imported before the install: the kernel holds the old one
    assert "tokenizers" not in printed  # not imported yet: the new one is what the notebook will import


def test_outside_colab_the_cell_does_nothing(monkeypatch):
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: pytest.fail("pip ran outside Colab"))
    exec(compile(colab.install_cell_source(URL, COMMIT), "install-cell", "exec"), {})


def test_the_cell_names_a_full_commit_and_pinned_reads_it_back():
    with pytest.raises(ValueError, match="full 40-digit git commit hash, got 'main'"):
        colab.install_cell_source(URL, "main")
    notebook = {"cells": [colab.install_cell(URL, COMMIT)]}
    assert colab.pinned(notebook) == (URL, COMMIT)
    assert colab.problems(notebook, URL, COMMIT) == []
    other = "f" * 40
    assert "from https://github.com/o/r@fffffff" in colab.problems(notebook, URL, other)[0]


def test_package_commit_is_the_last_commit_that_changed_the_package(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                       capture_output=True)

    git("init", "-q")
    (tmp_path / "transformer_lib").mkdir()
    (tmp_path / "transformer_lib" / "a.py").write_text("x = 1\n")
    git("add", "-A")
    git("commit", "-qm", "package")
    package = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True,
                             text=True).stdout.strip()
    (tmp_path / "book.md").write_text("text\n")
    git("add", "-A")
    git("commit", "-qm", "book only")
    assert colab.package_commit(tmp_path) == package  # a commit that changes only the book does not move the pin
