"""A long container counts by all its items or the digest says it did not: its items were
hashed by a sample of 64 once the digest's item budget was spent (or 8,192 past that many),
silently, and a source holding 2,000 annotation dicts kept its cache key when 8 were
relabelled: the cache served the old labels (a review). Plain values are now hashed whole in
one pass; other items sampled make the digest incomplete, and the cache keys no form by it."""

from __future__ import annotations

import enum

import numpy as np
import pytest
import torch

import headrace as hr
from headrace.cache.tiers import TierLayout
from headrace.pipeline import digest_scope as scope_module
from headrace.pipeline.code_digest import code_identity
from headrace.pipeline.digest_scope import digest_scope


class Holds:
    def __init__(self, value) -> None:
        self.value = value

    def __call__(self, x):
        return x


class Param:
    def __init__(self, scale: float) -> None:
        self.scale = scale


class Color(enum.IntEnum):
    RED = 1


def _unsampled(n: int, k: int) -> int:
    """An index none of ``k`` evenly spaced picks of ``n`` items is (the digest's sample)."""
    picks = set(np.linspace(0, n - 1, k, dtype=np.int64).tolist())
    return next(i for i in range(n // 2, n) if i not in picks)


def _digest(value) -> tuple[str, str | None]:
    with digest_scope(complete=True) as found:  # as the sample cache's keys
        ident = code_identity(Holds(value))
    return ident, found.cut


def _annotations(n: int) -> list:
    return [{"path": f"img{i}.jpg", "label": 0, "bbox": [1.0, 2.0, 3.0, i]} for i in range(n)]


def _relabel(items: list, i: int) -> None:
    items[i]["label"] = 1


@pytest.mark.parametrize("make, change", [
    (lambda: _annotations(2_000), lambda v: _relabel(v, _unsampled(2_000, 64))),
    (lambda: _annotations(10_000), lambda v: _relabel(v, _unsampled(10_000, 8_192))),
    (lambda: {f"c{i}": [1.0, i] for i in range(2_000)},
     lambda v: v.__setitem__(f"c{_unsampled(2_000, 64)}", [0.0, 0])),
    (lambda: [{"label": np.int64(0), "box": np.zeros(4, np.float32)} for _ in range(2_000)],
     lambda v: v[_unsampled(2_000, 64)].__setitem__("label", np.int64(1))),
    (lambda: list(range(1_100_000)),
     lambda v: v.__setitem__(_unsampled(1_100_000, 1 << 18), -1)),
    (lambda: [(f"img{i}.jpg", 0) for i in range(300_000)],
     lambda v: v.__setitem__(_unsampled(300_000, 8_192), ("img.jpg", 1))),
], ids=["2,000 dicts", "10,000 dicts", "dict of lists", "numpy values", "1.1M ints",
        "300k records"])
def test_any_changed_item_of_a_long_container_of_plain_values_changes_the_digest(make, change):
    value = make()
    before, cut = _digest(value)
    assert cut is None
    assert _digest(make())[0] == before  # equal values built anew: the same digest
    change(value)
    after, cut = _digest(value)
    assert after != before and cut is None


@pytest.mark.parametrize("make", [
    lambda: [Param(1.0) for _ in range(1_500)],
    lambda: torch.nn.Sequential(*(torch.nn.Linear(2, 2) for _ in range(1_200))),
    lambda: [{"tags": {"a", "b"}} for _ in range(2_000)],  # a set: its order is per process
    lambda: [Color.RED for _ in range(2_000)] + [[1]] * 8_000,
], ids=["objects", "wide Sequential", "dicts holding sets", "IntEnum"])
def test_a_long_container_of_other_items_is_recorded_as_sampled(make) -> None:
    _, cut = _digest(make())
    assert cut is not None and "hashed by a sample" in cut


def test_plain_values_past_the_digests_budget_are_recorded_as_sampled(monkeypatch) -> None:
    monkeypatch.setattr(scope_module, "TOTAL_PLAIN", 100_000)  # bytes; 2,000 dicts take more
    _, cut = _digest(_annotations(2_000))
    assert cut is not None and "hashed by a sample" in cut


class Annotated:
    def __init__(self, items: list) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def load(self, i: int) -> int:
        return self.items[i].scale


def test_no_form_is_kept_after_sampled_state_and_explain_says_how_to_key_it() -> None:
    objects = [Param(1.0) for _ in range(1_500)]
    lay = TierLayout.for_pipeline(hr.Pipeline(Annotated(objects[:4]), [
        hr.step(np.negative, name="neg"), hr.step(Holds(objects), name="table"),
        hr.step(np.negative, name="neg2")]))
    assert {t.name: t.position for t in lay.tiers} == {"encoded": 0, "decoded": 1}
    note = next(n for n in lay.notes if "step 'table' is not keyed" in n)
    assert "1,500 items of Param" in note and "plain values" in note
    lay = TierLayout.for_pipeline(hr.Pipeline(Annotated(objects), [hr.step(np.negative)]))
    assert lay.tiers == ()
    assert any("the source is not keyed" in n and "fingerprint()" in n for n in lay.notes)



def test_only_the_cache_pays_for_a_whole_digest() -> None:
    # a state dict's step identity and a stored profile's key keep the sampled digest (a
    # warning or a profile, not stale samples, and no added cost at every state_dict())
    value = _annotations(2_000)
    with digest_scope() as found:
        before = code_identity(Holds(value))
    assert found.cut is not None  # a sample, recorded
    _relabel(value, _unsampled(2_000, 64))
    assert code_identity(Holds(value)) == before
    assert _digest(value)[1] is None


def _records(n: int, root: str) -> list:
    return [(f"{root}/n{i % 1000:08d}/n{i % 1000:08d}_{i:08d}.JPEG", i % 1000) for i in range(n)]


def test_a_places365_size_list_of_paths_fits_the_plain_budget() -> None:
    # 1,803,460 (path, label) samples of 104-char paths pickle to 221 MB: past a 128 MiB
    # budget the source had no cached form at all (a review); measured from 10,000 of them
    import pickle

    sample = _records(10_000, "/" + "r" * 69)
    assert len(sample[0][0]) == 104
    assert len(pickle.dumps(sample, 3)) * 1_803_460 / 10_000 < scope_module.TOTAL_PLAIN


def test_plain_values_past_the_budget_say_so_and_suggest_a_fingerprint(monkeypatch) -> None:
    monkeypatch.setattr(scope_module, "TOTAL_PLAIN", 1 << 20)  # bytes; 30,000 dicts take 2 MB

    class Folder:
        def __init__(self) -> None:
            self.anns = _annotations(30_000)

        def __len__(self) -> int:
            return len(self.anns)

        def load(self, i: int) -> int:
            return self.anns[i]["label"]

    lay = TierLayout.for_pipeline(hr.Pipeline(Folder(), [hr.step(np.negative)]))
    assert lay.tiers == ()
    note = next(n for n in lay.notes if "the source is not keyed" in n)
    assert "over the 1 MiB" in note and "fingerprint()" in note
    assert "not all plain values" not in note and "hold its tables" not in note


def _coco(n: int, order: list) -> list:
    return [{k: {"id": i, "bbox": [1.0, 2.0, 3.0, i], "label": i % 7, "area": 4.5}[k]
             for k in order} for i in range(n)]


KEYS = ["id", "bbox", "label", "area"]


@pytest.mark.parametrize("make", [
    lambda order: _coco(10_000, order),  # one key order in each chunk
    lambda order: [d if i % 3 else dict(reversed(d.items()))  # orders mixed in a chunk
                   for i, d in enumerate(_coco(10_000, order))],
    lambda order: [{"ann": d, "n": (i, {"a": 1, "b": 2} if i % 2 else {"b": 2, "a": 1})}
                   for i, d in enumerate(_coco(10_000, order))],  # dicts in dicts and tuples
    lambda order: [{(k, 0): v for k, v in d.items()} for d in _coco(10_000, order)],  # tuple keys
    lambda order: [(i, d) for i, d in enumerate(_coco(10_000, order))],  # records of dicts
], ids=["one order", "mixed orders", "nested", "tuple keys", "records"])
def test_equal_dicts_inserted_in_another_order_give_one_digest(make) -> None:
    # a dict built from a set of strings is in another order in each process (string hashing
    # is seeded anew): equal sources got other keys, and jobs on one Redis shared no entry
    forward, cut = _digest(make(KEYS))
    assert cut is None
    assert _digest(make(KEYS[::-1]))[0] == forward
    changed = make(KEYS)
    item = changed[5_000]
    item = item[1] if type(item) is tuple else item.get("ann", item)
    item["label" if "label" in item else ("label", 0)] = -1
    assert _digest(changed)[0] != forward


def test_structured_arrays_count_by_their_fields() -> None:
    # '|V8' was the dtype of both: two tables of one bytes and other fields shared a key
    a = np.dtype([("label", "<i4"), ("weight", "<f4")])
    b = np.dtype([("weight", "<f4"), ("label", "<i4")])
    for make in (lambda dt: [np.zeros(1, dtype=dt) for _ in range(10_000)],
                 lambda dt: [np.zeros(1, dtype=dt)[0] for _ in range(10_000)]):  # np.void
        (da, cut_a), (db, cut_b) = _digest(make(a)), _digest(make(b))
        assert da != db and cut_a is None and cut_b is None
