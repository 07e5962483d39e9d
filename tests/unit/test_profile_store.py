"""SQLite profile store: keying, invalidation, schema handling, concurrent writers."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import sqlite3
from pathlib import Path

import pytest

from headrace.pipeline import Pipeline, step
from headrace.pipeline.runner import StepTiming
from headrace.profiler.stats import PipelineProfile, Profiler
from headrace.profiler.store import (
    ENV_VAR,
    STORE_SCHEMA,
    NotAProfileStore,
    ProfileKey,
    ProfileStore,
    default_store_path,
    machine_fingerprint,
)

KEY = ProfileKey(pipeline="pipe-a", dataset="data-a", machine="cpu-a x8")


def make_profile(scale: float = 1.0, n: int = 20) -> PipelineProfile:
    prof = Profiler(["load", "decode", "crop"])
    for i in range(n):
        timings = [StepTiming(j, scale * (j + 1) * 1e-3 * (1 + i / n), 1e-4) for j in range(3)]
        prof.observe(timings, [1000, 10_000, 2500])
    return prof.report()


class Numbers:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def load(self, index: int) -> int:
        return index


def double(x):
    return 2 * x


def triple(x):
    return 3 * x


def test_put_then_get_returns_the_same_profile(tmp_path):
    store = ProfileStore(tmp_path / "p.sqlite")
    assert store.get(KEY) is None
    prof = make_profile()
    store.put(KEY, prof)
    assert store.get(KEY) == prof
    store.put(KEY, make_profile(scale=2.0))  # replaces
    assert store.get(KEY) == make_profile(scale=2.0)
    assert store.keys() == [KEY]


def test_a_directory_given_as_the_path_holds_the_store_file(tmp_path):
    # SQLite cannot open a directory: the loader warned "unable to open database file" and
    # ran without a store (a bug hunt's find)
    store = ProfileStore(tmp_path)
    store.put(KEY, make_profile())
    assert store.path == tmp_path / "profiles.sqlite" and store.path.is_file()
    assert ProfileStore(tmp_path).get(KEY) == make_profile()
    # one not made yet, named with a trailing separator, is a directory too (a review: it
    # became a file named like the directory, and the user's makedirs under it failed)
    later = ProfileStore(f"{tmp_path}/runs/profiles/")
    later.put(KEY, make_profile())
    assert later.path == tmp_path / "runs" / "profiles" / "profiles.sqlite"
    (tmp_path / "runs" / "profiles" / "ckpt").mkdir()


def test_rejected_orders_are_merged_whichever_profile_is_kept(tmp_path):
    # a run's rejection must reach the store even where its own profile is smaller than the
    # stored one, which stays (a review: the next run ran the rejected order for an epoch)
    store = ProfileStore(tmp_path / "p.sqlite")
    assert not store.add_rejected(KEY, ("a", "b"))  # nothing stored: the run's save carries it
    store.put(KEY, make_profile(n=40))
    assert store.add_rejected(KEY, ("b", "a"))
    assert store.get(KEY).rejected_orders == (("b", "a"),)
    assert store.get(KEY).samples == 40
    small = dataclasses.replace(make_profile(n=10), rejected_orders=(("c", "d"),))
    assert not store.put(KEY, small, keep_larger=True)  # the larger stays, with both
    assert store.get(KEY).samples == 40
    assert store.get(KEY).rejected_orders == (("b", "a"), ("c", "d"))
    assert store.put(KEY, make_profile(n=50), keep_larger=True)  # a larger one keeps them
    assert store.get(KEY).rejected_orders == (("b", "a"), ("c", "d"))


@pytest.mark.parametrize("component", ["pipeline", "dataset", "machine", "executor"])
def test_a_changed_key_component_is_a_miss(tmp_path, component):
    store = ProfileStore(tmp_path / "p.sqlite")
    store.put(KEY, make_profile())
    changed = ProfileKey(**{**KEY.__dict__, component: "something-else"})
    assert store.get(changed) is None
    assert store.get(KEY) is not None


def test_key_for_pipeline_tracks_code_data_and_machine():
    base = ProfileKey.for_pipeline(Pipeline(Numbers(10), [step(double)]), machine="m1")
    same = ProfileKey.for_pipeline(Pipeline(Numbers(10), [step(double)]), machine="m1")
    assert base == same
    other_code = ProfileKey.for_pipeline(Pipeline(Numbers(10), [step(triple)]), machine="m1")
    assert other_code.pipeline != base.pipeline
    other_data = ProfileKey.for_pipeline(Pipeline(Numbers(11), [step(double)]), machine="m1")
    assert other_data.dataset != base.dataset
    here = ProfileKey.for_pipeline(Pipeline(Numbers(10), [step(double)]))
    assert here.machine == machine_fingerprint()


def test_machine_fingerprint_names_cpu_and_cores():
    import os

    fp = machine_fingerprint()
    assert fp.endswith(f" x{os.cpu_count()}") and len(fp) > 3


def test_invalidate_by_key_by_component_and_all(tmp_path):
    store = ProfileStore(tmp_path / "p.sqlite")
    keys = [ProfileKey(p, d, m) for p in ("p1", "p2") for d in ("d1",) for m in ("m1", "m2")]
    for k in keys:
        store.put(k, make_profile())
    assert store.invalidate(keys[0]) == 1 and store.get(keys[0]) is None
    assert store.invalidate(machine="m2") == 2
    assert store.keys() == [ProfileKey("p2", "d1", "m1")]
    assert store.invalidate(pipeline="nope") == 0
    assert store.invalidate() == 1 and store.keys() == []


def test_default_path_honours_env_and_xdg(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_store_path() == tmp_path / "xdg" / "headrace" / "profiles.sqlite"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_store_path() == tmp_path / "home" / ".cache" / "headrace" / "profiles.sqlite"
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "env.sqlite"))
    store = ProfileStore()
    assert store.path == tmp_path / "env.sqlite"
    store.put(KEY, make_profile())
    assert (tmp_path / "env.sqlite").is_file()
    assert ProfileStore(tmp_path / "arg.sqlite").path == tmp_path / "arg.sqlite"  # arg wins


def test_the_env_var_follows_the_directory_rule_of_the_option(tmp_path, monkeypatch):
    """``$HEADRACE_PROFILE_STORE=<dir>/`` made a FILE named like the directory, where the same
    string as ``Options(profile_store=...)`` made ``<dir>/profiles.sqlite`` (a bug hunt)."""
    monkeypatch.setenv(ENV_VAR, f"{tmp_path}/env_store/")
    store = ProfileStore()
    assert store.put(KEY, make_profile())
    assert store.path == tmp_path / "env_store" / "profiles.sqlite" and store.path.is_file()
    assert default_store_path() == store.path


def test_the_default_stores_directory_named_as_a_path_stays_a_directory(tmp_path, monkeypatch):
    """A job given ``profile_store="<cache>/headrace"`` (no slash, not made yet) made a file
    there, and every later job on the default store failed (``FileExistsError``: a bug hunt)."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    ProfileStore(tmp_path / "headrace").put(KEY, make_profile())
    assert (tmp_path / "headrace").is_dir()
    assert ProfileStore().get(KEY) == make_profile()


