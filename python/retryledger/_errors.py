"""The exception hierarchy: one base, one class per error family of the core.

The core reports every failure with a stable snake_case ``code`` (the same
string in Rust, JavaScript and Python), the family the code belongs to, a human
message and, where known, a JSON Pointer ``path`` and the ``attempt_index``.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Optional, Type

from ._tables import ERROR_CODES

__all__ = [
    "RetryledgerError",
    "DecodeError",
    "PolicyError",
    "RouteClientMissingError",
    "DriftError",
    "ReceiptError",
    "HttpError",
    "RunError",
    "JournalError",
    "IdempotencyError",
    "RetryledgerWarning",
    "HookWarning",
    "EXCEPTION_CLASSES",
    "exception_class",
]


class RetryledgerError(ValueError):
    """Base of every error retryledger raises; carries the core's stable ``code``."""

    code: str
    message: str
    path: Optional[str]
    attempt_index: Optional[int]

    def __init__(
        self,
        code: str,
        message: str,
        path: Optional[str] = None,
        attempt_index: Optional[int] = None,
    ) -> None:
        super().__init__(code, message, path, attempt_index)
        self.code = code
        self.message = message
        self.path = path
        self.attempt_index = attempt_index

    def __str__(self) -> str:
        where = f" at {self.path}" if self.path is not None else ""
        return f"{self.code}{where}: {self.message}"


class RetryledgerWarning(UserWarning):
    """Base of the warnings retryledger emits (``warnings.warn``); carries a stable ``code``."""

    code: str = "warning"


class HookWarning(RetryledgerWarning):
    """A run hook (``on_attempt``, ``on_decision``, ``on_sleep``,
    ``on_terminal``) raised: reported here, and the run went on unchanged
    (a hook never changes a decision or the receipt). ``hook`` names the
    hook, ``error`` is what it raised."""

    code = "hook_failed"

    def __init__(self, hook: str, error: BaseException) -> None:
        super().__init__(f"hook_failed: {hook} raised {type(error).__name__}: {error}")
        self.hook = hook
        self.error = error


class DecodeError(RetryledgerError):
    """The input is not a well-formed document in normal form."""


class PolicyError(RetryledgerError):
    """The policy breaks a rule checked before any dispatch."""


class RouteClientMissingError(PolicyError, KeyError):
    """A route of the policy has no client in the mapping given to a client
    integration (code ``route_client_missing``, decided by the core),
    refused before any request. Also a ``KeyError``, which the integrations
    raised before the code existed."""


class DriftError(RetryledgerError):
    """An observed attempt is not the planned one."""


class ReceiptError(RetryledgerError):
    """A sealed receipt does not match its replay."""


class HttpError(RetryledgerError):
    """A Retry-After value or an HTTP observation is malformed."""


class RunError(RetryledgerError):
    """The run cannot be evaluated in its current state."""


class JournalError(RetryledgerError):
    """A run's journal (or a reconciliation of it) is not one the core can act on."""


class IdempotencyError(RetryledgerError):
    """An idempotency record or its retention is inconsistent."""


_FAMILIES: dict[str, type[RetryledgerError]] = {
    "decode": DecodeError,
    "policy": PolicyError,
    "drift": DriftError,
    "receipt": ReceiptError,
    "http": HttpError,
    "run": RunError,
    "journal": JournalError,
    "idempotency": IdempotencyError,
}


#: The exception class of every error code of the core (tests/vectors/tables.json).
EXCEPTION_CLASSES: Dict[str, Type[RetryledgerError]] = {
    code: _FAMILIES[family] for code, family in ERROR_CODES.items()
}


def exception_class(code: str) -> Type[RetryledgerError]:
    """The exception class of an error code (:class:`RetryledgerError` for an unknown one)."""
    return EXCEPTION_CLASSES.get(code, RetryledgerError)


def from_error_json(text: str) -> RetryledgerError:
    """The exception for the core's ``error_json``, its class chosen by its code's family."""
    data: Any = json.loads(text)
    cls = EXCEPTION_CLASSES.get(data["code"]) or _FAMILIES.get(data.get("family", ""), RetryledgerError)
    return cls(
        data["code"],
        data.get("message", ""),
        data.get("path"),
        data.get("attempt_index"),
    )
