"""What a fleet costs its store per attempt, and the multi-key check-and-set
every backend offers (``check_and_set_raw``).

Round trips are counted through a Redis client that counts what it sends:
each command, and each pipeline as one. In the steady state an attempt is
admitted in one (the view from the fleet's cache, checked and the changed
snapshots written by one script) and recorded in one (the breaker's next snapshot
computed from the fleet's cached one and written by the same script); when
another process wrote the breaker since, the script's answer refreshes the
cache and the outcome is recorded again without a separate read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
import redis

import retryledger
from retryledger.fleet import Fleet
from retryledger.stores import MemoryStore, RedisStore, Row

from conftest import KEY, FakeClock
from fleet_support import BREAKER, fleet_policy, make_store, namespace, redis_url

EPOCH = 1_780_000_000_000
SCOPE = "tenant-7/summaries"
BUDGET: Dict[str, Any] = {"scope": SCOPE, "ratio_permille": 500, "floor_per_second": 1, "max_tokens": 3}
BACKENDS = ["memory", "sqlite", "redis", "postgres"]


class CountingRedis(redis.Redis):
    """A Redis client that counts its round trips: each command sent, and
    each pipeline (sent at once) as one; ``sent`` names them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: List[str] = []

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.sent.append(str(args[0]).upper())
        return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        execute = pipe.execute
        sent = self.sent

        def counted(raise_on_error: bool = True) -> Any:
            sent.append("PIPELINE")
            return execute(raise_on_error)

        setattr(pipe, "execute", counted)
        return pipe


def counting_fleet() -> Tuple[CountingRedis, Fleet]:
    client = CountingRedis.from_url(redis_url())
    assert isinstance(client, CountingRedis)
    return client, Fleet(RedisStore(client), namespace=namespace())


def one_run(policy: retryledger.Policy, fleet: Fleet, epoch: int = EPOCH) -> str:
    clock = FakeClock()
    r = retryledger.run(
        policy, lambda step: "ok", KEY, fleet=fleet, clock=clock, sleep=clock.sleep, wall_clock=lambda: epoch + clock.now
    )
    return r.terminal


def test_redis_steady_state_one_round_trip_to_admit_and_one_to_record() -> None:
    client, fleet = counting_fleet()
    policy = retryledger.Policy(fleet_policy(breaker=BREAKER, budget=dict(BUDGET, max_tokens=1000)))
    one_run(policy, fleet)  # loads the script, fills the cache
    session = policy.session()
    del client.sent[:]
    fleet.admit(session, policy, 0, EPOCH + 1)
    admission = list(client.sent)
    assert admission == ["EVALSHA"]  # the breakers checked, the budget's deposit
    dispatch = session.next()
    assert isinstance(dispatch, retryledger.Dispatch)
    session.observe(0, 10, None, retryledger.Facts(result="returned"))
    del client.sent[:]
    assert fleet.record(session, policy, EPOCH + 2, dispatch.route_release_sha256) is not None
    assert client.sent == ["EVALSHA"]  # from the cached breaker, no read
    # Whole runs: two round trips per one-attempt run.
    del client.sent[:]
    for i in range(20):
        assert one_run(policy, fleet, EPOCH + 10 + i) == "completed"
    assert len(client.sent) == 2 * 20
    assert fleet.conflicts == 0


def test_redis_a_breaker_only_policy_admits_in_one_round_trip() -> None:
    client, fleet = counting_fleet()
    policy = retryledger.Policy(fleet_policy(breaker=BREAKER))
    one_run(policy, fleet)
    del client.sent[:]
    for i in range(10):
        assert one_run(policy, fleet, EPOCH + 10 + i) == "completed"
    # A closed breaker admits without a write: the breakers checked, then the record.
    assert client.sent == ["EVALSHA", "EVALSHA"] * 10


def test_a_stale_cache_is_refreshed_from_the_scripts_answer_without_a_read() -> None:
    client, fleet = counting_fleet()
    other = Fleet(RedisStore(url=redis_url()), namespace=fleet.namespace)  # another process
    policy = retryledger.Policy(fleet_policy(breaker=BREAKER))
    one_run(policy, fleet)
    session = policy.session()
    fleet.admit(session, policy, 0, EPOCH + 1)
    dispatch = session.next()
    assert isinstance(dispatch, retryledger.Dispatch)
    release = dispatch.route_release_sha256
    # Between this admission and its record, the other process records an
    # outcome in the same breaker: this fleet's cached snapshot is stale.
    other_session = policy.session()
    other.admit(other_session, policy, 0, EPOCH + 1)
    other_session.observe(0, 5, None, retryledger.Facts(result="returned"))
    written = other.record(other_session, policy, EPOCH + 2, release)
    assert written is not None
    before = fleet.breaker(release)
    assert before is not None and before["window_total"] == 2
    session.observe(0, 10, None, retryledger.Facts(result="returned"))
    del client.sent[:]
    recorded = fleet.record(session, policy, EPOCH + 3, release)
    # The first script conflicted and answered the current snapshot; the
    # outcome was recorded on it by a second script, with no read between.
    assert client.sent == ["EVALSHA", "EVALSHA"]
    assert fleet.conflicts == 1
    assert recorded is not None and recorded["window_total"] == 3
    assert fleet.breaker(release) == recorded


