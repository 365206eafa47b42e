"""``@retryledger.retry``: the drivers as a decorator, as short as tenacity's.

    @retryledger.retry(policy, idempotency_key="order-7")
    def summarize(step, text):
        return client.chat.completions.create(..., extra_headers={"Idempotency-Key": step.idempotency_key})

    summarize("...")            # the value; RunStoppedError (with the bundle) otherwise
    summarize.run("...")        # the RunResult: value, receipt, bundle

The decorated function receives the planned :class:`Step` first, then the
caller's arguments; an ``async def`` gets the asyncio driver. ``policy`` and
``idempotency_key`` may be callables of the caller's arguments, since a
policy binds one logical request (its digest and its key's digest). Or
``policy`` is a :class:`PolicyTemplate` compiled once at module level: each
call binds the logical request ``request=`` gives (a document, or a callable
of the caller's arguments) and the key (scoped by ``key_scope`` when given)::

    template = retryledger.compile_policy_template(spec)

    @retryledger.retry(template, idempotency_key=lambda text: key_of(text),
                       request=lambda text: {"schema": "retryledger.request.v1",
                                             "operation": "chat", "input": [text]})
    def summarize(step, text): ...

Every guarantee of :func:`retryledger.run` holds: one owner of retries, the
core's schedule and judgement, a sealed receipt. The decorator cannot see
the SDK clients the function calls, so give them: ``clients=`` (one client,
a list, or a dict by route id) is checked when the function is decorated and
again before each call, and a client whose own retries are on (``openai``,
``anthropic`` with ``max_retries`` other than 0, ``httpx`` transport retries,
``google-genai`` retry options) is refused with
``PolicyError("retry_owner_not_harness")`` before any request: retries at two
layers multiply, and the receipt would count one attempt where the server saw
several. A client whose retries cannot be read is refused too.

The clients given are also watched while the function runs (the openai and
anthropic SDKs and httpx clients): each request they send during an
attempt carries the run's ``Idempotency-Key`` and a timeout within the
remaining deadline, and, when the policy was bound from a template, its
body is lifted into a logical request and compared with the request the
policy binds before it is sent (``DriftError("request_drift")``, nothing
sent: a call that sends another prompt than the one bound).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Awaitable, Callable, Generic, Tuple, TypeVar, Union, cast, overload

from ._api import Document, Policy, PolicyTemplate, idempotency_key_sha256
from ._errors import PolicyError
from ._driver import RunResult, Step, run, run_async

__all__ = ["retry", "Retrying"]

T = TypeVar("T")

PolicyArg = Union[Policy, PolicyTemplate, Document, Callable[..., Union[Policy, Document]]]
KeyArg = Union[str, Callable[..., str]]


def require_no_sdk_retries(client: Any) -> None:
    """Refuse a client that retries on its own (``retry_owner_not_harness``),
    with the check its integration uses."""
    module = type(client).__module__.split(".")[0]
    if hasattr(client, "max_retries"):
        from ._integration import require_max_retries_zero

        require_max_retries_zero(client, module)
    elif module == "httpx":
        from .httpx import require_no_retries

        require_no_retries(client)
    elif module == "google":
        from .google_genai import require_no_retries as require_genai

        require_genai(client)
    else:
        raise PolicyError(
            "retry_owner_not_harness",
            f"cannot tell whether a {type(client).__name__} retries on its own; give clients whose retries "
            "can be read (openai, anthropic, httpx, google-genai) with their retries off",
            "/clients",
        )


def _items(clients: Any) -> list[Any]:
    if clients is None:
        return []
    if isinstance(clients, dict):
        return list(clients.values())
    if isinstance(clients, (list, tuple)):
        return list(clients)
    return [clients]


def _check_clients(clients: Any) -> None:
    for client in _items(clients):
        require_no_sdk_retries(client)


def _watch(clients: Any) -> None:
    """Give the clients the request hooks of the integrations (an httpx
    client, or an SDK's underlying one): :func:`._sending.sending` then ties
    what they send to the attempt."""
    items = _items(clients)
    if not items:
        return
    from ._sending import hook, hook_sdk

    for client in items:
        if type(client).__module__.split(".")[0] == "httpx":
            hook(client)
        else:
            hook_sdk(client)


def _sent(clients: Any, step: Step, fn: Callable[..., Any], args: Tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``fn(step, *args, **kwargs)``, its clients' requests tied to ``step``."""
    if clients is None:
        return fn(step, *args, **kwargs)
    from ._sending import sending

    with sending(step):
        return fn(step, *args, **kwargs)


def _resolve(value: Any, args: Tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return value(*args, **kwargs) if callable(value) and not isinstance(value, Policy) else value


class Retrying(Generic[T]):
    """A function under a policy: call it for the value, ``.run`` for the whole
    :class:`RunResult` (sync functions), ``.run_async`` for async ones."""

    __name__: str
    __doc__: Union[str, None]

    def __init__(self, fn: Callable[..., Any], policy: PolicyArg, idempotency_key: KeyArg, options: dict[str, Any]) -> None:
        self._clients = options.pop("clients", None)
        _check_clients(self._clients)
        self._fn = fn
        self._policy = policy
        self._key = idempotency_key
        self._options = options
        self._async = inspect.iscoroutinefunction(fn)
        functools.update_wrapper(self, fn)

    def _bound(self, args: Tuple[Any, ...], kwargs: dict[str, Any]) -> Tuple[Any, str, dict[str, Any]]:
        _check_clients(self._clients)
        _watch(self._clients)
        key = _resolve(self._key, args, kwargs)
        if not isinstance(key, str):
            raise TypeError("idempotency_key must be a str or give one")
        if not isinstance(self._policy, PolicyTemplate):
            return _resolve(self._policy, args, kwargs), key, self._options
        request = _resolve(self._options.get("request"), args, kwargs)
        if request is None:
            raise TypeError("retry with a PolicyTemplate needs request=: the logical request each call binds")
        scope = self._options.get("key_scope")
        if scope is None:
            key_sha256 = idempotency_key_sha256(key)
        else:
            tenant, operation = scope
            key_sha256 = idempotency_key_sha256(key, tenant=tenant, operation=operation)
        return self._policy.bind(request, key_sha256), key, {**self._options, "request": request}

    def run(self, *args: Any, **kwargs: Any) -> RunResult[T]:
        """Run the function under the policy: the value and the sealed run."""
        if self._async:
            raise TypeError("an async function runs with `await f.run_async(...)`")
        policy, key, options = self._bound(args, kwargs)
        fn, clients = self._fn, self._clients
        return run(policy, lambda step: cast(T, _sent(clients, step, fn, args, kwargs)), key, **options)

    async def run_async(self, *args: Any, **kwargs: Any) -> RunResult[T]:
        """The asyncio driver: the value and the sealed run."""
        policy, key, options = self._bound(args, kwargs)
        fn, clients = self._fn, self._clients

        async def dispatch(step: Step) -> T:
            if clients is None:
                out = fn(step, *args, **kwargs)
                return cast(T, await out) if inspect.isawaitable(out) else cast(T, out)
            from ._sending import sending

            with sending(step):
                out = fn(step, *args, **kwargs)
                return cast(T, await out) if inspect.isawaitable(out) else cast(T, out)

        return await run_async(policy, dispatch, key, **options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._async:
            return self._call_async(*args, **kwargs)
        return self.run(*args, **kwargs).value

    async def _call_async(self, *args: Any, **kwargs: Any) -> T:
        return (await self.run_async(*args, **kwargs)).value


class _Decorate:
    """What ``retry(...)`` returns: applied to a function, a :class:`Retrying`."""

    def __init__(self, policy: PolicyArg, idempotency_key: KeyArg, options: dict[str, Any]) -> None:
        _check_clients(options.get("clients"))
        self._policy = policy
        self._key = idempotency_key
        self._options = options

    @overload
    def __call__(self, fn: Callable[..., Awaitable[T]]) -> Retrying[T]: ...

    @overload
    def __call__(self, fn: Callable[..., T]) -> Retrying[T]: ...

    def __call__(self, fn: Callable[..., Any]) -> Retrying[Any]:
        return Retrying(fn, self._policy, self._key, dict(self._options))


def retry(policy: PolicyArg, *, idempotency_key: KeyArg, **options: Any) -> _Decorate:
    """Decorate a function whose first parameter is the :class:`Step`.

    ``options`` are the driver's keyword arguments (``classify``, ``clock``,
    ``sleep``, ``wall_clock``, the hooks ``on_attempt``, ``on_decision``,
    ``on_sleep``, ``on_terminal``, ``key_scope``, ``checks``, ``repair``,
    ``request``, and ``on_cancel`` for async functions), and ``clients``: the
    SDK clients the function calls, refused before any request when their own
    retries are on."""
    return _Decorate(policy, idempotency_key, options)
