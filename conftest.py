"""Shared pytest set-up for tests/ and the notebooks that nbval runs from book/."""

import functools
import os

# Under pytest-xdist every worker (and every notebook kernel it starts) would otherwise use all cores for torch's
# thread pool; on a small machine the workers then fight over the cores and each runs many times slower.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")


# ---------------------------------------------------------------------------------------------------------------
# Notebooks the book build has already executed (tools/built_book.py): with TRANSFORMER_BOOK_BUILT=book/_build,
# nbval leaves out every notebook whose executed copy there is current and ran cleanly, and runs the others.

_BOOK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "book")


@functools.cache  # asked by the report header and by the collection: read the notebooks once
def _built_verdicts():
    """{notebook name: None (reused) or why it runs again}, or None when TRANSFORMER_BOOK_BUILT is not set."""
    build = os.environ.get("TRANSFORMER_BOOK_BUILT")
    if not build:
        return None
    from pathlib import Path

    from built_book import reusable  # tools/ is on the path: pyproject.toml, [tool.pytest.ini_options] pythonpath

    if not Path(build).is_dir():
        raise SystemExit(f"TRANSFORMER_BOOK_BUILT={build!r} is not a folder; build the book first or unset it")
    return reusable(Path(_BOOK), Path(build))


def pytest_report_header(config):
    verdicts = _built_verdicts()
    if verdicts is None:
        return None
    reused = sorted(name for name, reason in verdicts.items() if reason is None)
    lines = ["TRANSFORMER_BOOK_BUILT: already executed by the book build, not run again by nbval: "
             + (", ".join(reused) or "none")]
    lines += [f"  run by nbval: {name}, because {reason}" for name, reason in verdicts.items() if reason is not None]
    return lines


def pytest_collection_modifyitems(config, items):
    verdicts = _built_verdicts()
    if not verdicts:
        return
    reused = {os.path.join(_BOOK, name) for name, reason in verdicts.items() if reason is None}
    keep = [item for item in items if str(item.path) not in reused]
    if len(keep) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if str(item.path) in reused])
        items[:] = keep
