"""Files that are never half-written, and files read with one clear line for what is wrong (hand-written: plumbing
the chapters call in one line each).

- `atomic_open`, `atomic_write_text`, `write_json`: a file is written beside its target under a new random name
  (created exclusively, never through a link), flushed to disk (fsync) and renamed over it with os.replace, so that
  a crash or Ctrl-C leaves either the old file or the new one, never half of one. A target that is a link or not a
  regular file is refused (`check_replaceable`): nothing is written through a link this module did not create.
  A write that does not fit (a full disk, a file-size limit, a quota) is one OSError line naming the file, why and
  how much had been written, with the old file in place.
- `read_text`, `read_json`, `read_settings_file`, `check_data_file`: a file that is not UTF-8, not JSON or not the
  JSON expected gives one line naming it and the place, not a traceback; `check_argument_text` likewise names a
  command-line sentence that was not UTF-8.
- `write_checked_json`, `read_checked_json`: an evidence file (a run's decoding.json, a scoreboard or ablation
  record, a recipe report) carries the sha256 of its own content, so that a flipped byte that still reads as a
  valid value (an alpha of 1.0 become 1.5) is refused when read instead of changing a result.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

try:
    import resource  # the file-size limit named when a write exceeds it (POSIX)
except ImportError:  # Windows
    resource = None


def _fsync_folder(folder: Path) -> None:
    """Make a rename in folder durable (POSIX); Windows cannot open a folder, and needs no such step."""
    if os.name != "posix":
        return
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


_KINDS = {stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


def check_replaceable(path: str | Path, what: str = "file") -> Path:
    """Refuse a target that an atomic write would wrongly replace: a symbolic link, or anything but a regular file.

    A rename replaces a link by a regular file (a link to /dev/stdout would stop being one) and a FIFO by a file no
    reader waits on; writing through the link instead would write where the link's owner chose. So neither is done.
    """
    path = Path(path)
    try:
        mode = path.lstat().st_mode  # lstat: the link itself, not what it points to
    except FileNotFoundError:
        return path
    if stat.S_ISLNK(mode):
        raise ValueError(f"{what} {str(path)!r} is a symbolic link (to {os.readlink(path)!r}); it is never written "
                         f"through or replaced: give the path of a regular file, or remove the link")
    if not stat.S_ISREG(mode):
        kind = _KINDS.get(stat.S_IFMT(mode), "special")
        raise ValueError(f"{what} {str(path)!r} is {kind}, not a regular file; expected a regular file or a new name")
    return path


# O_EXCL creates the file or fails, and never follows a link (even a dangling one) at that name; O_NOFOLLOW too.
_EXCLUSIVE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)


def _create_temporary(path: Path) -> tuple[int, Path]:
    """A new, empty file beside path with an unguessable name (.NAME.RANDOM.tmp), created by this call alone."""
    for _ in range(100):
        temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        try:
            return os.open(temporary, _EXCLUSIVE, 0o666), temporary  # 0o666 less the umask, as open() would
        except FileExistsError:
            continue  # taken (by chance, or planted): draw another name
    raise FileExistsError(f"could not create a temporary file beside {path}: 100 random names were taken")


@contextmanager
def atomic_open(path: str | Path, mode: str = "wb", encoding: str | None = None) -> Iterator[IO]:
    """Write a new temporary file beside path; on success flush, fsync and os.replace it onto path; else remove it.

    The temporary file is created exclusively under a random name, so no link planted in the folder is followed and
    no file of the user's (such as path.tmp) is touched. A path that is a link or not a regular file is refused.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}")
    path = check_replaceable(path)
    descriptor, temporary = _create_temporary(path)  # same folder, so that os.replace is a rename, not a copy
    try:
        try:
            with os.fdopen(descriptor, mode, encoding=encoding if mode == "w" else None) as file:
                yield file
                file.flush()
                os.fsync(file.fileno())
        except Exception as error:
            full = _no_room_error(error)
            if full is None:
                raise
            raise _no_room(path, full, temporary.stat().st_size if temporary.exists() else None) from error
        os.replace(temporary, path)
        _fsync_folder(path.parent)
    finally:
        temporary.unlink(missing_ok=True)


# The write errors of a file that does not fit: a full disk, a file-size limit (ulimit -f, or a file system's
# largest file, 4 GB on FAT32) and a used-up disk quota.
NO_ROOM = {errno.ENOSPC: "the disk is full", errno.EFBIG: "the file is larger than allowed",
           errno.EDQUOT: "the disk quota is used up"}


def _no_room_error(error: BaseException) -> OSError | None:
    """The OSError of a write that did not fit behind error, or None. torch.save reports it as a RuntimeError
    ("unexpected pos"), raised while handling the OSError of the write: its context is followed."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in NO_ROOM:
            return error
        error = error.__cause__ or error.__context__
    return None


def _size(count: int) -> str:
    """A number of bytes for people: 512 bytes, 3.2 kB, 41.0 MB, 2.1 GB."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


