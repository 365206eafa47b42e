"""The run machine of the core (docs/COMPOSITION.md): one sans-I/O loop
for a whole run, effects out and events in. A host asks for the next effect
(``append``, ``read``, ``write``, ``sleep``, ``dispatch``, ``poll``,
``cancel``, ``reconcile``, ``done``) and answers it with one event; the
fleet, the journal, streams, async jobs and output checks are layers of it.

:func:`machine_transcript` replays a recorded sequence of events: the effects
the machine asked for, where it ended, and the first event it refused.
:class:`Judgement` and :func:`planned_sleep` are the machine's documents as
the drivers' run hooks see them.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _core
from ._api import Document, _loads, call, to_text
from ._driver import _call_hook
from ._loop import Adapter, store_read, store_write
from .fleet import Fleet

__all__ = ["Judgement", "machine_transcript", "planned_sleep"]


def machine_transcript(
    policy: Document,
    options: Document,
    journal: Optional[Union[Document, Sequence[Any]]],
    events: Union[Document, Sequence[Any]],
) -> dict[str, Any]:
    """The machine started under ``options`` (or, with ``journal``, resumed
    from its events) and fed ``events``: ``effects`` (the effect outstanding
    before each event and after the last), ``terminal``, ``receipt_sha256``
    and ``bundle_sha256`` once done, or ``error`` (``code``, ``path``,
    ``event``) for the first event refused. Malformed input raises."""
    return _loads(
        call(
            _core.machine_transcript,
            to_text(policy),
            to_text(options),
            None if journal is None else to_text(journal),
            to_text(events),
        )
    )


class Judgement:
    """The core's judgement of an attempt as the loop reads it (a plain
    document), with the attributes of the extension's ``Judgement`` a run
    hook reads: ``outcome``, ``rule``, ``notes``, ``stream`` and ``to_dict()``."""

    __slots__ = ("_doc",)

    def __init__(self, document: Mapping[str, Any]) -> None:
        self._doc = dict(document)

    @property
    def outcome(self) -> _core.Outcome:
        return _core.Outcome(self._doc["outcome"])

    @property
    def rule(self) -> Any:
        return self._doc["rule"]

    @property
    def notes(self) -> List[Any]:
        return list(self._doc.get("notes", []))

    @property
    def stream(self) -> Any:
        return self._doc.get("stream")

    def to_dict(self) -> Dict[str, Any]:
        return json.loads(json.dumps(self._doc))  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"Judgement(rule={self.rule!r})"


def planned_sleep(sleep: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """A driver's ``on_sleep`` payload of a wait before a planned attempt,
    ``{ordinal, route_id, at_ms, not_before_ms, sleep_ms}`` (``None`` for another wait)."""
    d = sleep.get("dispatch")
    if d is None:
        return None
    return {
        "ordinal": d["ordinal"],
        "route_id": d["route_id"],
        "at_ms": sleep["from_ms"],
        "not_before_ms": sleep["until_ms"],
        "sleep_ms": sleep["ms"],
    }


class HookedAdapter(Adapter):
    """A host loop adapter that calls a driver's run hooks as every driver
    on the loop does: ``on_decision``, ``on_sleep`` (a wait before an
    attempt, as :func:`planned_sleep`), ``on_attempt`` (the attempt and a
    :class:`Judgement`), ``on_terminal``; each with a copy of the document,
    what it raises reported as a :class:`retryledger.HookWarning`."""

    hooks: Tuple[Optional[Callable[..., Any]], ...] = (None, None, None, None)

    def on_decision(self, decision: Dict[str, Any]) -> None:
        if self.hooks[0] is not None:
            _call_hook("on_decision", self.hooks[0], json.loads(json.dumps(decision)))

    def on_sleep(self, sleep: Dict[str, Any]) -> None:
        planned = planned_sleep(sleep)
        if self.hooks[1] is not None and planned is not None:
            _call_hook("on_sleep", self.hooks[1], planned)

    def on_attempt(self, attempt: Dict[str, Any], judgement: Dict[str, Any]) -> None:
        if self.hooks[2] is not None:
            _call_hook("on_attempt", self.hooks[2], attempt, Judgement(judgement))

    def on_terminal(self, receipt: Dict[str, Any]) -> None:
        if self.hooks[3] is not None:
            _call_hook("on_terminal", self.hooks[3], json.loads(json.dumps(receipt)))


class FleetAdapter(HookedAdapter):
    """A hooked adapter that reads and writes the registers of a run's
    :class:`~retryledger.fleet.Fleet` under its namespace (``fleet`` is
    ``None`` for a policy without a fleet section: a read is then the loop's
    coded refusal)."""

    fleet: Optional[Fleet] = None

    def use_fleet(self, fleet: Optional[Fleet]) -> None:
        """Admit this run's attempts through ``fleet``."""
        self.fleet = fleet
        if fleet is not None:
            self.namespace = fleet.namespace

    def read(self, keys: List[str]) -> List[Dict[str, Any]]:
        if self.fleet is None:
            return Adapter.read(self, keys)
        return store_read(self.fleet.store, self.namespace, keys)

    def write(self, writes: List[Dict[str, Any]]) -> int:
        if self.fleet is None:
            return Adapter.write(self, writes)
        return store_write(self.fleet.store, self.namespace, writes)


def fleet_options(fleet: Optional[Fleet]) -> Dict[str, Any]:
    """The run machine's options a fleet sets: its conflict bound, its token
    reservation and the call's tenant (under tenant shares)."""
    if fleet is None:
        return {}
    options: Dict[str, Any] = {"max_conflicts": fleet.max_conflicts}
    if fleet.reserve_tokens is not None:
        options["reserve_tokens"] = fleet.reserve_tokens
    if fleet.tenant is not None:
        options["tenant"] = fleet.tenant
    return options
