"""The profile store's SQLite file: where it lies, its layout, and whether a file is one.

Only a file that is recognisably a store is ever written (:func:`ensure_schema`): an empty
file, or an SQLite database whose only table, index, view or trigger is the store's
``profiles`` table. Anything else raises :class:`NotAProfileStore` and is left as it is.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from headrace.errors import HeadraceError

__all__ = [
    "ENV_VAR",
    "STORE_FILE",
    "STORE_SCHEMA",
    "NotAProfileStore",
    "default_store_path",
    "ensure_schema",
    "missing_home",
    "refuse_foreign_file",
    "store_file",
    "transaction",
]

ENV_VAR = "HEADRACE_PROFILE_STORE"
"""Environment variable naming the store file or its directory (overridden by an explicit
``path``)."""
STORE_FILE = "profiles.sqlite"
"""The store's file name in the default directory and in a directory given as its path."""

STORE_SCHEMA = 2
"""Layout of the SQLite file (``PRAGMA user_version`` and a column of every row); 2 added the
executor to the key (files of 1 are discarded and recreated, as any older layout)."""

_SQLITE_HEADER = b"SQLite format 3\x00"
"""The first 16 bytes of every SQLite database file."""
_STORE_COLUMNS = frozenset({"pipeline", "dataset", "machine", "profile"})
"""Columns every layout of the ``profiles`` table has had: what makes a table the store's."""


class NotAProfileStore(HeadraceError, FileExistsError):
    """The store's path names a file that is not a profile store; headrace leaves it alone."""


_CREATE = """
CREATE TABLE IF NOT EXISTS profiles (
    pipeline TEXT NOT NULL,
    dataset TEXT NOT NULL,
    machine TEXT NOT NULL,
    executor TEXT NOT NULL,
    schema_version INTEGER NOT NULL,
    created REAL NOT NULL,
    samples INTEGER NOT NULL,
    profile TEXT NOT NULL,
    PRIMARY KEY (pipeline, dataset, machine, executor)
)
"""


def default_store_path() -> Path:
    """``$HEADRACE_PROFILE_STORE`` (read as an explicit path is: see :func:`store_file`), else
    the user cache directory's ``headrace/profiles.sqlite``."""
    env = os.environ.get(ENV_VAR)
    if env:
        return store_file(env)
    return _default_dir() / STORE_FILE


def _default_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "headrace"


def store_file(path: str | os.PathLike[str]) -> Path:
    """The store file that ``path`` names: ``path`` itself, or ``path/profiles.sqlite`` where
    ``path`` is a directory (one that exists, a path ending in ``/``, or the default store's
    directory, ``<user cache>/headrace``: made a file, it kept every later job off the default
    store)."""
    raw = os.fspath(path)
    p = Path(raw).expanduser()
    if raw.endswith(("/", os.sep)) or p.is_dir() or p == _default_dir().expanduser():
        return p / STORE_FILE  # SQLite cannot open a directory
    return p


def missing_home(path: Path) -> str | None:
    """The home directory ``path`` lies under when that directory does not exist (a
    service account's ``HOME=/nonexistent``): the store is not created there, where torch
    writes nothing. ``None`` otherwise."""
    home = os.path.expanduser("~")
    if home not in ("~", "/") and not os.path.isdir(home) and str(path).startswith(home + os.sep):
        return home
    return None


def refuse_foreign_file(path: Path) -> None:
    """Raise :class:`NotAProfileStore` where ``path`` is something other than a directory's
    free name, an empty file or an SQLite database (its first 16 bytes): SQLite would call it
    corrupt, and a user's text file was replaced by a store."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(_SQLITE_HEADER))
    except FileNotFoundError:
        return
    except IsADirectoryError:
        raise NotAProfileStore(f"{path} is a directory, not a profile store") from None
    if head and head != _SQLITE_HEADER:
        raise NotAProfileStore(
            f"{path} is not a profile store (not an SQLite file): headrace leaves it alone; "
            "name another file or directory (Options(profile_store=...) or "
            f"${ENV_VAR})")


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, rolled back on any error."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def ensure_schema(conn: sqlite3.Connection, path: Path) -> bool:
    """Create or migrate the file to ``STORE_SCHEMA``; False when a newer schema owns it.
    :class:`NotAProfileStore` for a database that is not a store (its tables say)."""
    version = _recognise(conn, path)
    if version == STORE_SCHEMA:
        return True
    if version > STORE_SCHEMA:
        return False
    with transaction(conn):  # re-read under the write lock: another process may have done it
        version = _recognise(conn, path)
        if version == STORE_SCHEMA:
            return True
        if version > STORE_SCHEMA:
            return False
        # an empty database or an older store layout: its profiles are not readable here
        conn.execute("DROP TABLE IF EXISTS profiles")
        conn.execute(_CREATE)
        conn.execute(f"PRAGMA user_version = {STORE_SCHEMA}")
    return True


def _recognise(conn: sqlite3.Connection, path: Path) -> int:
    """The store schema of the database ``conn`` opened (``PRAGMA user_version``; 0: an empty
    database, to be made a store). :class:`NotAProfileStore` unless it is empty or its only
    table, view, index or trigger of its own is a ``profiles`` table with the store's
    columns. A ``user_version`` above ``STORE_SCHEMA`` is returned as it is (a newer
    headrace's store: read as empty, never written). A user's database lost every table to
    the test this replaced, ``user_version`` alone."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > STORE_SCHEMA:
        return version  # read as empty, never written: whoever wrote it keeps it as it is
    objects = conn.execute(
        "SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'").fetchall()
    if not objects:
        return 0
    columns = {r[1] for r in conn.execute("PRAGMA table_info(profiles)").fetchall()}
    if objects == [("table", "profiles")] and columns >= _STORE_COLUMNS:
        return version
    names = ", ".join(sorted(n for _, n in objects)[:5])
    raise NotAProfileStore(
        f"{path} is an SQLite database but not a profile store (it holds {names}): headrace "
        f"leaves it alone; name another file or directory (Options(profile_store=...) or "
        f"${ENV_VAR})")