def _no_room(path: Path, error: OSError, written: int | None) -> OSError:
    """One line for a write that did not fit: which file, why, how much was written when it failed (the file needs
    more), and that the file is as it was before (atomic_open replaces it only once the whole of it is written)."""
    if error.errno == errno.EFBIG:
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0] if resource is not None else None
        if limit is not None and limit != resource.RLIM_INFINITY:
            why, fix = (f"it is larger than this process's file-size limit of {_size(limit)} (ulimit -f)",
                        "raise the limit (ulimit -f unlimited)")
        else:
            why, fix = "it is larger than the file system allows", "write it to another file system"
    elif error.errno == errno.ENOSPC:
        try:
            free = f" ({_size(shutil.disk_usage(path.parent).free)} free)"
        except OSError:
            free = ""
        why, fix = f"the disk is full{free}", "free some space on it, or write to another disk"
    else:
        why, fix = "the disk quota is used up", "free some space within the quota"
    needed = f"; it needs more than the {_size(written)} written when the write failed" if written else ""
    before = f"{path.name} is as it was before" if path.exists() else f"no {path.name} was written"
    failure = OSError(f"could not write {path}: {why}{needed}; {before}, and no partial file is left: {fix}, then "
                      f"run again")
    failure.errno = error.errno  # what a caller tests (with strerror set too, str() would be "[Errno 28] ...")
    return failure


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write text (UTF-8) to path atomically: readers see the old file or the new one, never a part."""
    with atomic_open(path, "w", encoding="utf-8") as file:
        file.write(text)


def strict_json(value: Any) -> Any:
    """value with every NaN or infinity replaced by None, so that json.dumps gives strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: strict_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(item) for item in value]
    return value


def write_json(path: str | Path, value: Any) -> None:
    """Write value as strict JSON (non-finite numbers become null), atomically."""
    atomic_write_text(path, json.dumps(strict_json(value), allow_nan=False) + "\n")


CHECKSUM_KEY = "sha256"  # in an evidence file: the checksum of everything else it holds


