"""Keep every notebook's Colab install cell and runtime metadata in step with book/_config.yml.

    python tools/colab.py --sync             # rewrite the first cell and metadata of every book/*.ipynb
    python tools/colab.py --sync --branch student   # the same, installing from another branch
    python tools/colab.py --check            # exit 1, naming the notebooks, when one is out of step

The repository URL lives once in book/_config.yml (repository.url and repository.branch); see
CONTRIBUTING.md, 'Colab install cell and runtime'.
Only the notebooks that use a GPU (GPU_NOTEBOOKS) ask Colab for a GPU runtime; the others run on the CPU, and asking
for a GPU there would only use up a learner's GPU quota. A notebook that needs an optional extra of the package
(NOTEBOOK_EXTRAS, e.g. lightning) installs transformer-lib[extra] instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"

INSTALL_TAG = "remove-cell"

INSTALL_TEMPLATE = '''\
# In Google Colab, install this book's package, transformer_lib, from the book's repository.
# (Elsewhere this cell does nothing: install the package as the README says.)
import sys

if "google.colab" in sys.modules:
    import subprocess

    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "transformer-lib{extras} @ git+{url}@{branch}"],
        check=True,
    )'''

# The notebooks that use a GPU: the translator and its heatmaps (chapters 8 and 9) and the performance appendix.
GPU_NOTEBOOKS = frozenset({"08_translation.ipynb", "09_attention_heatmaps.ipynb", "appendix_performance.ipynb"})
GPU_METADATA = {"accelerator": "GPU", "colab": {"gpuType": "T4", "provenance": []}}
# Optional extras of the package (pyproject.toml) that a notebook needs, installed with it in Colab.
NOTEBOOK_EXTRAS = {"appendix_lightning.ipynb": ("lightning",)}
KERNEL_METADATA = {"display_name": "Python 3", "language": "python", "name": "python3"}


def repository(config_path: Path = BOOK / "_config.yml") -> tuple[str, str]:
    """The (url, branch) that book/_config.yml names for the book's repository."""
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    repo = config.get("repository") or {}
    if not repo.get("url"):
        raise ValueError(f"{config_path} has no repository.url; set it once there")
    return repo["url"].rstrip("/"), repo.get("branch", "main")


def install_cell_source(url: str, branch: str, extras: tuple[str, ...] = ()) -> str:
    """The exact source of the Colab install cell for a repository URL and branch (and the package's extras)."""
    return INSTALL_TEMPLATE.format(url=url, branch=branch, extras=f"[{','.join(extras)}]" if extras else "")


def install_cell(url: str, branch: str, extras: tuple[str, ...] = ()) -> dict:
    return {
        "cell_type": "code",
        "execution_count": None,
        "id": "colab-install",
        "metadata": {"tags": [INSTALL_TAG]},
        "outputs": [],
        "source": install_cell_source(url, branch, extras).splitlines(keepends=True),
    }


def is_install_cell(cell: dict) -> bool:
    return cell["cell_type"] == "code" and "google.colab" in "".join(cell["source"]) and INSTALL_TAG in cell.get(
        "metadata", {}
    ).get("tags", [])


def wants_gpu(path: Path | str) -> bool:
    """True for the notebooks that use a GPU and so ask Colab for a GPU runtime."""
    return Path(path).name in GPU_NOTEBOOKS


def extras_for(path: Path | str) -> tuple[str, ...]:
    """The package extras a notebook's install cell adds, e.g. ("lightning",); none for most notebooks."""
    return NOTEBOOK_EXTRAS.get(Path(path).name, ())


def problems(notebook: dict, url: str, branch: str, gpu: bool = False, extras: tuple[str, ...] = ()) -> list[str]:
    """What is out of step in one notebook: its install cell and its metadata (a GPU runtime if and only if gpu)."""
    found = []
    cells = notebook["cells"]
    if not cells or not is_install_cell(cells[0]):
        found.append("the first cell is not the Colab install cell tagged remove-cell")
    elif "".join(cells[0]["source"]) != install_cell_source(url, branch, extras):
        wanted = f"transformer-lib[{','.join(extras)}]" if extras else "transformer-lib"
        found.append(f"the install cell does not install {wanted} from {url}@{branch}")
    if sum(is_install_cell(cell) for cell in cells) > 1:
        found.append("more than one install cell")
    meta = notebook.get("metadata", {})
    asks_for_gpu = meta.get("accelerator") == "GPU" and meta.get("colab", {}).get("gpuType") == "T4"
    if gpu and not asks_for_gpu:
        found.append("the metadata does not ask Colab for a GPU runtime")
    if not gpu and ("accelerator" in meta or "gpuType" in meta.get("colab", {})):
        found.append("the metadata asks Colab for a GPU runtime, but the notebook runs on the CPU")
    return found


def sync_notebook(path: Path, url: str, branch: str) -> bool:
    """Put the install cell first and the runtime metadata in (a GPU only for GPU_NOTEBOOKS); True if it changed."""
    text = path.read_text(encoding="utf-8")
    notebook = json.loads(text)
    cells = [cell for cell in notebook["cells"] if not is_install_cell(cell)]
    notebook["cells"] = [install_cell(url, branch, extras_for(path)), *cells]
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
    parser.add_argument("--branch", help="install from this branch instead of the one in _config.yml")
    args = parser.parse_args(argv)
    if not (args.book / "_config.yml").is_file():
        parser.error(f"--book {str(args.book)!r} is not the book's folder (it holds no _config.yml); give the folder "
                     f"of _config.yml and the notebooks, or leave --book out for {BOOK}")
    try:
        url, branch = repository(args.book / "_config.yml")
    except (ValueError, OSError) as error:  # no repository.url, or a file that cannot be read
        print(f"error: {error}", file=sys.stderr)
        return 1
    branch = args.branch or branch
    failed = False
    for path in sorted(args.book.glob("*.ipynb")):
        if args.sync:
            if sync_notebook(path, url, branch):
                print(f"synced {path.name}")
        else:
            notebook = json.loads(path.read_text(encoding="utf-8"))
            for problem in problems(notebook, url, branch, wants_gpu(path), extras_for(path)):
                print(f"{path.name}: {problem}")
                failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
