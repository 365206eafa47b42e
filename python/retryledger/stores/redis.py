"""Registers and append logs in Redis (the ``redis`` package, ``pip install
retryledger[redis]``): each key is a hash holding the document (``d``) and the
store's generation (``g``); a compare-and-set is one Lua script, atomic on
the server, so any number of processes on any number of machines share it.

A log is one hash under ``retryledger:log:<name>`` (:data:`LOG_PREFIX`):
a field per event (its ``seq`` in decimal, the event's text as given) and
the field ``last`` (the highest ``seq``); an append is one Lua script
(``HSETNX``, then ``last``), a read one ``HGETALL`` (a log is one run's
journal: tens of events)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from . import (
    APPENDED,
    LEASE_LOST,
    Appended,
    Entry,
    LogEntry,
    Row,
    StoreUnavailableError,
    _decode,
    _encode,
    check_append,
    check_lease,
    check_log,
    check_seq,
)

if TYPE_CHECKING:  # pragma: no cover
    import redis as _redis

__all__ = ["RedisStore", "CAS_SCRIPT", "CHECK_AND_SET_SCRIPT", "APPEND_SCRIPT", "APPEND_FENCED_SCRIPT", "LOG_PREFIX"]

#: The Redis key of a log is this prefix and the log's name.
LOG_PREFIX = "retryledger:log:"

#: KEYS[1] the log, ARGV[1] the seq (decimal), ARGV[2] the event's text.
#: Returns {1} (stored) or {0, the event that holds the seq}.
APPEND_SCRIPT = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  return {0, redis.call('HGET', KEYS[1], ARGV[1])}
end
local last = redis.call('HGET', KEYS[1], 'last')
if not last or tonumber(last) < tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'last', ARGV[1])
end
return {1}
"""

#: The fenced append: KEYS[1] the log, KEYS[2] the lease register, ARGV[1]
#: the seq (decimal), ARGV[2] the event's text, ARGV[3] the lease generation.
#: Returns {2} (the lease moved: nothing written), {1} (stored) or {0, the
#: event that holds the seq}. One script, so no takeover falls between the
#: lease check and the append.
APPEND_FENCED_SCRIPT = """
if tonumber(redis.call('HGET', KEYS[2], 'g') or '0') ~= tonumber(ARGV[3]) then
  return {2}
end
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  return {0, redis.call('HGET', KEYS[1], ARGV[1])}
end
local last = redis.call('HGET', KEYS[1], 'last')
if not last or tonumber(last) < tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'last', ARGV[1])
end
return {1}
"""

#: KEYS[1] the register, ARGV[1] the expected generation, ARGV[2] the document.
#: Returns {1, new generation} or {0, current generation}.
CAS_SCRIPT = """
local g = tonumber(redis.call('HGET', KEYS[1], 'g') or '0')
if g ~= tonumber(ARGV[1]) then
  return {0, g}
end
redis.call('HSET', KEYS[1], 'd', ARGV[2], 'g', g + 1)
return {1, g + 1}
"""


#: The multi-key check-and-set. KEYS the registers; for KEYS[i], ARGV[2i-1]
#: the expected generation and ARGV[2i] the document to write ('' checks
#: only). Every check-only key is checked first: one differs, nothing is
#: written. Then the documents are written in order, each only when its
#: generation is the one expected (its generation one more), stopping at the
#: first that is not. All written: {1}; otherwise {0, document or nil,
#: generation, ...} for every key, in order, as they now are.
CHECK_AND_SET_SCRIPT = """
local n = #KEYS
local function current()
  local out = {0}
  for j = 1, n do
    local row = redis.call('HMGET', KEYS[j], 'd', 'g')
    out[2 * j] = row[1]
    out[2 * j + 1] = tonumber(row[2] or '0')
  end
  return out
end
for i = 1, n do
  if ARGV[2 * i] == '' and tonumber(redis.call('HGET', KEYS[i], 'g') or '0') ~= tonumber(ARGV[2 * i - 1]) then
    return current()
  end
end
for i = 1, n do
  local d = ARGV[2 * i]
  if d ~= '' then
    local g = tonumber(redis.call('HGET', KEYS[i], 'g') or '0')
    if g ~= tonumber(ARGV[2 * i - 1]) then
      return current()
    end
    redis.call('HSET', KEYS[i], 'd', d, 'g', g + 1)
  end
end
return {1}
"""


