"""Write the book's `#| export` cells into the transformer_lib package (CONTRIBUTING.md, 'Generated and hand-written code').

    python tools/export.py          # regenerate transformer_lib/<module>.py from book/*.ipynb
    python tools/export.py --check  # exit 1, naming the files, when the package differs from the notebooks
    python tools/export.py --force  # regenerate even over a generated file that was edited by hand

A notebook names its default module once, in a code cell whose leading comment lines include `#| default_exp NAME`.
Every code cell whose leading comment lines include `#| export` is copied, in notebook order and without its
`#|` lines, into transformer_lib/NAME.py under a header that names the notebook to edit. `#| export OTHER` sends
one cell to transformer_lib/OTHER.py instead: a chapter can add to the module of the idea it teaches (chapter 8's
key/value cache and beam search go to decoding.py, beside chapter 7's greedy decoding). A module gathers its cells
in book order, so a later chapter's cells come after an earlier one's, and a one-line import that an earlier cell
of the module already made is left out of the later one. Any other `#|` directive
is an error: a misspelt `#| exprot` would otherwise drop its cell from the package without a word.

Each copied cell is preceded by a marker line in the style of nbdev, `# %% ../book/03_attention.ipynb 12`: the
notebook (relative to the module) and the cell's index in it, counted from 0 over all cells, markdown included, as
nbformat counts them. A traceback that points into a generated module thus leads to the cell to change: the
nearest marker above the line. The header also records a hash of everything below it, so the exporter can tell a
generated file that was edited by hand; it refuses to overwrite one (naming the cells whose code was changed)
unless `--force` says the edit may be discarded.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
PACKAGE = ROOT / "transformer_lib"

DIRECTIVES = ("default_exp", "export")
GENERATED = "# Generated from book/"  # the first line of every generated module
HASH_PREFIX = "# sha256 of everything below this line: "
MARKER = re.compile(r"^# %% \.\./book/(?P<notebook>[^ ]+\.ipynb) (?P<cell>\d+)$", re.MULTILINE)


class HandEditedError(RuntimeError):
    """A generated module was changed by hand since the exporter wrote it."""


def _directives(source: str) -> tuple[list[str], str]:
    """Split a cell into its leading `#|` directive lines and the code after them."""
    lines = source.splitlines()
    directives = []
    while lines and lines[0].startswith("#|"):
        directives.append(lines.pop(0)[2:].strip())
    return directives, "\n".join(lines).strip("\n")


def _title(cells: list[dict]) -> str:
    for cell in cells:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return ""


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def notebook_cells(path: Path) -> tuple[str | None, str, dict[str, list[str]]]:
    """One notebook's default module, its title, and its exported blocks by target module, in cell order."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    default, targeted = None, []
    for index, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        directives, code = _directives("".join(cell["source"]))
        target = None  # None: not exported; "": to the notebook's default module; else a module name
        for directive in directives:
            words = directive.split()
            name = words[0] if words else ""
            if name not in DIRECTIVES:
                close = difflib.get_close_matches(name, DIRECTIVES, n=1)
                hint = f"; did you mean `#| {close[0]}`?" if close else ""
                raise ValueError(f"{path.name}, cell {index}: unknown directive `#| {directive}`: the exporter knows "
                                 f"{', '.join(f'`#| {d}`' for d in DIRECTIVES)}{hint}")
            module = words[1] if len(words) == 2 else ""
            if len(words) > 2 or (len(words) == 2 and not module.isidentifier()):
                raise ValueError(f"{path.name}, cell {index}: `#| {name}` takes at most one module name (a Python "
                                 f"identifier), got `#| {directive}`")
            if name == "default_exp":
                if not module:
                    raise ValueError(f"{path.name}, cell {index}: `#| default_exp` needs one module name, got {directive!r}")
                if default is not None and default != module:
                    raise ValueError(f"{path.name} names two default modules: {default!r} and {module!r}")
                default = module
            else:
                target = module
        if target is not None and code:
            if "solution" in cell.get("metadata", {}).get("tags", []):
                raise ValueError(f"{path.name}, cell {index}: a solution cell must not be exported")
            targeted.append((target, f"# %% ../book/{path.name} {index}\n{code}"))
    blocks: dict[str, list[str]] = {}
    for target, block in targeted:
        if not target and default is None:
            raise ValueError(f"{path.name} has `#| export` cells but no `#| default_exp NAME` cell")
        blocks.setdefault(target or default, []).append(block)
    return default, _title(cells), blocks


