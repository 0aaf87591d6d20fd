"""Keep every notebook's Colab install cell and GPU-runtime metadata in step with book/_config.yml.

    python tools/colab.py --sync             # rewrite the first cell and metadata of every book/*.ipynb
    python tools/colab.py --sync --branch student   # the same, installing from another branch
    python tools/colab.py --check            # exit 1, naming the notebooks, when one is out of step

The repository URL lives once in book/_config.yml (repository.url and repository.branch); DESIGN.md, decision 9.
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
        [sys.executable, "-m", "pip", "install", "--quiet", "transformer-lib @ git+{url}@{branch}"],
        check=True,
    )'''

COLAB_METADATA = {"accelerator": "GPU", "colab": {"gpuType": "T4", "provenance": []}}
KERNEL_METADATA = {"display_name": "Python 3", "language": "python", "name": "python3"}


def repository(config_path: Path = BOOK / "_config.yml") -> tuple[str, str]:
    """The (url, branch) that book/_config.yml names for the book's repository."""
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    repo = config.get("repository") or {}
    if not repo.get("url"):
        raise ValueError(f"{config_path} has no repository.url; set it once there")
    return repo["url"].rstrip("/"), repo.get("branch", "main")


def install_cell_source(url: str, branch: str) -> str:
    """The exact source of the Colab install cell for a repository URL and branch."""
    return INSTALL_TEMPLATE.format(url=url, branch=branch)


def install_cell(url: str, branch: str) -> dict:
    return {
        "cell_type": "code",
        "execution_count": None,
        "id": "colab-install",
        "metadata": {"tags": [INSTALL_TAG]},
        "outputs": [],
        "source": install_cell_source(url, branch).splitlines(keepends=True),
    }


def is_install_cell(cell: dict) -> bool:
    return cell["cell_type"] == "code" and "google.colab" in "".join(cell["source"]) and INSTALL_TAG in cell.get(
        "metadata", {}
    ).get("tags", [])


def problems(notebook: dict, url: str, branch: str) -> list[str]:
    """What is out of step in one notebook: its install cell and its metadata."""
    found = []
    cells = notebook["cells"]
    if not cells or not is_install_cell(cells[0]):
        found.append("the first cell is not the Colab install cell tagged remove-cell")
    elif "".join(cells[0]["source"]) != install_cell_source(url, branch):
        found.append(f"the install cell does not install from {url}@{branch}")
    if sum(is_install_cell(cell) for cell in cells) > 1:
        found.append("more than one install cell")
    meta = notebook.get("metadata", {})
    if meta.get("accelerator") != "GPU" or meta.get("colab", {}).get("gpuType") != "T4":
        found.append("the metadata does not ask Colab for a GPU runtime")
    return found


def sync_notebook(path: Path, url: str, branch: str) -> bool:
    """Put the install cell first and the GPU metadata in; return True when the file changed."""
    text = path.read_text(encoding="utf-8")
    notebook = json.loads(text)
    cells = [cell for cell in notebook["cells"] if not is_install_cell(cell)]
    notebook["cells"] = [install_cell(url, branch), *cells]
    meta = notebook.setdefault("metadata", {})
    meta.update(json.loads(json.dumps(COLAB_METADATA)))
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
    url, branch = repository(args.book / "_config.yml")
    branch = args.branch or branch
    failed = False
    for path in sorted(args.book.glob("*.ipynb")):
        if args.sync:
            if sync_notebook(path, url, branch):
                print(f"synced {path.name}")
        else:
            for problem in problems(json.loads(path.read_text(encoding="utf-8")), url, branch):
                print(f"{path.name}: {problem}")
                failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
