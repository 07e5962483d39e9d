"""A loader keeps the statistics of its latest epochs only (telemetry.stats.EPOCHS_KEPT):
``next(iter(loader))`` once per step starts an epoch per step."""

from headrace.telemetry.stats import keep_latest


def test_the_oldest_entries_go_beyond_the_latest_kept():
    history = list(range(5))
    keep_latest(history, 3)
    assert history == [2, 3, 4]
    keep_latest(history, 3)
    assert history == [2, 3, 4]