def test_an_older_schema_is_discarded(tmp_path):
    path = tmp_path / "p.sqlite"
    with sqlite3.connect(path) as conn:  # store schema 1: no executor column
        conn.execute("CREATE TABLE profiles (pipeline TEXT, dataset TEXT, machine TEXT, "
                     "schema_version INTEGER, created REAL, samples INTEGER, profile TEXT)")
        conn.execute("INSERT INTO profiles VALUES ('a', 'b', 'c', 1, 0, 5, '{}')")
        conn.execute("PRAGMA user_version = 1")
    conn.close()
    store = ProfileStore(path)
    assert store.get(KEY) is None
    store.put(KEY, make_profile())
    assert store.get(KEY) == make_profile()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == STORE_SCHEMA
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    conn.close()
    assert tables == {"profiles"}


@pytest.mark.parametrize("user_version", [0, STORE_SCHEMA])
def test_a_users_own_database_is_left_alone(tmp_path, user_version):
    """Given a user's SQLite database (an experiment tracker's), the store dropped every table
    of a ``user_version`` 0 file as an "older layout" (a bug hunt); now it refuses the file,
    whatever its ``user_version``, and a ``profiles`` table beside others is not the store's."""
    path = tmp_path / "experiments.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE runs (id INTEGER, loss REAL)")
        conn.execute("CREATE TABLE profiles (pipeline, dataset, machine, profile)")
        conn.executemany("INSERT INTO runs VALUES (?, ?)", [(i, 1 / (i + 1)) for i in range(100)])
        conn.execute(f"PRAGMA user_version = {user_version}")
    conn.close()
    before = path.read_bytes()
    store = ProfileStore(path)
    for call in (lambda: store.get(KEY), lambda: store.put(KEY, make_profile()), store.keys):
        with pytest.raises(NotAProfileStore, match="experiments.db.*leaves it alone"):
            call()
    assert path.read_bytes() == before


