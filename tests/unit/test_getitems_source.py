"""A dataset's ``__getitems__`` read one sample at a time (``pipeline/source.py``)."""

import pytest
import torch.utils.data as tud

import headrace as hr
from headrace.pipeline.source import DatasetSource


class Columns(tud.Dataset):
    """Hugging Face's form: ``__getitems__`` returns the batch's columns."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return {"x": i}

    def __getitems__(self, indices):
        return {"x": list(indices)}


class Answers(tud.Dataset):
    """``__getitems__`` returns ``answer(indices)``."""

    def __init__(self, answer):
        self.answer = answer

    def __len__(self):
        return 4

    def __getitems__(self, indices):
        return self.answer(indices)


def test_getitems_returning_columns_says_what_it_returned_and_what_is_needed():
    # it raised "KeyError: 0" from headrace's own [0], which named neither __getitems__ nor
    # what it returned
    loader = hr.DataLoader(Columns(), batch_size=2, collate_fn=lambda b: b)
    with pytest.raises(hr.StepError) as info:
        next(iter(loader))
    text = str(info.value)
    assert info.value.step == "load" and isinstance(info.value, TypeError)
    assert "__getitems__([0]) returned a dict with keys ['x']" in text
    assert "list of one sample per index" in text
    assert "`__getitems__` is asked for one sample at a time" in text  # the README's entry
    assert "KeyError" not in text
    for answer in (lambda ix: [i * 10 for i in ix], lambda ix: tuple(i * 10 for i in ix)):
        assert DatasetSource(Answers(answer)).load(3) == 30  # one sample per index: as before


@pytest.mark.parametrize("answer, said", [
    (lambda ix: [i * 10 for i in ix] * 2, "a list of length 2"),
    (lambda ix: None, "a NoneType,"),
    (lambda ix: "ab", "a str of length 2"),
])
def test_getitems_not_giving_one_sample_names_its_answer(answer, said):
    with pytest.raises(TypeError, match="__getitems__") as info:
        DatasetSource(Answers(answer)).load(1)
    assert said in str(info.value)


class LazyBatch:
    """A batch that reads its samples when indexed (a user's lazy ``__getitems__`` answer)."""

    def __init__(self, indices):
        self.indices = indices

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, k):
        raise KeyError(f"no file for sample {self.indices[k]}")  # the dataset's own error


def test_a_lazy_batchs_own_error_reading_its_sample_is_raised_as_it_is():
    # it was taken for a wrong answer: "not a sequence holding that one sample", no cause
    with pytest.raises(KeyError, match="no file for sample 2"):
        DatasetSource(Answers(LazyBatch)).load(2)
