"""The book's diagrams (tools/figures.py): up to date with their script, drawable, referenced with alt text."""

import hashlib
import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import matplotlib
import pytest

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"

import figures

# A MyST figure directive, with backticks or colons: the path, then its option lines (":alt: ...", ":name: ...").
FIGURE = re.compile(r"^(?:```|:::)\{figure\}\s+(\S+)\s*\n((?:[ \t]*:[\w-]+:.*\n)*)", re.MULTILINE)


def figure_directives() -> list[tuple[str, str, dict]]:
    """(page, path, options) for every {figure} directive in the book's notebooks and Markdown pages."""
    found = []
    pages = sorted(BOOK.glob("*.ipynb")) + sorted(BOOK.glob("*.md"))
    for page in pages:
        if page.suffix == ".ipynb":
            cells = json.loads(page.read_text())["cells"]
            texts = ["".join(c["source"]) + "\n" for c in cells if c["cell_type"] == "markdown"]
        else:
            texts = [page.read_text()]
        for text in texts:
            for match in FIGURE.finditer(text):
                options = dict(re.findall(r":([\w-]+):[ \t]*(.*)", match.group(2)))
                found.append((page.name, match.group(1), options))
    return found


def test_figures_are_up_to_date_with_their_script():
    problems = figures.problems()
    assert problems == [], "run `python tools/figures.py`:\n" + "\n".join(problems)
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "figures.py"), "--check"], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr


def test_the_out_of_date_check_fails_on_each_kind_of_drift(tmp_path):
    folder = tmp_path / "figures"
    shutil.copytree(figures.FIGURES_DIR, folder)
    assert figures.problems(folder) == []
    manifest = json.loads((folder / "manifest.json").read_text())
    names = sorted(manifest)

    # 1. the drawing code (or the library code it shows) changed: the recorded source hash no longer matches
    manifest[names[0]]["source_sha256"] = "0" * 64
    # 2. a file edited by hand
    with open(folder / names[1], "ab") as file:
        file.write(b"<!-- edited -->")
    # 3. a file missing
    (folder / names[2]).unlink()
    # 4. a stale entry that no function draws
    manifest["gone.svg"] = dict(manifest[names[3]])
    (folder / "manifest.json").write_text(json.dumps(manifest))
    problems = figures.problems(folder)
    assert len(problems) == 4, problems
    for name, words in [(names[0], "code"), (names[1], "by hand"), (names[2], "missing"), ("gone.svg", "no function")]:
        assert any(p.startswith(name) and words in p for p in problems), (name, problems)

    (folder / "manifest.json").unlink()
    assert figures.problems(folder) == [f"{folder / 'manifest.json'} is missing"]


def test_the_source_hash_follows_the_library_code_a_figure_shows(monkeypatch):
    # Giving a figure one more library dependency must change its hash, as an edit of that code would.
    name = "masks.svg"
    before = figures.source_hash(name)
    entry = dict(figures.REGISTRY[name])
    monkeypatch.setitem(figures.REGISTRY, name, {**entry, "deps": (*entry["deps"], figures.tl.target_mask)})
    assert figures.source_hash(name) != before
    assert len({figures.source_hash(n) for n in figures.REGISTRY}) == len(figures.REGISTRY)  # one hash per figure


def test_regenerating_writes_every_listed_figure(tmp_path):
    manifest = json.loads(figures.MANIFEST.read_text())
    written = figures.write_all(tmp_path)
    assert set(written) == set(manifest) == set(figures.REGISTRY)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(manifest)
    for name in manifest:
        root = ET.parse(tmp_path / name).getroot()
        assert root.tag == "{http://www.w3.org/2000/svg}svg", name
        assert written[name]["source_sha256"] == manifest[name]["source_sha256"], name
    # With the matplotlib that drew the stored files, the drawing is byte for byte the same. The beam-search tree is
    # left out: it comes from a short training run whose last bits depend on the CPU's floating-point kernels.
    same_matplotlib = all(entry["matplotlib"] == matplotlib.__version__ for entry in manifest.values())
    for name in manifest:
        if same_matplotlib and name != "beam_search_tree.svg":
            stored = hashlib.sha256((figures.FIGURES_DIR / name).read_bytes()).hexdigest()
            assert written[name]["file_sha256"] == stored, f"{name} is not drawn deterministically"


def test_every_figure_is_referenced_from_the_book_with_alt_text():
    directives = figure_directives()
    referenced = set()
    names = [options.get("name") for _, _, options in directives]
    assert len(names) == len(set(names)), f"duplicate figure names: {names}"
    for page, path, options in directives:
        assert (BOOK / path).exists(), f"{page} shows {path}, which does not exist"
        alt = options.get("alt", "")
        assert len(alt.split()) >= 12, f"{page}: {path} needs an :alt: text that describes it, got {alt!r}"
        assert options.get("name", "").startswith("fig-"), f"{page}: {path} needs a :name: fig-..."
        referenced.add(Path(path).name)
    drawn = {p.name for p in figures.FIGURES_DIR.glob("*.svg")}
    assert drawn == set(figures.REGISTRY), "every SVG in book/figures is drawn by tools/figures.py"
    assert drawn <= referenced, f"figures no page shows: {sorted(drawn - referenced)}"
    # book/figures/records/: figures drawn from measured records by benchmarks/ablations_page.py, checked there
    from_records = {p.name for p in (figures.FIGURES_DIR / "records").glob("*")}
    assert from_records == {"ablation_curves.svg"} and from_records <= referenced


def test_every_figure_sits_on_an_opaque_light_panel():
    # Readable in the light and the dark theme: under everything else lies an opaque white panel (rounded, so its
    # corners are the only transparent part), and the text on it is dark.
    for name in figures.REGISTRY:
        svg = (figures.FIGURES_DIR / name).read_text()
        axes = svg.split('<g id="axes_1">', 1)[1]
        first_patch = axes.split("</g>", 1)[0]
        assert 'style="fill: #ffffff; stroke: #c8c8c8' in first_patch, f"{name}: the first shape is not the panel"
    assert figures.PANEL == "#ffffff" and figures.INK == "#1f1f1f"



def test_drawing_into_a_file_or_a_link_is_refused(tmp_path, capsys):
    (tmp_path / "file").write_text("mine", encoding="utf-8")
    (tmp_path / "link").symlink_to(tmp_path)
    for name in ("file", "link"):
        with pytest.raises(SystemExit) as stop:
            figures.main(["--out", str(tmp_path / name)])
        assert stop.value.code == 2 and "is a file or a link" in capsys.readouterr().err
    assert (tmp_path / "file").read_text(encoding="utf-8") == "mine"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
