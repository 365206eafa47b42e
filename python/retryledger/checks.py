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
from typing import Any, Callable, Dict, List, Optional, Sequence

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


# ---- the integrations' built-in checks ---------------------------------------

#: What an SDK answer says, as the built-in checks read it: the refusal text
#: (``None``: no refusal), why it was cut (``None``: it was not), its text
#: content (``None``: none) and whether it carries other content (tool calls).
AnswerParts = Callable[[Any], "tuple[Optional[str], Optional[str], Optional[str], bool]"]


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def answer_checks(
    prefix: str, parts: AnswerParts, json_output: bool, validators: "Sequence[OutputCheck]"
) -> List[OutputCheck]:
    """The built-in checks of an SDK's answers (``refusal``, ``truncated``,
    ``empty``, and ``unparsable_json`` when a JSON output was asked for),
    then the user's validators run on the answer's text."""

    def refusal(answer: Any) -> Any:
        said = parts(answer)[0]
        return True if said is None else [said or "refused"]

    def truncated(answer: Any) -> Any:
        why = parts(answer)[1]
        return True if why is None else [why]

    def empty(answer: Any) -> Any:
        _, _, text, other = parts(answer)
        return True if other or (text is not None and text.strip() != "") else ["the answer has no content"]

    def unparsable(answer: Any) -> Any:
        text = parts(answer)[2]
        if text is None:
            return True  # nothing to parse: `empty` says so
        try:
            json.loads(text)
        except ValueError as e:
            return [str(e)]
        return True

    out = [
        OutputCheck(refusal, validator=f"{prefix}.refusal", kind="refusal"),
        OutputCheck(truncated, validator=f"{prefix}.truncated", kind="truncated"),
        OutputCheck(empty, validator=f"{prefix}.empty", kind="empty"),
    ]
    if json_output:
        out.append(OutputCheck(unparsable, validator=f"{prefix}.json", kind="unparsable_json"))
    out.extend(v.on(lambda answer: parts(answer)[2]) for v in validators)
    return out


def openai_parts(answer: Any) -> "tuple[Optional[str], Optional[str], Optional[str], bool]":
    """A chat completion's or a response's refusal, cut, text and other content."""
    choices = _get(answer, "choices")
    if choices:
        choice = choices[0]
        message = _get(choice, "message")
        refusal = _get(message, "refusal")
        cut = "finish_reason: length" if _get(choice, "finish_reason") == "length" else None
        return (refusal if refusal else None), cut, _get(message, "content"), bool(_get(message, "tool_calls"))
    refusal = None
    texts: List[str] = []
    other = False
    for item in _get(answer, "output") or []:
        if _get(item, "type") == "message":
            for part in _get(item, "content") or []:
                kind = _get(part, "type")
                if kind == "refusal":
                    refusal = _get(part, "refusal") or "refused"
                elif kind == "output_text":
                    texts.append(_get(part, "text") or "")
        else:
            other = other or _get(item, "type") in ("function_call", "custom_tool_call")
    details = _get(answer, "incomplete_details")
    cut = None
    if _get(answer, "status") == "incomplete" and _get(details, "reason") == "max_output_tokens":
        cut = "incomplete: max_output_tokens"
    return refusal, cut, ("".join(texts) if texts else None), other


def anthropic_parts(answer: Any) -> "tuple[Optional[str], Optional[str], Optional[str], bool]":
    """A message's refusal, cut, text and other content (``stop_reason``, content blocks)."""
    stop = _get(answer, "stop_reason")
    texts: List[str] = []
    other = False
    for block in _get(answer, "content") or []:
        if _get(block, "type") == "text":
            texts.append(_get(block, "text") or "")
        elif _get(block, "type") == "tool_use":
            other = True
    refusal = "stop_reason: refusal" if stop == "refusal" else None
    cut = "stop_reason: max_tokens" if stop == "max_tokens" else None
    return refusal, cut, ("".join(texts) if texts else None), other