def _without_repeated_imports(blocks: list[str]) -> list[str]:
    """The blocks with every one-line top-level import that an earlier block of the module already made left out.

    Two notebooks that export to one module each import what their cells use (a notebook runs on its own), so the
    module would import some names twice.
    """
    seen, kept = set(), []
    for block in blocks:
        lines = []
        for line in block.splitlines(keepends=True):
            is_import = line.startswith(("import ", "from ")) and " import " in line + " " and "(" not in line
            if is_import and line.strip() in seen:
                continue
            seen.update([line.strip()] if is_import else [])
            lines.append(line)
        kept.append("".join(lines))
    return kept


JOB_ROW = re.compile(r"^\| `(?P<module>\w+)\.py` \| [^|]+ \| (?P<job>.+?) \|$", re.MULTILINE)


def module_jobs(contributing: Path) -> dict[str, str]:
    """Each generated module's one job, from the table of CONTRIBUTING.md, 'Generated and hand-written code'."""
    return {row["module"]: row["job"] for row in JOB_ROW.finditer(contributing.read_text(encoding="utf-8"))}


def _module_source(module: str, parts: list[tuple[str, str, list[str]]], job: str | None = None) -> str:
    """A generated module from its parts, (notebook name, notebook title, blocks), in book order.

    Its docstring says the module's job when one is given, and else the title of its notebook.
    """
    names = [name for name, _, _ in parts]
    if job is not None:
        built = " and ".join(f"book/{name}" for name in names)
        doc = f"{job[0].upper()}{job[1:]}.\n\nThe pieces built in {built}."
    elif len(parts) == 1 and parts[0][1]:
        doc = f"{parts[0][1]}: the pieces built in book/{names[0]}."
    else:
        doc = f"The {module} module: the pieces built in " + " and ".join(f"book/{name}" for name in names) + "."
    body = f'"""{doc}"""\n\n' + "\n\n\n".join(_without_repeated_imports(
        [block for _, _, blocks in parts for block in blocks])) + "\n"
    header = (
        f"{GENERATED}{' and book/'.join(names)} by tools/export.py: do not edit this file.\n"
        f"# Edit the notebook's `#| export` cells instead (each `# %%` line below names its cell), then run\n"
        f"# `python tools/export.py`.\n"
        f"{HASH_PREFIX}{_digest(body)}\n"
    )
    return header + body


def export_notebook(path: Path) -> dict[str, str]:
    """The modules one notebook exports on its own: {module name: module source}; empty when it exports nothing."""
    _, title, blocks = notebook_cells(path)
    return {module: _module_source(module, [(path.name, title, parts)]) for module, parts in blocks.items()}


def export_book(book: Path = BOOK) -> dict[str, str]:
    """Map each generated module's file name to its source, for every notebook of the book.

    A module gathers, in book order, the cells of every notebook that exports to it; a module can be the default
    (`#| default_exp`) of one notebook only. Where the book's repository has a design document, every module's
    docstring is its job as CONTRIBUTING.md, 'Generated and hand-written code' says it; a module without a row there
    is an error.
    """
    contributing = book.parent / "CONTRIBUTING.md"
    jobs = module_jobs(contributing) if contributing.is_file() else None
    parts: dict[str, list[tuple[str, str, list[str]]]] = {}
    owners: dict[str, str] = {}
    for path in sorted(book.glob("*.ipynb")):
        default, title, blocks = notebook_cells(path)
        if default is not None:
            if default in owners:
                raise ValueError(f"module {default!r} is the default module of both {owners[default]} and {path.name}")
            owners[default] = path.name
        for module, module_blocks in blocks.items():
            parts.setdefault(module, []).append((path.name, title, module_blocks))
    if jobs is not None:
        for module in parts:
            if module not in jobs:
                raise ValueError(f"transformer_lib/{module}.py has no row in the table of generated modules of "
                                 f"{contributing} ('Generated and hand-written code'); add one that says its job")
    return {f"{module}.py": _module_source(module, module_parts, jobs and jobs[module])
            for module, module_parts in parts.items()}


