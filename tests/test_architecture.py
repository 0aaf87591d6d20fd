"""The package's shape (CONTRIBUTING.md, 'Generated and hand-written code'): imports run from later chapters to earlier
ones only, each chapter's module holds only what that chapter teaches, and the training code knows nothing of torchrun."""

import ast
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "transformer_lib"
HAND_WRITTEN_HELPERS = {"runtime", "runs"}  # what generated modules may import besides earlier chapters' modules


def chapter_of_each_generated_module() -> dict[str, int]:
    """Module name -> the last chapter that exports to it, read from the `# %% ../book/NN_...` markers."""
    chapters = {}
    for path in PACKAGE.glob("*.py"):
        numbers = [int(n) for n in re.findall(r"^# %% \.\./book/(\d\d)_", path.read_text(encoding="utf-8"), re.M)]
        if numbers:
            chapters[path.stem] = max(numbers)
    return chapters


def package_imports(path: Path) -> set[str]:
    """The transformer_lib modules that a file imports (transformer_lib.X -> X)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("transformer_lib."):
            names.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            names |= {a.name.split(".")[1] for a in node.names if a.name.startswith("transformer_lib.")}
    return names


def test_generated_modules_import_only_earlier_chapters_and_plain_helpers():
    chapters = chapter_of_each_generated_module()
    assert {"decoding", "data", "scoring", "translation"} <= set(chapters)
    for module, chapter in chapters.items():
        for imported in package_imports(PACKAGE / f"{module}.py"):
            if imported in chapters:
                assert chapters[imported] <= chapter, f"{module} (chapter {chapter}) imports {imported}"
            else:
                assert imported in HAND_WRITTEN_HELPERS, f"{module} (chapter {chapter}) imports hand-written {imported}"


def test_the_import_graph_has_no_cycle():
    graph = {p.stem: package_imports(p) - {p.stem} for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    done, visiting = set(), []

    def visit(node: str) -> None:
        assert node not in visiting, f"import cycle: {' -> '.join(visiting + [node])}"
        if node in done or node not in graph:
            return
        visiting.append(node)
        for nxt in graph[node]:
            visit(nxt)
        visiting.pop()
        done.add(node)

    for node in graph:
        visit(node)


def test_the_key_value_cache_lives_in_the_chapter_that_teaches_it():
    """Chapters 5 and 6 export the paper's attention and model; incremental decoding is chapter 8's."""
    for module in ("multihead", "model"):
        source = (PACKAGE / f"{module}.py").read_text(encoding="utf-8")
        assert not re.search(r"cache|static_kv", source), f"{module}.py mentions a cache"
    decoding = (PACKAGE / "decoding.py").read_text(encoding="utf-8")
    cache_cell = decoding.index("class KVCache")
    assert decoding.rfind("# %% ../book/08_", 0, cache_cell) > decoding.rfind("# %% ../book/07_", 0, cache_cell)


def test_no_chapter_cell_mentions_torchrun_helpers():
    """Several processes are the appendix's: chapters 7 and 8 reach them only through a process object."""
    helpers = re.compile(r"\b(init_distributed|destroy_distributed|data_parallel|shard_batch|token_share|"
                         r"broadcast_from_main|local_device|is_main_process|launch_info)\b")
    for path in sorted((ROOT / "book").glob("0[1-9]_*.ipynb")):
        for index, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            if cell["cell_type"] == "code":
                assert not helpers.search("".join(cell["source"])), f"{path.name}, cell {index} uses a torchrun helper"