@pytest.mark.parametrize("backend", BACKENDS)
def test_check_and_set_writes_when_every_generation_is_the_one_expected(backend: str, tmp_path: Path) -> None:
    store: Any = make_store(backend, tmp_path)
    ns = namespace()
    a, b, c = f"{ns}/a", f"{ns}/b", f"{ns}/c"
    assert store.compare_and_set(b, 0, {"b": 1}) == (True, 1)
    assert store.check_and_set_raw([(a, 0, '{"a":1}'), (b, 1, None), (c, 0, '{"c":1}')]) == (True, [])
    assert [store.get(k) for k in (a, b, c)] == [({"a": 1}, 1), ({"b": 1}, 1), ({"c": 1}, 1)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_check_and_set_a_stale_check_writes_nothing_and_answers_every_key(backend: str, tmp_path: Path) -> None:
    store: Any = make_store(backend, tmp_path)
    ns = namespace()
    a, b = f"{ns}/a", f"{ns}/b"
    assert store.compare_and_set(b, 0, {"b": 1}) == (True, 1)
    assert store.compare_and_set(b, 1, {"b": 2}) == (True, 2)
    ok, rows = store.check_and_set_raw([(a, 0, '{"a":1}'), (b, 1, None)])
    assert not ok
    assert [(None if t is None else t.replace(" ", ""), g) for t, g in rows] == [(None, 0), ('{"b":2}', 2)]
    assert store.get(a) == (None, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_check_and_set_writes_in_order_up_to_the_first_conflict(backend: str, tmp_path: Path) -> None:
    store: Any = make_store(backend, tmp_path)
    ns = namespace()
    budget, breaker = f"{ns}/budget", f"{ns}/breaker"
    assert store.compare_and_set(breaker, 0, {"v": 1}) == (True, 1)
    ok, rows = store.check_and_set_raw([(budget, 0, '{"v":1}'), (breaker, 0, '{"v":2}')])
    assert not ok
    # The budget's write stays, the breaker's did not happen.
    assert [(None if t is None else t.replace(" ", ""), g) for t, g in rows] == [('{"v":1}', 1), ('{"v":1}', 1)]
    assert store.get(budget) == ({"v": 1}, 1)
    assert store.get(breaker) == ({"v": 1}, 1)


def test_a_write_the_store_refused_is_not_lost_state() -> None:
    """The session counts the snapshots it read as seen, not those it asked
    to write: when a write is refused (another key of the admission
    conflicted) and its key did not move, admitting again under the store's
    state is an ordinary admission, not a store that lost state. A snapshot
    older than one read is still refused."""
    policy = retryledger.Policy(fleet_policy(budget=BUDGET))
    session = policy.session()
    answer = session.admit(0, EPOCH, '{"breakers":{}}')
    assert answer["writes"]["budget"]["generation"] == 1
    # The deposit is not written: the budget is still absent (generation 0).
    again = session.admit(0, EPOCH, '{"breakers":{}}')
    assert again["writes"]["budget"]["generation"] == 1
    # A budget at generation 1 read, then one at generation 0: lost state.
    at_one = dict(again["writes"]["budget"])
    session.admit(0, EPOCH, json.dumps({"breakers": {}, "budget": at_one}))
    at_zero = dict(at_one, generation=0)
    with pytest.raises(retryledger.RetryledgerError) as info:
        session.admit(0, EPOCH, json.dumps({"breakers": {}, "budget": at_zero}))
    assert info.value.code == "generation_regressed"


class RecordingStore(MemoryStore):
    """A memory store that keeps every multi-key check-and-set it answers."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: List[Tuple[bool, int]] = []

    def check_and_set_raw(self, entries: List[Tuple[str, int, Any]]) -> Tuple[bool, List[Row]]:
        ok, rows = super().check_and_set_raw(entries)
        self.calls.append((ok, len(entries)))
        return ok, rows


def test_a_budget_and_a_probe_are_written_by_one_check_and_set() -> None:
    policy = retryledger.Policy(fleet_policy(breaker=BREAKER, budget=dict(BUDGET, max_tokens=1000)))
    store = RecordingStore()
    fleet = Fleet(store)
    release = str(policy.document["routes"][0]["route_release_sha256"])

    def down(step: retryledger.Step) -> str:
        if step.route_id == "private-primary":
            raise retryledger.AttemptError.retryable("unavailable")
        return "ok"

    clock = FakeClock()
    try:
        retryledger.run(
            policy, down, KEY, fleet=fleet, clock=clock, sleep=clock.sleep, wall_clock=lambda: EPOCH + clock.now
        )
    except retryledger.RunStoppedError:
        pass
    clock = FakeClock()
    retryledger.run(policy, down, KEY, fleet=fleet, clock=clock, sleep=clock.sleep, wall_clock=lambda: EPOCH + clock.now)
    opened = fleet.breaker(release)
    assert opened is not None and opened["state"] == "open"
    del store.calls[:]
    # After open_ms the primary is half-open: the admission reserves a probe
    # in its breaker and deposits into the budget, in one call (which also
    # checks the other route's breaker).
    assert one_run(policy, fleet, EPOCH + 60_000) == "completed"
    assert store.calls[0] == (True, 3)