def _sections(source: str) -> dict[str, str]:
    """The code under each `# %%` marker of a generated module, keyed by the marker line."""
    starts = list(MARKER.finditer(source))
    return {m.group(0): source[m.end():(starts[i + 1].start() if i + 1 < len(starts) else len(source))].strip("\n")
            for i, m in enumerate(starts)}


def hand_edits(current: str, expected: str) -> list[str] | None:
    """None if `current` is as the exporter wrote it (whatever the notebooks say now); otherwise the places edited.

    A generated file whose hash line no longer matches what follows it was edited by hand. The places named are the
    cells whose code in the file differs from what the notebooks export now (the file's other sections are intact),
    or "its header" when only the docstring or header changed.
    """
    lines = current.split("\n")
    hash_line = next((i for i, line in enumerate(lines[:6]) if line.startswith(HASH_PREFIX)), None)
    if hash_line is None:
        return ["its header (no hash line: written by an older exporter or by hand)"]
    recorded = lines[hash_line][len(HASH_PREFIX):].strip()
    if _digest("\n".join(lines[hash_line + 1:])) == recorded:
        return None
    now = _sections(expected)
    places = []
    for marker, code in _sections(current).items():
        if now.get(marker) != code:
            match = MARKER.match(marker)
            places.append(f"book/{match['notebook']}, cell {match['cell']}")
    return places or ["its header or docstring"]


def differences(book: Path = BOOK, package: Path = PACKAGE) -> list[str]:
    """The generated files that are missing or differ in the package, plus stale generated files."""
    expected = export_book(book)
    problems = []
    for name, source in expected.items():
        path = package / name
        if not path.exists():
            problems.append(name)
        elif path.read_text(encoding="utf-8") != source:
            edits = hand_edits(path.read_text(encoding="utf-8"), source)
            problems.append(name if edits is None else f"{name} (edited by hand: {'; '.join(edits)})")
    for path in sorted(package.glob("*.py")):
        first = path.read_text(encoding="utf-8").split("\n", 1)[0]
        if first.startswith(GENERATED) and path.name not in expected:
            problems.append(f"{path.name} (generated, but no notebook exports it any more)")
    return problems


def write_package(book: Path = BOOK, package: Path = PACKAGE, force: bool = False) -> list[str]:
    """Write every generated module; refuse, before writing anything, to overwrite a module edited by hand."""
    expected = export_book(book)
    if not force:
        refused = []
        for name, source in expected.items():
            path = package / name
            if path.exists() and path.read_text(encoding="utf-8") != source:
                edits = hand_edits(path.read_text(encoding="utf-8"), source)
                if edits is not None:
                    refused.append(f"transformer_lib/{name}: {'; '.join(edits)}")
        if refused:
            raise HandEditedError(
                "generated modules were edited by hand; exporting would discard the edits:\n  " + "\n  ".join(refused)
                + "\nmove each change into the notebook cell named (the `# %%` line above the code), "
                "or run `python tools/export.py --force` to discard them")
    written = []
    for name, source in expected.items():
        path = package / name
        if not path.exists() or path.read_text(encoding="utf-8") != source:
            path.write_text(source, encoding="utf-8")
            written.append(name)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only report differences; exit 1 if there are any")
    parser.add_argument("--force", action="store_true", help="overwrite generated modules even if edited by hand")
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = differences()
            for problem in problems:
                print(f"out of date: transformer_lib/{problem}")
            if problems:
                print("run `python tools/export.py` and commit the result")
            return 1 if problems else 0
        written = write_package(force=args.force)
    except (ValueError, HandEditedError) as error:
        print(f"tools/export.py: {error}", file=sys.stderr)
        return 1
    for name in written:
        print(f"wrote transformer_lib/{name}")
    print(f"{len(written)} module(s) written" if written else "the package is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
