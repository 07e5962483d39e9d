"""Redis cache URLs: the schemes redis-py reads, and their passwords never printed."""

from __future__ import annotations

import pytest

import headrace as hr
from headrace.cache.config import redact
from headrace.cache.redis_outage import BackendDown, Outage


def test_tls_and_unix_socket_urls_are_accepted() -> None:
    # only redis:// was: rediss:// (TLS, which managed Redis services often require) and
    # unix:// were refused (a bug hunt)
    for url in ("redis://h:6379/0", "rediss://h:6380/0", "unix:///tmp/r.sock?db=0"):
        assert hr.Cache(url=url).url == url
        assert hr.Cache(url=url, ods=True).ods
    with pytest.raises(ValueError, match="redis://"):
        hr.Cache(url="http://h/0")


@pytest.mark.parametrize("text, shown", [
    ("redis://:pw@h:1/0", "redis://:***@h:1/0"),
    ("rediss://user:p@w@h/0", "rediss://user:***@h/0"),
    ("unix://:pw@/s.sock?db=0", "unix://:***@/s.sock?db=0"),
    ("unix:///s.sock?db=0&password=pw", "unix:///s.sock?db=0&password=***"),
    ("redis://user@h/0", "redis://user@h/0"),
    ("redis://h/0", "redis://h/0"),
    # a URL inside a message kept its password: only one at the text's start was redacted
    ("cannot reach redis://:secret@host:6379/0: Connection refused",
     "cannot reach redis://:***@host:6379/0: Connection refused"),
    ("ConnectionError: rediss://user:p@w@h:1 failed (timeout)",
     "ConnectionError: rediss://user:***@h:1 failed (timeout)"),
    ("from 'redis://:a@h/0' to 'redis://:b@h2/1'", "from 'redis://:***@h/0' to 'redis://:***@h2/1'"),
    ("to unix:///s.sock?password=pw&db=0 and back", "to unix:///s.sock?password=***&db=0 and back"),
    ("at unix:///s.sock?db=0&password=pw then refused", "at unix:///s.sock?db=0&password=*** then refused"),
    ("mail user@h: 1 of 2, at redis://h:1/0", "mail user@h: 1 of 2, at redis://h:1/0"),
])
def test_every_urls_password_is_redacted_alone_or_in_a_message(text: str, shown: str) -> None:
    assert redact(text) == shown


def test_an_outage_cause_naming_the_server_hides_its_password() -> None:
    # Outage.failed keeps the error's text for every skipped call's BackendDown
    outage = Outage()
    outage.failed(ConnectionError("cannot reach redis://:sekret@h:6379/0: refused"))
    with pytest.raises(BackendDown, match=r"redis://:\*\*\*@h:6379/0: refused") as e:
        outage.check("the server")
    assert "sekret" not in str(e.value)


def test_repr_of_the_options_hides_the_password() -> None:
    # repr(Options) printed redis://:sekret@host/0 (a bug hunt)
    cache = hr.Cache(url="redis://:sekret@h/0", budget_bytes=10)
    for text in (repr(cache), repr(hr.Options(cache=cache))):
        assert "sekret" not in text and "redis://:***@h/0" in text and "budget_bytes=10" in text
    with pytest.raises(ValueError) as e:
        hr.Cache(url="http://:sekret@h/0")
    assert "sekret" not in str(e.value)


def test_a_backend_skipping_its_server_names_it_without_the_password() -> None:
    # BackendDown's message reaches the warnings and explain() ("it failed (...)")
    from headrace.cache.redis_backend import BackendDown, RedisBackend

    backend = RedisBackend("redis://:sekret@h/0", 1)
    backend.outage.left = 1  # as after a failed call
    with pytest.raises(BackendDown) as e:
        backend._r()
    assert "sekret" not in str(e.value) and "redis://:***@h/0" in str(e.value)


def test_a_skipped_call_names_the_failure_that_started_the_outage() -> None:
    # a worker forked during the training process's outage inherits its count: its first
    # error, the one the loader logs, must still say why the server failed
    from headrace.cache.redis_backend import BackendDown, RedisBackend

    exceptions = pytest.importorskip("redis.exceptions")
    backend = RedisBackend("redis://:sekret@127.0.0.1:1/0", 1)
    with pytest.raises(exceptions.ConnectionError) as first:
        backend._call(lambda: backend._r().ping())  # nothing listens on port 1
    with pytest.raises(BackendDown) as e:
        backend._r()
    cause = str(first.value)
    assert "refused" in cause.lower() and cause in str(e.value)
    assert type(first.value).__name__ in str(e.value) and "sekret" not in str(e.value)
