"""The run machine of the core (docs/COMPOSITION.md): one sans-I/O loop
for a whole run, effects out and events in. A host asks for the next effect
(``append``, ``read``, ``write``, ``sleep``, ``dispatch``, ``poll``,
``cancel``, ``reconcile``, ``done``) and answers it with one event; the
fleet, the journal, streams, async jobs and output checks are layers of it.

:func:`machine_transcript` replays a recorded sequence of events: the effects
the machine asked for, where it ended, and the first event it refused.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

from . import _core
from ._api import Document, _loads, call, to_text

__all__ = ["machine_transcript"]


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
