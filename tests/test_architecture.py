"""The package's shape (CONTRIBUTING.md, 'Generated and hand-written code'): imports run from later chapters to earlier
ones only, each chapter's module holds only what that chapter teaches, and the training code knows nothing of torchrun."""

import ast
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "transformer_lib"
# what generated modules may import besides earlier chapters' modules
HAND_WRITTEN_HELPERS = {"runtime", "files", "settings", "checkpoint_checks", "runs", "guards", "_version"}


def chapter_of_each_generated_module() -> dict[str, int]:
    """Module name -> the last chapter that exports to it, read from the `# %% ../book/NN_...` markers."""
    chapters = {}
    for path in PACKAGE.glob("*.py"):
        numbers = [int(n) for n in re.findall(r"^# %% \.\./book/(\d\d)_", path.read_text(encoding="utf-8"), re.M)]
        if numbers:
            chapters[path.stem] = max(numbers)
    return chapters


def _module_files() -> dict[str, Path]:
    """Every module of the package by its dotted name under transformer_lib: 'runs', 'grading.engine', and
    '__init__' for the package itself ('grading' for grading/__init__.py)."""
    files = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts.pop()
        files[".".join(parts)] = path
    return files


def package_imports(path: Path, top_level_only: bool = False, package: str | None = None) -> set[str]:
    """The transformer_lib modules that a file imports, wherever the import statement is (a function body too):
    `from transformer_lib.X import ...` and `import transformer_lib.X` give X, `import transformer_lib` and
    `from transformer_lib import name` give __init__ (or the module `name`), `from .X import ...` (inside
    grading/) gives grading.X. top_level_only keeps the imports at the top of the file; package is the sub-package
    the file is in ('' at the top, 'grading'), by default read from its place under transformer_lib/."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    modules = set(_module_files())
    if package is None:
        package = ".".join(path.relative_to(PACKAGE).parts[:-1])

    def named(dotted: str) -> str:  # 'transformer_lib.runs' -> 'runs'; 'transformer_lib' -> '__init__'
        inner = dotted.removeprefix("transformer_lib").lstrip(".")
        return inner if inner in modules else (inner.split(".")[0] if inner else "__init__")

    names = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from .engine import ...
                base = package if node.level == 1 else ".".join(package.split(".")[: 1 - node.level])
                dotted = ".".join(part for part in ("transformer_lib", base, node.module or "") if part)
            elif node.module and (node.module == "transformer_lib" or node.module.startswith("transformer_lib.")):
                dotted = node.module
            else:
                continue
            for alias in node.names:  # `from transformer_lib import scoreboard` imports the module scoreboard
                submodule = f"{dotted}.{alias.name}".removeprefix("transformer_lib.")
                names.add(submodule if submodule in modules else named(dotted))
        elif isinstance(node, ast.Import):
            names |= {named(a.name) for a in node.names
                      if a.name == "transformer_lib" or a.name.startswith("transformer_lib.")}
    return names


def import_graph() -> dict[str, set[str]]:
    """Every module of the package -> the package modules it imports (itself left out)."""
    return {name: package_imports(path) - {name} for name, path in _module_files().items()}


def test_generated_modules_import_only_earlier_chapters_and_plain_helpers():
    chapters = chapter_of_each_generated_module()
    assert {"decoding", "data", "scoring", "translation"} <= set(chapters)
    for module, chapter in chapters.items():
        for imported in package_imports(PACKAGE / f"{module}.py"):
            if imported in chapters:
                assert chapters[imported] <= chapter, f"{module} (chapter {chapter}) imports {imported}"
            else:
                assert imported in HAND_WRITTEN_HELPERS, f"{module} (chapter {chapter}) imports hand-written {imported}"


def test_the_hand_written_helpers_reach_nothing_a_chapter_may_not_import():
    """A generated module may import the helpers (runs.py, guards.py, ...); so each of them, and whatever it imports in
    turn, wherever in the file, must stay among the helpers (never distributed.py, grading or cli.py)."""
    graph = import_graph()
    for helper in sorted(HAND_WRITTEN_HELPERS):
        reached, pending = set(), [helper]
        while pending:
            for nxt in graph.get(pending.pop(), set()) - reached:
                reached.add(nxt)
                pending.append(nxt)
        chapters = chapter_of_each_generated_module()
        assert reached <= HAND_WRITTEN_HELPERS, f"{helper} reaches {sorted(reached - HAND_WRITTEN_HELPERS)}" + (
            " (a chapter's module)" if reached & set(chapters) else "")


def test_the_package_imports_its_own_modules_at_the_top_of_each_file():
    """An import inside a function hides an arrow of the graph from a reader (and from a glance at the file's top);
    the package's own modules are imported at the top. (Optional libraries, such as altair, may be imported late.)"""
    for name, path in _module_files().items():
        late = package_imports(path) - package_imports(path, top_level_only=True)
        assert not late, f"{path.relative_to(ROOT)} imports {sorted(late)} inside a function"


def test_the_import_graph_has_no_cycle():
    """__init__ included: a module that imports `transformer_lib` itself, while __init__ imports it, is a loop."""
    graph = import_graph()
    done, visiting = set(), []

    def visit(node: str) -> None:
        assert node not in visiting, f"import cycle: {' -> '.join(visiting + [node])}"
        if node in done or node not in graph:
            return
        visiting.append(node)
        for nxt in sorted(graph[node]):
            visit(nxt)
        visiting.pop()
        done.add(node)

    for node in sorted(graph):
        visit(node)


def test_the_graph_sees_every_kind_of_import(tmp_path):
    """The reader of imports itself: a bare `import transformer_lib`, a module imported by name from the package,
    a relative import inside grading/ and an import inside a function all count."""
    sample = tmp_path / "engine.py"
    sample.write_text("import transformer_lib\nfrom transformer_lib import scoreboard, Transformer\n"
                      "from . import ch03_attention\nfrom .engine import _run\n\n\ndef f():\n"
                      "    from transformer_lib.files import atomic_open\n", encoding="utf-8")
    assert package_imports(sample, package="grading") == {"__init__", "scoreboard", "grading.ch03_attention",
                                                          "grading.engine", "files"}
    assert package_imports(sample, top_level_only=True, package="grading") == package_imports(
        sample, package="grading") - {"files"}


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