def test_a_newer_schema_is_left_alone_and_reads_empty(tmp_path):
    path = tmp_path / "p.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE future (x INTEGER)")
        conn.execute(f"PRAGMA user_version = {STORE_SCHEMA + 1}")
    conn.close()
    store = ProfileStore(path)
    store.put(KEY, make_profile())
    assert store.get(KEY) is None and store.keys() == [] and store.invalidate() == 0
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == [("future",)]
    conn.close()


def test_unreadable_rows_are_misses(tmp_path):
    store = ProfileStore(tmp_path / "p.sqlite")
    store.put(KEY, make_profile())
    with sqlite3.connect(store.path) as conn:
        conn.execute("UPDATE profiles SET profile = '{\"schema_version\": 0}'")
    conn.close()
    assert store.get(KEY) is None


def test_keep_larger_never_replaces_a_profile_of_more_samples(tmp_path):
    """The loader saves with ``keep_larger``: a resumed epoch's 180-sample profile replaced the
    300-sample one stored by the run it resumed (a bug hunt's find)."""
    store = ProfileStore(tmp_path / "p.sqlite")
    store.put(KEY, make_profile(n=30))
    assert not store.put(KEY, make_profile(scale=2.0, n=18), keep_larger=True)
    assert store.get(KEY) == make_profile(n=30)
    assert store.put(KEY, make_profile(scale=2.0, n=30), keep_larger=True)  # as many: fresher
    assert store.get(KEY) == make_profile(scale=2.0, n=30)
    assert store.put(KEY, make_profile(scale=3.0, n=18))  # without it, put replaces
    assert store.get(KEY) == make_profile(scale=3.0, n=18)


def test_keep_larger_replaces_a_larger_profile_it_cannot_read(tmp_path):
    store = ProfileStore(tmp_path / "p.sqlite")
    store.put(KEY, make_profile(n=30))
    with sqlite3.connect(store.path) as conn:
        conn.execute("UPDATE profiles SET profile = '{\"schema_version\": 0}'")
    conn.close()
    assert store.put(KEY, make_profile(n=18), keep_larger=True)
    assert store.get(KEY) == make_profile(n=18)


@pytest.mark.parametrize("text", [b"lr: 0.1\nepochs: 90\n", b'{"samples": 3}', b"x"])
def test_a_file_that_is_not_a_database_is_left_alone(tmp_path, text):
    """A text, YAML or JSON file named as the store was unlinked and replaced by a store (a bug
    hunt: ``--store`` pointing at the previous run's JSON); now it is refused, untouched."""
    path = tmp_path / "train_config.yaml"
    path.write_bytes(text)
    store = ProfileStore(path)
    with pytest.raises(NotAProfileStore, match="train_config.yaml is not a profile store"):
        store.get(KEY)
    with pytest.raises(NotAProfileStore):
        store.put(KEY, make_profile())
    assert path.read_bytes() == text
    path.write_bytes(b"")  # an empty file is a store yet to be made
    assert store.put(KEY, make_profile()) and store.get(KEY) == make_profile()


