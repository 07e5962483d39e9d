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
is raised (the loader then keeps its profile in memory and logs a warning naming the path). A store
SQLite finds corrupt (a bad header, a malformed page) is renamed aside as
``<name>.corrupt-<UTC time>-<pid>``, never deleted, and a new one started in its place.
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
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

from headrace.profiler.report import PipelineProfile
from headrace.profiler.store_file import (
    ENV_VAR,
    STORE_SCHEMA,
    NotAProfileStore,
    default_store_path,
    ensure_schema,
    missing_home,
    refuse_foreign_file,
    store_file,
    transaction,
)
from headrace.user_frame import warn

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
    "store_file",
]

_T = TypeVar("_T")


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
            with transaction(conn):
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
            with transaction(conn):
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
            with transaction(conn):
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
        on a new store. Corruption is a plain ``sqlite3.DatabaseError``; its subclasses are
        raised as they are: ``OperationalError`` (busy, unwritable, disk full), and the
        ``IntegrityError`` or ``ProgrammingError`` a healthy file may give, which must not set
        it aside."""
        for attempt in (0, 1):
            try:
                with self._connect() as conn:
                    return newer if conn is None else op(conn)
            except sqlite3.DatabaseError as e:
                if type(e) is not sqlite3.DatabaseError or attempt:
                    raise
                self._set_aside(e)
        raise AssertionError("unreachable")

    def _set_aside(self, e: sqlite3.DatabaseError) -> None:
        """Rename the corrupt store to ``<name>.corrupt-<UTC time>-<pid>`` (kept for whoever wants to
        look at it, as a user's own file would be), unless another process has done so."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{os.getpid()}")
        try:
            self.path.rename(aside)
        except FileNotFoundError:
            return  # another process set it aside first
        warn(f"headrace: the profile store {self.path} is corrupt ({e}); moved it to {aside} "
             "and started a new one")

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection | None]:
        """A connection with the current schema, or ``None`` for a newer headrace's file;
        :class:`NotAProfileStore` where the path names a file that is not a store."""
        home = missing_home(self.path)
        if home is not None:
            raise FileNotFoundError(f"the home directory {home} does not exist")
        refuse_foreign_file(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
        try:
            usable = ensure_schema(conn, self.path)
            yield conn if usable else None
        finally:
            conn.close()


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
