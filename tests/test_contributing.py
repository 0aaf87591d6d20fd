"""CONTRIBUTING.md is the project's design document, and the repository cites no other: no file names a design
document the repository does not contain, and every reference to a section of CONTRIBUTING.md (the file name, a
comma and the section's name in single quotes) names a heading that CONTRIBUTING.md has."""

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONTRIBUTING = ROOT / "CONTRIBUTING.md"
ABSENT = "DESIGN" + ".md"  # the design document the project once cited; spelt in two parts so this file never names it
SKIPPED = {".git", ".venv", "_build"}  # and .venv-* (the oldest-torch environment of .ci/run)
# A reference: the file, a comma, then one or more quoted section names ('A', 'B' and 'C'), all on one line.
REFERENCE = re.compile(r"CONTRIBUTING\.md, ('[^'\n]+'(?:(?:, | and )'[^'\n]+')*)")


def skipped(relative: Path) -> bool:
    return any(part in SKIPPED or part.startswith(".venv-") for part in relative.parts)


def repository_files() -> list[Path]:
    """The files git would commit (tracked, or untracked and not ignored); every file when git is not available."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                                capture_output=True, check=True).stdout.decode("utf-8").split("\0")
        paths = [Path(name) for name in listed if name]
    except (OSError, subprocess.CalledProcessError):
        paths = []
        for folder, dirs, files in os.walk(ROOT):
            dirs[:] = [d for d in dirs if not skipped(Path(d))]
            paths += [(Path(folder) / name).relative_to(ROOT) for name in files]
    return sorted({ROOT / p for p in paths if not skipped(p) and (ROOT / p).is_file()})


def headings(markdown: str) -> set[str]:
    """The text of every Markdown heading outside fenced code blocks."""
    found, fenced = set(), False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"#{1,6} (.+?)\s*#*\s*$", line)):
            found.add(match[1])
    return found


def test_no_file_names_a_design_document_the_repository_does_not_contain():
    naming = [str(path.relative_to(ROOT)) for path in repository_files() if ABSENT.encode() in path.read_bytes()]
    assert naming == [], (f"these files cite {ABSENT}, which the repository does not contain; cite a section of "
                          f"CONTRIBUTING.md instead: {naming}")


def test_every_reference_names_a_section_of_contributing():
    sections = headings(CONTRIBUTING.read_text(encoding="utf-8"))
    references, broken = [], []
    for path in repository_files():
        text = path.read_bytes().decode("utf-8", errors="replace")
        for start in (match.start() for match in re.finditer(r"CONTRIBUTING\.md,", text)):
            reference = REFERENCE.match(text, start)
            where = f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, start) + 1}"
            if reference is None:  # e.g. the quoted name broken over two lines, where this test cannot read it
                broken.append(f"{where}: put the quoted section name on the same line as the file name")
                continue
            for name in re.findall(r"'([^']+)'", reference[1]):
                references.append(name)
                if name not in sections:
                    broken.append(f"{where}: no section {name!r} in CONTRIBUTING.md")
    assert not broken, "\n".join(broken)
    assert len(references) >= 10, f"only {len(references)} references to CONTRIBUTING.md found: is the pattern wrong?"


def test_contributing_points_within_itself_to_sections_it_has():
    text = CONTRIBUTING.read_text(encoding="utf-8")
    sections = headings(text)
    assert {"Generated and hand-written code", "Adding a chapter", "Stored outputs of chapters 8 and 9",
            "The mask convention"} <= sections
    inside = re.findall(r"\(see '([^'\n]+)'", text)
    assert inside and set(inside) <= sections, set(inside) - sections


def test_the_readme_points_contributors_to_it():
    assert "[CONTRIBUTING.md](CONTRIBUTING.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
