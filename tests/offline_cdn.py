"""Serve the JavaScript that the built pages load from jsDelivr out of local npm packages (a helper, not a test).

The pages load MathJax (every page with maths) and Vega, Vega-Lite and Vega-Embed (the interactive figures) from
https://cdn.jsdelivr.net/npm/NAME@VERSION[/PATH]. Where the CDN cannot be reached, the browser tests point two
environment variables at copies fetched with `npm pack` (.ci/run shows how) and answer those requests from them:

- TRANSFORMER_BOOK_MATHJAX: the mathjax package (its es5/ folder inside);
- TRANSFORMER_BOOK_VEGA: a folder holding the packages vega/, vega-lite/ and vega-embed/, each with its
  package.json. A URL without a path (Altair writes `vega@6?noext`) gets the package's `jsdelivr` entry, as the CDN
  does. The version asked for must match the local package's (`6` matches 6.4.0, `6.4.1` only 6.4.1).

CONTRIBUTING.md, 'Interactive figures' says where the pages get this JavaScript.
"""

import contextlib
import fcntl
import functools
import json
import mimetypes
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

CDN = "https://cdn.jsdelivr.net/npm/"
MATHJAX = os.environ.get("TRANSFORMER_BOOK_MATHJAX")
VEGA = os.environ.get("TRANSFORMER_BOOK_VEGA")
VEGA_PACKAGES = ("vega", "vega-lite", "vega-embed")
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
BUILD = Path(__file__).resolve().parent.parent / "book" / "_build"
FETCHED = BUILD / "mathjax"  # where npm's MathJax is unpacked once, beside the build
FETCHED_VEGA = BUILD / "vega"  # and Vega, Vega-Lite and Vega-Embed
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]  # headless, and quiet: no calls home


@functools.cache
def local_mathjax() -> str | None:
    """A folder holding MathJax 3 (its es5/ bundle), served in place of the CDN copy the pages load, so that the maths
    can be checked without internet: TRANSFORMER_BOOK_MATHJAX, else a copy fetched earlier or now with npm (a package
    registry is reachable where the CDN may not be), else None."""
    if os.environ.get("TRANSFORMER_BOOK_MATHJAX"):
        return os.environ["TRANSFORMER_BOOK_MATHJAX"]
    package = FETCHED / "package"
    if not (package / "es5" / "tex-mml-chtml.js").is_file() and shutil.which("npm") and (BUILD / "html").is_dir():
        try:
            with _fetching():
                if not (package / "es5" / "tex-mml-chtml.js").is_file():  # another process may have fetched it
                    _npm_unpack("mathjax@3", FETCHED, "package")
        except (OSError, subprocess.SubprocessError, ValueError, tarfile.TarError):
            return None
    return str(package) if (package / "es5" / "tex-mml-chtml.js").is_file() else None


@contextlib.contextmanager
def _fetching():
    """Held while a copy is fetched: under pytest-xdist the browser tests and the explorers' tests may ask at once,
    and two npm runs unpacking into one folder would collide."""
    BUILD.mkdir(parents=True, exist_ok=True)
    with open(BUILD / ".npm-fetch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _npm_unpack(spec: str, folder: Path, name: str) -> None:
    """npm pack SPEC in folder, unpacked into folder/name (npm's tarballs hold one folder, package/)."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["npm", "pack", "--silent", spec], cwd=folder, check=True, timeout=180, capture_output=True)
    tarball = max(folder.glob(f"{spec.split('@')[0].replace('/', '-')}-*.tgz"), key=lambda p: p.stat().st_mtime)
    with tarfile.open(tarball) as archive:
        if hasattr(tarfile, "data_filter"):  # Python 3.10.12 and later: refuse links and absolute paths
            archive.extractall(folder / f".{name}", filter="data")
        else:
            archive.extractall(folder / f".{name}")  # noqa: S202 (npm's own tarball)
    (folder / f".{name}" / "package").rename(folder / name)


@functools.cache
def local_vega() -> str | None:
    """A folder holding vega/, vega-lite/ and vega-embed/ in the versions the installed Altair loads:
    TRANSFORMER_BOOK_VEGA, else copies fetched earlier or now with npm, else None."""
    if os.environ.get("TRANSFORMER_BOOK_VEGA"):
        return os.environ["TRANSFORMER_BOOK_VEGA"]
    names = ("vega", "vega-lite", "vega-embed")
    if not all((FETCHED_VEGA / name / "package.json").is_file() for name in names) and shutil.which("npm"):
        try:
            import altair

            versions = (altair.VEGA_VERSION, altair.VEGALITE_VERSION, altair.VEGAEMBED_VERSION)
            with _fetching():
                for name, version in zip(names, versions):
                    if not (FETCHED_VEGA / name / "package.json").is_file():  # nor fetched by another process
                        _npm_unpack(f"{name}@{version.lstrip('v')}", FETCHED_VEGA, name)
        except (ImportError, OSError, subprocess.SubprocessError, ValueError, tarfile.TarError):
            return None
    return str(FETCHED_VEGA) if all((FETCHED_VEGA / name / "package.json").is_file() for name in names) else None


def package_folder(name: str) -> Path | None:
    """The local copy of the npm package NAME, or None where there is none."""
    if name == "mathjax" and MATHJAX:
        return Path(MATHJAX)
    if name in VEGA_PACKAGES and VEGA:
        return Path(VEGA) / name
    return None


def local_file(url: str) -> Path:
    """The local file that answers a jsDelivr URL; ValueError, saying why, where there is none."""
    if not url.startswith(CDN):
        raise ValueError(f"{url} is not on {CDN}")
    spec, _, path = url[len(CDN) :].split("?")[0].partition("/")
    name, _, version = spec.partition("@")
    folder = package_folder(name)
    if folder is None:
        raise ValueError(f"no local copy of the npm package {name!r} (TRANSFORMER_BOOK_MATHJAX, TRANSFORMER_BOOK_VEGA)")
    meta = json.loads((folder / "package.json").read_text(encoding="utf-8"))
    if version and meta["version"] != version and not meta["version"].startswith(version + "."):
        raise ValueError(f"{url} asks for {name}@{version}, the local copy in {folder} is {meta['version']}")
    file = folder / (path or meta.get("jsdelivr") or meta.get("main") or "index.js")
    if not file.is_file():
        raise ValueError(f"{url}: {file} does not exist")
    return file


def serve_locally(page, served: list[str], refused: list[str]) -> None:
    """Answer every http(s) request of the page from the local copies; abort, and note in refused, any other."""

    def answer(route):
        url = route.request.url
        try:
            file = local_file(url)
        except ValueError as why:
            refused.append(f"{url} ({why})")
            route.abort()
            return
        served.append(url)
        route.fulfill(path=str(file), content_type=mimetypes.guess_type(file.name)[0] or "application/javascript")

    page.route(lambda url: url.startswith(("http://", "https://")), answer)


def open_offline(browser, uri: str, width: int, height: int):
    """A new page of the given size at uri, its Vega figure drawn from local files: (page, log of its errors, requests
    and the CDN files answered or refused)."""
    page = browser.new_page(viewport={"width": width, "height": height})
    log = {"errors": [], "requests": [], "served": [], "refused": []}
    page.on("pageerror", lambda error: log["errors"].append(str(error)))
    page.on("console", lambda message: message.type == "error" and log["errors"].append(message.text))
    page.on("request", lambda request: log["requests"].append(request.url))
    serve_locally(page, log["served"], log["refused"])
    page.goto(uri, wait_until="load")
    page.locator(".vega-embed svg").wait_for(timeout=30_000)
    return page, log