def json_checksum(record: dict) -> str:
    """sha256 of a JSON object's canonical text (keys sorted, no spaces, strict JSON), its CHECKSUM_KEY left out."""
    body = {key: value for key, value in record.items() if key != CHECKSUM_KEY}
    text = json.dumps(strict_json(body), sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def write_checked_json(path: str | Path, record: dict, indent: int | None = None) -> None:
    """Write record (a dict) as strict JSON with its checksum under CHECKSUM_KEY, atomically."""
    if not isinstance(record, dict) or CHECKSUM_KEY in record:
        raise ValueError(f"record must be a dict without a {CHECKSUM_KEY!r} key (write_checked_json adds it), got "
                         f"{type(record).__name__}")
    record = strict_json(record)
    atomic_write_text(path, json.dumps({**record, CHECKSUM_KEY: json_checksum(record)}, indent=indent,
                                       allow_nan=False, ensure_ascii=False) + "\n")


def read_checked_json(path: str | Path, what: str, writer: str) -> dict:
    """The object in a file write_checked_json wrote, without its checksum; one line naming the file when it is not
    JSON, not an object, has no checksum or fails it (changed since it was written: by hand, or a flipped byte)."""
    record = read_json(Path(path), what, writer)
    if not isinstance(record, dict):
        raise ValueError(f"{what} {str(path)!r} must hold a JSON object, got {json.dumps(record)[:60]}; write it "
                         f"again with {writer}")
    if not isinstance(record.get(CHECKSUM_KEY), str):
        raise ValueError(f"{what} {str(path)!r} has no {CHECKSUM_KEY!r} checksum (every file {writer} writes "
                         f"carries one); write it again with {writer}")
    if record[CHECKSUM_KEY] != json_checksum(record):
        raise ValueError(f"{what} {str(path)!r} fails its {CHECKSUM_KEY} checksum: it changed after {writer} wrote "
                         f"it (edited by hand, or damaged); write it again with {writer}, or remove it")
    return {key: value for key, value in record.items() if key != CHECKSUM_KEY}


NOT_TEXT_LINES = (".json", ".pt", ".pth", ".bin", ".safetensors", ".ipynb", ".py", ".md", ".toml", ".yml", ".yaml")


def is_text_lines(path: str | Path) -> bool:
    """Whether an existing file holds only lines of text, such as translations, and not a record, weights, a
    notebook or code (by its name's ending, or a first character that opens JSON): what a command that writes
    lines of text may replace."""
    path = Path(path)
    if path.suffix.lower() in NOT_TEXT_LINES:
        return False
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    return not text.lstrip().startswith(("{", "["))


def decode_text(data: bytes, what: str) -> str:
    """data as UTF-8 text, with an error naming what it is (a file, standard input) and the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise ValueError(f"{what} is not UTF-8 text (byte 0x{data[error.start]:02x} on line {line}); convert it, "
                         f"e.g. with `iconv -f latin1 -t utf-8`") from None


def check_argument_text(sentences: list[str]) -> None:
    """A sentence on the command line whose bytes were not UTF-8 (Python keeps each such byte as a lone surrogate,
    U+DC80 to U+DCFF, which the tokenizer cannot take): one line naming the sentence and the byte."""
    for number, sentence in enumerate(sentences, 1):
        bad = next((index for index, char in enumerate(sentence) if "\ud800" <= char <= "\udfff"), None)
        if bad is not None:
            code = ord(sentence[bad])
            what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"a lone surrogate, U+{code:04X},"
            raise ValueError(f"sentence {number} is not UTF-8 text ({what} at character {bad + 1}); give it as "
                             f"UTF-8 text, from a terminal set to UTF-8 (check `locale`)")


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of a file, with an error naming the file and the first bad byte when it is not UTF-8."""
    return decode_text(Path(path).read_bytes(), f"{what} {str(path)!r}")


BYTE_ORDER_MARK = "\ufeff"


def without_byte_order_mark(text: str, what: str) -> str:
    """Sentences' text without the byte order mark that some editors write first (Windows Notepad, Excel's "CSV
    UTF-8"): it says the file is UTF-8 and is no part of the first sentence, where it would be scored as a character
    (a hypothesis file with one scored 99.94 BLEU against its own text). One at the start of a later line, as `cat`
    leaves when it joins two such files, is refused in one line naming the line: reading on would score it."""
    text = text.removeprefix(BYTE_ORDER_MARK)
    later = text.find("\n" + BYTE_ORDER_MARK)
    if later >= 0:
        line = text.count("\n", 0, later) + 2
        raise ValueError(f"{what} has a byte order mark (U+FEFF) at the start of line {line}, where a file that was "
                         f"joined to another one keeps it (e.g. by `cat`); expected it only before line 1: remove it, "
                         f"e.g. with `sed -i 's/^\\xEF\\xBB\\xBF//' FILE`")
    return text


def read_lines(path: str | Path, what: str) -> list[str]:
    """The lines of a UTF-8 text file, one sentence each; an empty last line counts, the final newline does not.
    A byte order mark before the first line is read as the encoding mark it is (without_byte_order_mark)."""
    text = without_byte_order_mark(read_text(path, what), f"{what} {str(path)!r}")
    if not text:
        raise ValueError(f"{what} {str(path)!r} is empty; expected one sentence per line")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return [line.removesuffix("\r") for line in lines]


def read_json(path: Path, what: str, writer: str) -> Any:
    """The JSON value of a file this package wrote; one line naming the file (and the place of a syntax error)."""
    try:
        return json.loads(read_text(path, what))
    except (json.JSONDecodeError, RecursionError) as error:
        where = f" (line {error.lineno}, column {error.colno}: {error.msg})" if isinstance(
            error, json.JSONDecodeError) else ""
        raise ValueError(f"{what} {str(path)!r} is not valid JSON{where}; write it again with {writer}, or remove "
                         f"it") from None


def read_settings_file(path: str | Path) -> Any:
    """The JSON of a settings file (--config), with the line and column of a syntax error."""
    text = read_text(path, "--config")
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"--config {str(path)!r} is nested too deeply to read; expected an object of two levels, "
                         f'like {{"training": {{"epochs": 5}}}}') from None
    except json.JSONDecodeError as error:
        raise ValueError(f"--config {str(path)!r} is not valid JSON (line {error.lineno}, column {error.colno}: "
                         f"{error.msg}); fix the file, e.g. check it with `python -m json.tool {path}`") from None
    if not isinstance(value, dict):
        raise ValueError(f'--config {str(path)!r} must hold a JSON object like {{"training": {{"epochs": 5}}}}, '
                         f"got {json.dumps(value)[:60]}")
    return value


def check_data_file(path: str | Path) -> Path:
    """A local corpus file must be UTF-8 text with at least one line: say so, naming it, before datasets fails."""
    text = read_text(path, "data file")
    if not text.strip():
        raise ValueError(f"data file {str(path)!r} is empty; expected one JSON object per line, with a string for "
                         f"each language")
    for number, line in enumerate(text.split("\n"), 1):  # datasets' own error would be a long traceback
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as error:
            where = f" (line 1, column {error.colno}: {error.msg})" if isinstance(error, json.JSONDecodeError) else ""
            raise ValueError(f"data file {str(path)!r}: line {number} is not valid JSON{where}; expected one JSON "
                             f"object per line, with a string for each language: fix or remove that line") from None
        if not isinstance(row, dict):
            raise ValueError(f"data file {str(path)!r}: line {number} is not a JSON object but "
                             f"{type(row).__name__} {line.strip()[:60]!r}; expected one object per line, with a "
                             f"string for each language")
    return Path(path)
