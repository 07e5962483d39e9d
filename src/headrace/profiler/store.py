"""Profile store: pipeline profiles kept in SQLite and reused by the next run of the same job.

FastFlow §5.2 stores its profiled metrics and reloads them when the same input pipeline runs
again, skipping the warm-up. headrace keys a profile by (pipeline fingerprint, dataset
fingerprint, machine fingerprint, executor): a change in any component is a miss, which is how
profiles are invalidated; ``invalidate`` also removes entries explicitly. The loader saves with
``put(..., keep_larger=True)``: a stored profile of more samples stays. The executor is part
of the key because worker threads and processes measure the same steps differently (a thread's
steps wait for the GIL inside their wall time): a job run both ways keeps one profile of each.

The file defaults to ``$HEADRACE_PROFILE_STORE``, else ``$XDG_CACHE_HOME/headrace/profiles.sqlite``,
else ``~/.cache/headrace/profiles.sqlite``. Every call opens its own connection, so a store is
picklable and fork-safe; writes run in ``BEGIN IMMEDIATE`` transactions (atomic, serialised
between processes by SQLite's lock, waiting up to ``timeout`` seconds). A file written by an
older store schema is discarded and recreated; one written by a newer headrace is left alone
and reads as empty. Only a file that is recognisably a store is ever written: an empty file,
or an SQLite database whose only table is the store's ``profiles``. Any other file (a user's
text, YAML or JSON, another SQLite database) is left untouched and :class:`NotAProfileStore`
is raised (the loader then keeps its profile in memory and warns, naming the path). A store
SQLite finds corrupt (a bad header, a malformed page) is renamed aside as
``<name>.corrupt-<UTC time>``, never deleted, and a new one started in its place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import platform
import sqlite3
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from headrace.errors import HeadraceError
from headrace.profiler.report import PipelineProfile

if TYPE_CHECKING:
    from headrace.pipeline.pipeline import Pipeline

__all__ = [
    "ENV_VAR",
    "STORE_SCHEMA",
    "NotAProfileStore",
    "ProfileKey",
    "ProfileStore",
    "default_store_path",
    "machine_fingerprint",
]

_T = TypeVar("_T")

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


@dataclasses.dataclass(frozen=True)
class ProfileKey:
    """Identity of a profile: what runs, on which data, on which machine (opaque strings), and
    whether worker ``"processes"`` or ``"threads"`` ran it."""

    pipeline: str
    dataset: str
    machine: str
    executor: str = "processes"

    @classmethod
    def for_pipeline(cls, pipeline: Pipeline, machine: str | None = None,
                     executor: str = "processes") -> ProfileKey:
        """Key of ``pipeline`` on this machine (``machine`` overrides the CPU fingerprint), run
        by ``executor``.

        Use the pipeline as the user declared it, before any reordering, so the next run of
        the same job finds the profile.
        """
        from headrace.pipeline.fingerprint import pipeline_fingerprint, profile_identity

        return cls(  # without the source's state (profile_identity): where the files lie, when touched
            pipeline=pipeline_fingerprint(pipeline, stateless=True),
            dataset=profile_identity(pipeline.source),
            machine=machine if machine is not None else machine_fingerprint(),
            executor=executor,
        )


@functools.lru_cache(maxsize=1)
def machine_fingerprint() -> str:
    """CPU model and logical core count, e.g. ``"AMD EPYC 7B13 x16"``.

    The model comes from ``/proc/cpuinfo`` (``model name``, or ``Hardware`` / ``cpu model`` on
    some ARM and MIPS kernels), else ``platform.processor()``, else the architecture name.
    """
    model = ""
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            fields: dict[str, str] = {}
            for line in f:
                name, sep, value = line.partition(":")
                if sep and name.strip() not in fields:
                    fields[name.strip()] = value.strip()
        model = fields.get("model name") or fields.get("Hardware") or fields.get("cpu model", "")
    model = model or platform.processor() or platform.machine() or "unknown-cpu"
    return f"{' '.join(model.split())} x{os.cpu_count() or 0}"


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


def _missing_home(path: Path) -> str | None:
    """The home directory ``path`` lies under when that directory does not exist (a
    service account's ``HOME=/nonexistent``): the store is not created there, where torch
    writes nothing. ``None`` otherwise."""
    home = os.path.expanduser("~")
    if home not in ("~", "/") and not os.path.isdir(home) and str(path).startswith(home + os.sep):
        return home
    return None


class ProfileStore:
    """Profiles in one SQLite file, keyed by :class:`ProfileKey`. Safe across processes."""

    def __init__(self, path: str | os.PathLike[str] | None = None, timeout: float = 30.0) -> None:
        """``path``: the SQLite file (created with its directory on first use), or a
        directory to hold ``profiles.sqlite`` (one that exists, or a path ending in ``/``); ``None``: the default (see
        :func:`default_store_path`). ``timeout``: seconds a call waits for another process's
        write lock before ``sqlite3.OperationalError``."""
        self.path = store_file(path) if path is not None else default_store_path()
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"ProfileStore({str(self.path)!r})"

    def get(self, key: ProfileKey) -> PipelineProfile | None:
        """The stored profile of ``key``, or ``None`` (never stored, invalidated, or unreadable)."""
        return self._run(lambda conn: self._read(conn, key), None)

    def put(self, key: ProfileKey, profile: PipelineProfile, *, keep_larger: bool = False) -> bool:
        """Store the profile of ``key``, atomically; True when it was stored. It replaces the
        one stored, unless ``keep_larger`` and that one is readable and holds more samples
        (``PipelineProfile.samples``): then the store keeps it and this call changes nothing
        but its ``rejected_orders``. Those are merged either way (an order found not to hold
        stays found, whichever profile is kept). The loader saves with ``keep_larger``
        (docs/design.md: a stored profile is replaced only by one of at least as many
        samples)."""

        def put(conn: sqlite3.Connection) -> bool:
            nonlocal profile
            with _transaction(conn):
                old = self._read(conn, key)
                if old is not None:
                    profile = _with_rejected(profile, old.rejected_orders)
                if keep_larger and old is not None and old.samples > profile.samples:
                    merged = _with_rejected(old, profile.rejected_orders)
                    if merged != old:
                        self._write(conn, key, merged)
                    return False
                self._write(conn, key, profile)
            return True

        return self._run(put, False)

    def add_rejected(self, key: ProfileKey, order: tuple[str, ...]) -> bool:
        """Record ``order`` (step names) in the stored profile of ``key``'s
        ``rejected_orders``, atomically; False when no readable profile is stored (the run's
        own save carries it then)."""

        def add(conn: sqlite3.Connection) -> bool:
            with _transaction(conn):
                old = self._read(conn, key)
                if old is None:
                    return False
                merged = _with_rejected(old, (order,))
                if merged != old:
                    self._write(conn, key, merged)
            return True

        return self._run(add, False)

    @staticmethod
    def _read(conn: sqlite3.Connection, key: ProfileKey) -> PipelineProfile | None:
        row = conn.execute(
            "SELECT profile FROM profiles WHERE pipeline=? AND dataset=? AND machine=?"
            " AND executor=? AND schema_version=?",
            (key.pipeline, key.dataset, key.machine, key.executor, STORE_SCHEMA),
        ).fetchone()
        return None if row is None else _parse(row[0])

    @staticmethod
    def _write(conn: sqlite3.Connection, key: ProfileKey, profile: PipelineProfile) -> None:
        conn.execute(
            "INSERT OR REPLACE INTO profiles VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (key.pipeline, key.dataset, key.machine, key.executor, STORE_SCHEMA, time.time(),
             profile.samples, json.dumps(profile.to_dict(), separators=(",", ":"))),
        )

    def invalidate(
        self,
        key: ProfileKey | None = None,
        *,
        pipeline: str | None = None,
        dataset: str | None = None,
        machine: str | None = None,
        executor: str | None = None,
    ) -> int:
        """Delete entries; returns how many.

        ``key`` deletes that entry; the keyword components delete every entry matching all the
        components given (e.g. ``machine=...`` forgets a machine); no argument deletes all.
        """
        if key is not None:
            pipeline, dataset, machine = key.pipeline, key.dataset, key.machine
            executor = key.executor
        given = (("pipeline", pipeline), ("dataset", dataset), ("machine", machine),
                 ("executor", executor))
        where = [(c, v) for c, v in given if v is not None]
        sql = "DELETE FROM profiles"
        if where:
            sql += " WHERE " + " AND ".join(f"{c}=?" for c, _ in where)

        def delete(conn: sqlite3.Connection) -> int:
            with _transaction(conn):
                return int(conn.execute(sql, [v for _, v in where]).rowcount)

        return self._run(delete, 0)

    def keys(self) -> list[ProfileKey]:
        """Every stored key, most recent first."""
        rows: list[tuple[str, str, str, str]] = self._run(lambda conn: conn.execute(
            "SELECT pipeline, dataset, machine, executor FROM profiles ORDER BY created DESC"
        ).fetchall(), [])
        return [ProfileKey(*r) for r in rows]

    def newer_schema(self) -> int | None:
        """The store schema of a file a newer headrace wrote (``PRAGMA user_version``, which
        this headrace reads as empty and never writes), else ``None``."""
        with contextlib.suppress(OSError, sqlite3.Error), \
                contextlib.closing(sqlite3.connect(
                    f"{self.path.resolve().as_uri()}?mode=ro", uri=True)) as c:
            version = int(c.execute("PRAGMA user_version").fetchone()[0])
            return version if version > STORE_SCHEMA else None
        return None

    def _run(self, op: Callable[[sqlite3.Connection], _T], newer: _T) -> _T:
        """``op`` on a connection to the store, ``newer`` where a newer headrace owns the file.
        A store SQLite finds corrupt, when connecting or in ``op`` (a malformed page behind an
        intact header shows only there), is set aside (:meth:`_set_aside`) and ``op`` run once
        on a new store; a busy or unwritable one raises ``sqlite3.OperationalError``."""
        for attempt in (0, 1):
            try:
                with self._connect() as conn:
                    return newer if conn is None else op(conn)
            except sqlite3.DatabaseError as e:
                if isinstance(e, sqlite3.OperationalError) or attempt:
                    raise
                self._set_aside(e)
        raise AssertionError("unreachable")

    def _set_aside(self, e: sqlite3.DatabaseError) -> None:
        """Rename the corrupt store to ``<name>.corrupt-<UTC time>`` (kept for whoever wants to
        look at it, as a user's own file would be), unless another process has done so."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{os.getpid()}")
        try:
            self.path.rename(aside)
        except FileNotFoundError:
            return  # another process set it aside first
        warnings.warn(f"headrace: the profile store {self.path} is corrupt ({e}); moved it to "
                      f"{aside} and started a new one", stacklevel=4)

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection | None]:
        """A connection with the current schema, or ``None`` for a newer headrace's file;
        :class:`NotAProfileStore` where the path names a file that is not a store."""
        home = _missing_home(self.path)
        if home is not None:
            raise FileNotFoundError(f"the home directory {home} does not exist")
        _refuse_foreign_file(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
        try:
            usable = _ensure_schema(conn, self.path)
            yield conn if usable else None
        finally:
            conn.close()


def _refuse_foreign_file(path: Path) -> None:
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


def _with_rejected(profile: PipelineProfile,
                   orders: tuple[tuple[str, ...], ...]) -> PipelineProfile:
    """``profile`` whose ``rejected_orders`` also hold ``orders`` (in the order first seen)."""
    extra = tuple(o for o in orders if o not in profile.rejected_orders)
    return (dataclasses.replace(profile, rejected_orders=profile.rejected_orders + extra)
            if extra else profile)


def _parse(text: str) -> PipelineProfile | None:
    """The profile a row holds, or ``None`` when another profile layout wrote it or it is not
    a profile at all (``null``, a list): a miss, which the next save replaces."""
    try:
        return PipelineProfile.from_dict(json.loads(text))
    except ValueError:
        return None


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, rolled back on any error."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _ensure_schema(conn: sqlite3.Connection, path: Path) -> bool:
    """Create or migrate the file to ``STORE_SCHEMA``; False when a newer schema owns it.
    :class:`NotAProfileStore` for a database that is not a store (its tables say)."""
    version = _recognise(conn, path)
    if version == STORE_SCHEMA:
        return True
    if version > STORE_SCHEMA:
        return False
    with _transaction(conn):  # re-read under the write lock: another process may have done it
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
