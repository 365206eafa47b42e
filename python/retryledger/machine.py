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
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from . import _core
from ._api import Document, _loads, call, to_text

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
