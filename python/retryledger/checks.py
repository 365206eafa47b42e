"""Output checks: validators the driver runs on what ``dispatch`` returned.

A check turns an output into a verdict, ``{"kind", "validator", "verdict",
"defects"?}``, and the core judges the verdicts (docs/REPAIR.md): a failed
``refusal`` is ``policy_denied`` (non-retryable, never a fallback), any other
failed check ``invalid_output``. Pass them as ``checks=[...]`` to
:func:`retryledger.run` (and ``run_async``, the integrations, ``@retry``):

* :func:`function` wraps a plain function: ``True`` or ``None`` passes,
  ``False`` fails, a string or a list of strings (or of ``{"message",
  "path"}`` dicts) are the defects, a verdict dict is taken as it is;
  anything else is not a verdict (the core's ``output_verdict_invalid``).
* :func:`pydantic_model` validates with a pydantic model (JSON text or an
  object); its errors are the defects.
* :func:`json_schema` validates with a JSON Schema through ``jsonschema``
  (``pip install retryledger[jsonschema]``); JSON text that does not parse
  is an ``unparsable_json`` defect.

A check that raises, or whose verdict the core refuses, leaves the attempt
unrecognized (recorded, never retried) and the run raises with that error as
its cause. The integrations add the built-in checks of their answers
(``retryledger.openai.answer_checks``, ``retryledger.anthropic.answer_checks``).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Optional

__all__ = ["OutputCheck", "function", "pydantic_model", "json_schema", "defects_of"]

Verdict = Dict[str, Any]


class OutputCheck:
    """A validator with an id and the kind of check it is."""

    __slots__ = ("validator", "kind", "_fn")

    def __init__(self, fn: Callable[[Any], Any], *, validator: str, kind: str = "schema") -> None:
        self._fn = fn
        #: The validator's id, recorded with a failed verdict.
        self.validator = validator
        #: What it checks (``schema``, ``empty``, ``unparsable_json``, ``truncated``, ``refusal``).
        self.kind = kind

    def __call__(self, output: Any) -> Verdict:
        """The verdict on ``output`` (a dict the core decodes strictly)."""
        return _verdict(self._fn(output), self.kind, self.validator)

    def on(self, extract: Callable[[Any], Any]) -> "OutputCheck":
        """The same check on ``extract(output)`` (the integrations run user
        validators on an answer's text this way)."""
        fn = self._fn
        return OutputCheck(lambda output: fn(extract(output)), validator=self.validator, kind=self.kind)

    def __repr__(self) -> str:
        return f"OutputCheck(validator={self.validator!r}, kind={self.kind!r})"


def _defect(d: Any) -> Any:
    return {"message": d} if isinstance(d, str) else d


def _verdict(got: Any, kind: str, validator: str) -> Verdict:
    if isinstance(got, dict) and "verdict" in got:
        verdict = {"kind": kind, "validator": validator}
        verdict.update(got)
        return verdict
    if got is True or got is None:
        return {"kind": kind, "validator": validator, "verdict": "pass"}
    if got is False:
        return {"kind": kind, "validator": validator, "verdict": "defects", "defects": [{"message": f"rejected by {validator}"}]}
    if isinstance(got, str):
        return {"kind": kind, "validator": validator, "verdict": "defects", "defects": [{"message": got}]}
    if isinstance(got, (list, tuple)):
        if not got:
            return {"kind": kind, "validator": validator, "verdict": "pass"}
        return {"kind": kind, "validator": validator, "verdict": "defects", "defects": [_defect(d) for d in got]}
    # Not a verdict: passed on as it is, for the core to refuse with its code.
    return {"kind": kind, "validator": validator, "verdict": got}


def function(fn: Callable[[Any], Any], *, validator: str, kind: str = "schema") -> OutputCheck:
    """A plain function as a check (see the module's rules for its answers)."""
    return OutputCheck(fn, validator=validator, kind=kind)


def _pointer(loc: Any) -> str:
    return "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in loc) if loc else ""


def pydantic_model(model: Any, *, validator: Optional[str] = None) -> OutputCheck:
    """Validate JSON text (or an object) with a pydantic model; its errors are the defects."""
    from pydantic import ValidationError

    name = validator or f"pydantic:{getattr(model, '__name__', 'model')}"

    def check(output: Any) -> Any:
        try:
            if isinstance(output, (str, bytes)):
                model.model_validate_json(output)
            else:
                model.model_validate(output)
        except ValidationError as e:
            errors = e.errors(include_url=False, include_input=False)
            if any(err.get("type") == "json_invalid" for err in errors):
                return {"kind": "unparsable_json", "verdict": "defects", "defects": [{"message": str(errors[0].get("msg", "invalid JSON"))}]}
            return [{"message": str(err.get("msg", "")), "path": _pointer(err.get("loc"))} for err in errors]
        return True

    return OutputCheck(check, validator=name)


def json_schema(schema: Dict[str, Any], *, validator: Optional[str] = None) -> OutputCheck:
    """Validate JSON text (or an object) against a JSON Schema with
    ``jsonschema``; text that does not parse is ``unparsable_json``."""
    import jsonschema  # type: ignore[import-untyped]

    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    checker = cls(schema)
    name = validator or f"jsonschema:{schema.get('$id') or schema.get('title') or 'schema'}"

    def check(output: Any) -> Any:
        instance = output
        if isinstance(output, (str, bytes)):
            try:
                instance = json.loads(output)
            except ValueError as e:
                return {"kind": "unparsable_json", "verdict": "defects", "defects": [{"message": str(e)}]}
        errors = sorted(checker.iter_errors(instance), key=lambda e: list(e.absolute_path))
        return [{"message": e.message, "path": _pointer(list(e.absolute_path))} for e in errors]

    return OutputCheck(check, validator=name)


def defects_of(verdicts: List[Verdict]) -> List[Dict[str, Any]]:
    """The defects of the failed verdicts, each with its ``kind`` and ``validator``."""
    out: List[Dict[str, Any]] = []
    for v in verdicts:
        if v.get("verdict") == "defects":
            for d in v.get("defects") or []:
                out.append({"kind": v.get("kind"), "validator": v.get("validator"), **(d if isinstance(d, dict) else {"message": d})})
    return out
