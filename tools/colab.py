"""Keep every notebook's Colab install cell and runtime metadata in step with the package and book/_config.yml.

    python tools/colab.py --sync             # rewrite the first cell and metadata of every book/*.ipynb
    python tools/colab.py --check            # exit 1, naming the notebooks, when one is out of step

A notebook installs the package it was written for: `transformer_lib` as of the last commit that changed the package
(`transformer_lib/` or `pyproject.toml`), from the repository URL set once in book/_config.yml (repository.url), never
"whatever main is today". A copy of a chapter (a bookmark, a course's copy, the student edition) keeps working as it
did when it was taken. After a commit that changes the package, run `--sync` and commit the notebooks: `--check` and
tests/test_book.py fail while a notebook pins an older commit. See CONTRIBUTING.md, 'Colab install cell and runtime'.

In Colab, the cell keeps Colab's own torch and numpy (it installs them pinned to the versions already there), and
after the install it compares every module the kernel had already imported with the version now installed: where one
differs (pip upgraded a package under the running kernel), it prints one line asking the reader to restart the
runtime, instead of the import errors that would follow.
Only the notebooks that use a GPU (GPU_NOTEBOOKS) ask Colab for a GPU runtime; the others run on the CPU, and asking
for a GPU there would only use up a learner's GPU quota. A notebook that needs an optional extra of the package
(NOTEBOOK_EXTRAS, e.g. lightning) installs transformer-lib[extra] instead.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"

INSTALL_TAG = "remove-cell"
PACKAGE_PATHS = ("transformer_lib", "pyproject.toml")  # what `pip install` of the repository installs

INSTALL_TEMPLATE = '''\
# In Google Colab, install the package this notebook was written for: transformer_lib as of commit {short} of the
# book's repository, keeping Colab's own torch and numpy. (Elsewhere this cell does nothing: see the README.)
import sys

if "google.colab" in sys.modules:
    import importlib
    import subprocess
    from importlib.metadata import packages_distributions, version

    owners = packages_distributions()  # module -> the distributions that provide it
    loaded = {{dist: version(dist) for name in list(sys.modules) if "." not in name for dist in owners.get(name, [])}}
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "transformer-lib{extras} @ git+{url}@{commit}",
                    *(f"{{name}}=={{version(name)}}" for name in ("torch", "numpy"))], check=True)
    importlib.invalidate_caches()
    changed = [f"{{dist}} {{old}} -> {{version(dist)}}" for dist, old in sorted(loaded.items()) if version(dist) != old]
    if changed:  # a module imported before the install (Colab imports numpy at start) is the old one until a restart
        print("Restart the runtime (Runtime > Restart session), then run all cells again: the install changed "
              + ", ".join(changed) + " under the running kernel.")'''

# The notebooks that use a GPU: the translator and its heatmaps (chapters 8 and 9) and the performance appendix.
GPU_NOTEBOOKS = frozenset({"08_translation.ipynb", "09_attention_heatmaps.ipynb", "appendix_performance.ipynb"})
GPU_METADATA = {"accelerator": "GPU", "colab": {"gpuType": "T4", "provenance": []}}
# Optional extras of the package (pyproject.toml) that a notebook needs, installed with it in Colab.
NOTEBOOK_EXTRAS = {"appendix_lightning.ipynb": ("lightning",)}
KERNEL_METADATA = {"display_name": "Python 3", "language": "python", "name": "python3"}


def repository(config_path: Path = BOOK / "_config.yml") -> tuple[str, str]:
    """The (url, branch) that book/_config.yml names for the book's repository (the branch: the launch buttons')."""
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    repo = config.get("repository") or {}
    if not repo.get("url"):
        raise ValueError(f"{config_path} has no repository.url; set it once there")
    return repo["url"].rstrip("/"), repo.get("branch", "main")


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise ValueError(f"git {' '.join(args)} failed in {root}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip()


def package_commit(root: Path = ROOT) -> str:
    """The last commit that changed the package (PACKAGE_PATHS): the commit every install cell names.

    It needs the repository's history: a shallow clone (GitHub's checkout without fetch-depth: 0) cannot say."""
    if _git(root, "rev-parse", "--is-shallow-repository") == "true":
        raise ValueError(f"{root} is a shallow clone, so the last commit that changed the package cannot be found; "
                         "fetch the history (git fetch --unshallow)")
    commit = _git(root, "log", "-1", "--format=%H", "--", *PACKAGE_PATHS)
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise ValueError(f"no commit of {root} changes {', '.join(PACKAGE_PATHS)}; commit the package first")
    return commit


def install_cell_source(url: str, commit: str, extras: tuple[str, ...] = ()) -> str:
    """The exact source of the Colab install cell for a repository URL and commit (and the package's extras)."""
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise ValueError(f"commit must be a full 40-digit git commit hash, got {commit!r}")
    return INSTALL_TEMPLATE.format(url=url, commit=commit, short=commit[:7],
                                   extras=f"[{','.join(extras)}]" if extras else "")


def install_cell(url: str, commit: str, extras: tuple[str, ...] = ()) -> dict:
    return {
        "cell_type": "code",
        "execution_count": None,
        "id": "colab-install",
        "metadata": {"tags": [INSTALL_TAG]},
        "outputs": [],
        "source": install_cell_source(url, commit, extras).splitlines(keepends=True),
    }


def is_install_cell(cell: dict) -> bool:
    return cell["cell_type"] == "code" and "google.colab" in "".join(cell["source"]) and INSTALL_TAG in cell.get(
        "metadata", {}
    ).get("tags", [])


def pinned(notebook: dict) -> tuple[str, str] | None:
    """The (url, commit) that a notebook's install cell installs the package from; None without such a cell."""
    cells = notebook.get("cells") or []
    if not cells or not is_install_cell(cells[0]):
        return None
    found = re.search(r"@ git\+(\S+?)@([0-9a-f]{40})\"", "".join(cells[0]["source"]))
    return (found.group(1), found.group(2)) if found else None


def wants_gpu(path: Path | str) -> bool:
    """True for the notebooks that use a GPU and so ask Colab for a GPU runtime."""
    return Path(path).name in GPU_NOTEBOOKS


def extras_for(path: Path | str) -> tuple[str, ...]:
    """The package extras a notebook's install cell adds, e.g. ("lightning",); none for most notebooks."""
    return NOTEBOOK_EXTRAS.get(Path(path).name, ())


def problems(notebook: dict, url: str, commit: str, gpu: bool = False, extras: tuple[str, ...] = ()) -> list[str]:
    """What is out of step in one notebook: its install cell and its metadata (a GPU runtime if and only if gpu)."""
    found = []
    cells = notebook["cells"]
    if not cells or not is_install_cell(cells[0]):
        found.append("the first cell is not the Colab install cell tagged remove-cell")
    elif "".join(cells[0]["source"]) != install_cell_source(url, commit, extras):
        wanted = f"transformer-lib[{','.join(extras)}]" if extras else "transformer-lib"
        found.append(f"the install cell does not install {wanted} from {url}@{commit[:7]} (the last commit that "
                     f"changed the package; it pins {(pinned(notebook) or ('?', 'nothing'))[1][:7]}): run "
                     f"python tools/colab.py --sync and commit the notebooks")
    if sum(is_install_cell(cell) for cell in cells) > 1:
        found.append("more than one install cell")
    meta = notebook.get("metadata", {})
    asks_for_gpu = meta.get("accelerator") == "GPU" and meta.get("colab", {}).get("gpuType") == "T4"
    if gpu and not asks_for_gpu:
        found.append("the metadata does not ask Colab for a GPU runtime")
    if not gpu and ("accelerator" in meta or "gpuType" in meta.get("colab", {})):
        found.append("the metadata asks Colab for a GPU runtime, but the notebook runs on the CPU")
    return found


def sync_notebook(path: Path, url: str, commit: str) -> bool:
    """Put the install cell first and the runtime metadata in (a GPU only for GPU_NOTEBOOKS); True if it changed."""
    text = path.read_text(encoding="utf-8")
    notebook = json.loads(text)
    cells = [cell for cell in notebook["cells"] if not is_install_cell(cell)]
    notebook["cells"] = [install_cell(url, commit, extras_for(path)), *cells]
    meta = notebook.setdefault("metadata", {})
    if wants_gpu(path):
        meta.update(json.loads(json.dumps(GPU_METADATA)))
    else:  # a CPU notebook: no accelerator, and Colab's own bookkeeping (provenance) kept
        meta.pop("accelerator", None)
        meta["colab"] = {key: value for key, value in meta.get("colab", {}).items() if key != "gpuType"}
        meta["colab"].setdefault("provenance", [])
    meta["kernelspec"] = KERNEL_METADATA
    meta.setdefault("language_info", {"name": "python"})
    new_text = json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"
    if new_text != text:
        path.write_text(new_text, encoding="utf-8")
        return True
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--sync", action="store_true", help="rewrite the install cells and metadata")
    action.add_argument("--check", action="store_true", help="report notebooks that are out of step")
    parser.add_argument("--book", type=Path, default=BOOK, help="the book folder (default: %(default)s)")
    parser.add_argument("--commit", help="install the package from this commit (default: the last commit of the "
                                         "book's repository that changed it)")
    args = parser.parse_args(argv)
    if not (args.book / "_config.yml").is_file():
        parser.error(f"--book {str(args.book)!r} is not the book's folder (it holds no _config.yml); give the folder "
                     f"of _config.yml and the notebooks, or leave --book out for {BOOK}")
    if args.commit is not None and not re.fullmatch(r"[0-9a-f]{40}", args.commit):
        parser.error(f"--commit must be a full 40-digit git commit hash, got {args.commit!r}")
    try:
        url, _ = repository(args.book / "_config.yml")
        commit = args.commit or package_commit(args.book.resolve().parent)
    except (ValueError, OSError) as error:  # no repository.url, a file that cannot be read, no history
        print(f"error: {error}", file=sys.stderr)
        return 1
    failed = False
    for path in sorted(args.book.glob("*.ipynb")):
        if args.sync:
            if sync_notebook(path, url, commit):
                print(f"synced {path.name}")
        else:
            notebook = json.loads(path.read_text(encoding="utf-8"))
            for problem in problems(notebook, url, commit, wants_gpu(path), extras_for(path)):
                print(f"{path.name}: {problem}")
                failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
