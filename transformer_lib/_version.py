"""The package's version, in one place (hand-written): pyproject.toml reads it without importing the package, and
the modules that record it (scoreboard.py) import it from here rather than from the package itself."""

__version__ = "0.1.0"