def _corrupt_store(path: Path) -> bytes:
    """A store of 200 rows whose pages after the second are overwritten (header intact)."""
    store = ProfileStore(path)
    for i in range(200):
        store.put(ProfileKey(f"p{i}" * 20, "d", "m"),
                  dataclasses.replace(make_profile(n=3), rejected_orders=((f"x{i}" * 50,),)))
    data = bytearray(path.read_bytes())
    for off in range(8192, len(data), 4096 * 3):
        data[off:off + 4096] = bytes(range(256)) * 16
    path.write_bytes(bytes(data))
    return bytes(data)


def test_a_corrupt_page_sets_the_store_aside_and_starts_anew(tmp_path):
    """A malformed page behind an intact header failed every get and put for good ("database
    disk image is malformed" from the SELECT, outside the old handler: a bug hunt); now the
    file is renamed aside, kept byte for byte, and a new store takes its place."""
    path = tmp_path / "profiles.sqlite"
    corrupt = _corrupt_store(path)
    store = ProfileStore(path)
    with pytest.warns(UserWarning, match="is corrupt .*moved it to"):
        assert store.get(ProfileKey("zz", "d", "m")) is None
    aside = list(tmp_path.glob("profiles.sqlite.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == corrupt
    assert store.put(KEY, make_profile()) and store.get(KEY) == make_profile()
    assert store.keys() == [KEY]


@pytest.mark.parametrize("text", ["null", "[]", "3"])
def test_a_row_that_is_not_a_json_object_is_a_miss(tmp_path, text):
    """Rows of valid JSON that is not an object raised AttributeError in get and put for ever
    (never replaced: a bug hunt); they are misses, replaced by the next save."""
    store = ProfileStore(tmp_path / "p.sqlite")
    store.put(KEY, make_profile(n=30))
    with sqlite3.connect(store.path) as conn:
        conn.execute("UPDATE profiles SET profile = ?", (text,))
    conn.close()
    assert store.get(KEY) is None
    assert store.put(KEY, make_profile(n=5), keep_larger=True)
    assert store.get(KEY) == make_profile(n=5)


def _writer(path: str, worker: int, n: int) -> None:
    store = ProfileStore(path)
    prof = make_profile(scale=worker + 1.0, n=5)
    for i in range(n):
        store.put(ProfileKey(f"p{i}", "d", f"m{worker}"), prof)
        store.put(ProfileKey("shared", "d", "m"), prof)  # contended row


def test_concurrent_writers_from_two_processes(tmp_path):
    path = str(tmp_path / "p.sqlite")
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(path, w, 25)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0]
    store = ProfileStore(path)
    assert len(store.keys()) == 2 * 25 + 1
    shared = store.get(ProfileKey("shared", "d", "m"))
    assert shared in (make_profile(scale=1.0, n=5), make_profile(scale=2.0, n=5))


def test_store_is_picklable_and_makes_its_directory(tmp_path):
    import pickle

    store = pickle.loads(pickle.dumps(ProfileStore(tmp_path / "a" / "b" / "p.sqlite")))
    store.put(KEY, make_profile())
    assert Path(store.path).is_file()


def test_an_error_of_a_healthy_file_does_not_set_it_aside(tmp_path):
    """Only corruption (a plain ``DatabaseError``) sets a store aside: an ``IntegrityError``, here
    from a constraint the file's table holds, is raised and the file stays where it is."""
    path = tmp_path / "p.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE profiles (pipeline TEXT, dataset TEXT, machine TEXT, "
                     "executor TEXT, schema_version INTEGER, created REAL, "
                     "samples INTEGER CHECK (samples < 10), profile TEXT)")
        conn.execute(f"PRAGMA user_version = {STORE_SCHEMA}")
    conn.close()
    with pytest.raises(sqlite3.IntegrityError):
        ProfileStore(path).put(KEY, make_profile(n=20))
    assert path.is_file() and list(tmp_path.iterdir()) == [path]