class RedisStore:
    """Registers in Redis. Give a ``redis.Redis`` client, or a ``url``
    (``redis://host:port/db``) with timeouts in seconds. Connection errors,
    timeouts and other Redis errors are :class:`StoreUnavailableError`."""

    __slots__ = ("_client", "_cas", "_check_and_set", "_append", "_append_fenced")

    def __init__(
        self,
        client: "Optional[_redis.Redis]" = None,
        *,
        url: Optional[str] = None,
        socket_timeout: float = 1.0,
        socket_connect_timeout: float = 1.0,
    ) -> None:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        if client is None:
            if url is None:
                raise ValueError("RedisStore needs a client or a url")
            # One immediate retry: a connection the server dropped (a restart)
            # is replaced once; an unreachable server fails within the timeouts.
            client = redis.Redis.from_url(
                url,
                socket_timeout=socket_timeout,
                socket_connect_timeout=socket_connect_timeout,
                retry=Retry(NoBackoff(), 1),
            )
        self._client: "_redis.Redis" = client
        self._cas = client.register_script(CAS_SCRIPT)
        self._check_and_set = client.register_script(CHECK_AND_SET_SCRIPT)
        self._append = client.register_script(APPEND_SCRIPT)
        self._append_fenced = client.register_script(APPEND_FENCED_SCRIPT)

    @property
    def client(self) -> "_redis.Redis":
        """The Redis client."""
        return self._client

    def get(self, key: str) -> Tuple[Optional[Dict[str, Any]], int]:
        text, generation = self.get_raw(key)
        return (None if text is None else _decode(text)), generation

    def get_many(self, keys: List[str]) -> List[Tuple[Optional[Dict[str, Any]], int]]:
        """``get`` of several keys in one round trip (a pipeline, no transaction:
        each key is read as of its own moment, as separate ``get`` calls would)."""
        return [((None if t is None else _decode(t)), g) for t, g in self.get_many_raw(keys)]

    def compare_and_set(self, key: str, expected_generation: int, document: Dict[str, Any]) -> Tuple[bool, int]:
        return self.compare_and_set_raw(key, expected_generation, _encode(document))

    def get_raw(self, key: str) -> Tuple[Optional[str], int]:
        """``get`` with the document as the JSON text stored."""
        import redis

        try:
            document, generation = self._client.hmget(key, ["d", "g"])
        except redis.RedisError as e:
            raise StoreUnavailableError(f"redis store: {e}") from e
        return _row(document, generation)

    def get_many_raw(self, keys: List[str]) -> List[Tuple[Optional[str], int]]:
        """``get_raw`` of several keys in one pipelined round trip."""
        import redis

        try:
            pipe = self._client.pipeline(transaction=False)
            for key in keys:
                pipe.hmget(key, ["d", "g"])
            rows = pipe.execute()
        except redis.RedisError as e:
            raise StoreUnavailableError(f"redis store: {e}") from e
        return [_row(document, generation) for document, generation in rows]

    def compare_and_set_raw(self, key: str, expected_generation: int, text: str) -> Tuple[bool, int]:
        """``compare_and_set`` of a document given as JSON text: one Lua script."""
        import redis

        try:
            ok, generation = self._cas(keys=[key], args=[int(expected_generation), text])
        except redis.RedisError as e:
            raise StoreUnavailableError(f"redis store: {e}") from e
        return bool(ok), int(generation)

    def check_and_set_raw(self, entries: List[Entry]) -> Tuple[bool, List[Row]]:
        """The multi-key check-and-set (see :mod:`retryledger.stores`): one Lua
        script, atomic on the server, one round trip. (Under Redis Cluster the
        keys must share a hash slot: give the fleet a namespace with a hash tag.)"""
        import redis

        keys: List[str] = []
        args: List[Any] = []
        for key, expected, text in entries:
            keys.append(key)
            args.append(int(expected))
            args.append("" if text is None else text)
        try:
            answer = self._check_and_set(keys=keys, args=args)
        except redis.RedisError as e:
            raise StoreUnavailableError(f"redis store: {e}") from e
        if int(answer[0]) == 1:
            return True, []
        return False, [_row(answer[1 + 2 * i], answer[2 + 2 * i]) for i in range(len(keys))]

    def append(self, log: str, seq: int, text: str) -> Appended:
        """Store the event under ``seq`` when it is free (see
        :class:`retryledger.stores.Log`): one Lua script."""
        import redis

        check_append(log, seq, text)
        try:
            answer = self._append(keys=[LOG_PREFIX + log], args=[str(seq), text])
        except redis.RedisError as e:
            raise StoreUnavailableError(f"redis store: {e}") from e
        if int(answer[0]) == 1:
            return APPENDED
        return Appended(False, "seq_taken", _text(answer[1]))

    def append_fenced(self, log: str, seq: int, text: str, lease_key: str, lease_generation: int) -> Appended:
        """``append`` only while the register ``lease_key`` is at
        ``lease_generation``: one Lua script that checks the lease and
        appends, atomic on the server. (Under Redis Cluster the log and the
        lease must share a hash slot: give both names a hash tag.)"""
        import redis

        check_append(log, seq, text)
        check_lease(lease_generation)
        try:
            answer = self._append_fenced(keys=[LOG_PREFIX + log, lease_key], args=[str(seq), text, str(lease_generation)])
        except redis.RedisError as e:
            raise StoreUnavailableError(f"redis store: {e}") from e
        code = int(answer[0])
        if code == 2:
            return LEASE_LOST
        if code == 1:
            return APPENDED
        return Appended(False, "seq_taken", _text(answer[1]))

    def read(self, log: str, from_seq: int = 0) -> List[LogEntry]:
        """The events from ``from_seq`` on, in ``seq`` order (one ``HGETALL``)."""
        import redis

        check_log(log)
        check_seq(from_seq, "from_seq")
        try:
            fields = self._client.hgetall(LOG_PREFIX + log)
        except redis.RedisError as e:
            raise StoreUnavailableError(f"redis store: {e}") from e
        entries = []
        for field, value in fields.items():
            name = _text(field)
            if name == "last":
                continue
            seq = int(name)
            if seq >= from_seq:
                entries.append(LogEntry(seq, _text(value)))
        entries.sort()
        return entries

    def last_seq(self, log: str) -> Optional[int]:
        """The highest ``seq`` held (``None``: the log is empty)."""
        import redis

        check_log(log)
        try:
            last = self._client.hget(LOG_PREFIX + log, "last")
        except redis.RedisError as e:
            raise StoreUnavailableError(f"redis store: {e}") from e
        return None if last is None else int(_text(last))

    def __repr__(self) -> str:
        return f"RedisStore({self._client!r})"


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _row(document: Any, generation: Any) -> Tuple[Optional[str], int]:
    if document is None:
        return None, 0
    text = document.decode("utf-8") if isinstance(document, bytes) else str(document)
    return text, int(generation or 0)
