"""Async jobs (docs/JOBS.md) with the real ``openai`` package against a
loopback Responses server: ``background=True`` create, retrieve by id,
cancel. The server counts every request; a fake clock records each wait."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Iterator, List, Optional, Union
from urllib.parse import quote, unquote
from urllib.request import urlopen
from urllib.error import HTTPError

import openai
import pytest

import retryledger
from retryledger.job import (
    AsyncJobCalls,
    JobAnswer,
    JobCalls,
    Reconciliation,
    openai_responses_job,
    openai_responses_job_async,
    run_job,
    run_job_async,
)
from retryledger.testing import FakeClock

from conftest import KEY, make_policy

JOB = "resp_68af3c2e9b1a8190"
PARAMS = {"model": "gpt-fake", "input": "summarize INC-4471"}

Reply = Union[str, Dict[str, Any]]


def _response(status: str) -> Dict[str, Any]:
    output: List[Dict[str, Any]] = []
    if status == "completed":
        output = [
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Severity 2.", "annotations": []}],
            }
        ]
    return {
        "id": JOB,
        "object": "response",
        "created_at": 1_700_000_000,
        "status": status,
        "background": True,
        "model": "gpt-fake",
        "output": output,
    }


class ResponsesServer:
    """POST /v1/responses answers ``submit`` in order (``"drop"`` drops the
    connection after reading the request); GET /v1/responses/{id} answers
    the statuses of ``polls`` in order (the last repeats), holding the
    answer of retrieve number ``hold_poll`` until ``release`` is set; POST
    .../cancel answers ``cancelled`` (or the error status ``cancel``)."""

    def __init__(
        self, submit: List[Reply], polls: List[str], cancel: Optional[int] = None, hold_poll: Optional[int] = None
    ) -> None:
        self.creates = 0
        self.retrieves = 0
        self.cancels = 0
        self.cancelled: List[str] = []
        self.lookups = 0
        self.ids: List[str] = []
        self.keys: List[Optional[str]] = []
        #: Set when the held retrieve arrived; its answer waits for ``release``.
        self.holding = threading.Event()
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path == "/v1/responses":
                    n = server.creates
                    server.creates += 1
                    server.keys.append(self.headers.get("idempotency-key"))
                    assert json.loads(body)["background"] is True
                    reply = submit[min(n, len(submit) - 1)]
                    if reply == "drop":
                        # The request arrived; the answer is lost.
                        self.close_connection = True
                        self.connection.close()
                        return
                    assert isinstance(reply, dict)
                    self._send(reply["status"], reply.get("body", _response("queued")))
                    return
                c = re.fullmatch(r"/v1/responses/([^/]+)/cancel", self.path)
                if c is not None:
                    server.cancels += 1
                    server.cancelled.append(c.group(1))
                    if cancel is not None:
                        self._send(cancel, {"error": {"message": "cannot cancel", "type": "invalid_request_error"}})
                    else:
                        self._send(200, _response("cancelled"))
                    return
                self._send(404, {"error": {"message": "no such route"}})

            def do_GET(self) -> None:  # noqa: N802
                # The test's own lookup by idempotency key (what a reconcile hook asks).
                look = re.fullmatch(r"/lookup\?key=(.+)", self.path)
                if look is not None:
                    server.lookups += 1
                    if unquote(look.group(1)) in server.keys:
                        self._send(200, _response("in_progress"))
                    else:
                        self._send(404, {"error": {"message": "no such job"}})
                    return
                m = re.match(r"/v1/responses/([^/?]+)", self.path)
                if m is None:
                    self._send(404, {"error": {"message": "no such route"}})
                    return
                n = server.retrieves
                server.retrieves += 1
                server.ids.append(m.group(1))
                if hold_poll is not None and n + 1 == hold_poll:
                    # Held until the client went away: the answer is never sent.
                    server.holding.set()
                    server.release.wait(10)
                    self.close_connection = True
                    return
                self._send(200, _response(polls[min(n, len(polls) - 1)]))

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server_factory() -> Iterator[Any]:
    made: List[ResponsesServer] = []

    def make(
        submit: List[Reply], polls: List[str], cancel: Optional[int] = None, hold_poll: Optional[int] = None
    ) -> ResponsesServer:
        s = ResponsesServer(submit, polls, cancel, hold_poll)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def job_policy(max_polls: int) -> Dict[str, Any]:
    return make_policy(
        async_job={"max_polls": max_polls, "poll_base_ms": 200, "poll_max_ms": 1_000},
        deadline_ms=20_000,
    )


def client_for(server: ResponsesServer) -> Any:
    return openai.OpenAI(api_key="test-key", base_url=server.base, max_retries=0)


def test_background_response_one_create_polls_at_planned_times(server_factory: Any) -> None:
    server = server_factory([{"status": 200}], ["in_progress", "in_progress", "completed"])
    clock = FakeClock()
    result = run_job(
        job_policy(6), openai_responses_job(client_for(server), PARAMS), KEY, clock=clock, sleep=clock.sleep
    )
    assert server.creates == 1
    assert server.retrieves == 3
    assert server.ids == [JOB, JOB, JOB]
    assert server.keys == [KEY]
    # Poll n waits min(200 * 2^(n-1), 1000) after the previous completion.
    assert clock.sleeps == [200, 400, 800]
    assert result.value.status == "completed"
    assert result.value.value.output_text == "Severity 2."
    job = result.receipt["job"]
    assert job["submits"] == 1
    assert job["polls"] == 3
    assert job["left_running"] is False
    assert job["job_sha256"] == hashlib.sha256(JOB.encode()).hexdigest()
    attempts = result.bundle["attempts"]["attempts"]
    assert [a["job"]["kind"] for a in attempts] == ["submit", "poll", "poll", "poll"]
    assert [a["started_at_ms"] for a in attempts] == [0, 200, 600, 1400]
    # The raw id is never in the documents.
    assert JOB not in result.bundle_json
    assert retryledger.verify_bundle(result.bundle_json)["kind"] == "verified"


def test_dropped_create_answer_is_never_resubmitted(server_factory: Any) -> None:
    server = server_factory(["drop", {"status": 200}], ["completed"])
    clock = FakeClock()
    with pytest.raises(retryledger.RunStoppedError) as info:
        run_job(job_policy(6), openai_responses_job(client_for(server), PARAMS), KEY, clock=clock, sleep=clock.sleep)
    assert info.value.terminal == "stop_indeterminate"
    assert info.value.receipt["job"]["submits"] == 1
    assert info.value.receipt["job"]["left_running"] is False
    assert server.creates == 1, "exactly one submit reached the provider"
    assert server.retrieves == 0


def test_rate_limited_create_is_retried_then_polled(server_factory: Any) -> None:
    refused = {"status": 429, "body": {"error": {"message": "slow down", "type": "rate_limit_exceeded"}}}
    server = server_factory([refused, {"status": 200}], ["completed"])
    clock = FakeClock()
    result = run_job(
        job_policy(6), openai_responses_job(client_for(server), PARAMS), KEY, clock=clock, sleep=clock.sleep
    )
    assert server.creates == 2
    assert server.retrieves == 1
    assert server.keys == [KEY, KEY]
    assert result.receipt["job"]["submits"] == 2


def test_poll_bound_stops_and_cancels_the_job_left_running(server_factory: Any) -> None:
    server = server_factory([{"status": 200}], ["in_progress"])
    clock = FakeClock()
    with pytest.raises(retryledger.RunStoppedError) as info:
        run_job(job_policy(3), openai_responses_job(client_for(server), PARAMS), KEY, clock=clock, sleep=clock.sleep)
    assert info.value.terminal == "stop_total_attempts"
    assert info.value.receipt["job"]["polls"] == 3
    assert info.value.receipt["job"]["left_running"] is True
    assert server.creates == 1
    assert server.retrieves == 3
    assert server.cancels == 1
    assert clock.sleeps == [200, 400, 800]


def test_client_with_its_own_retries_is_refused(server_factory: Any) -> None:
    server = server_factory([{"status": 200}], ["completed"])
    client = openai.OpenAI(api_key="test-key", base_url=server.base)
    with pytest.raises(retryledger.PolicyError) as info:
        openai_responses_job(client, PARAMS)
    assert info.value.code == "retry_owner_not_harness"
    assert server.creates == 0


def test_dropped_create_answer_reconciled_by_key_is_polled_not_resubmitted(server_factory: Any) -> None:
    server = server_factory(["drop", {"status": 200}], ["completed"])
    clock = FakeClock()
    base = openai_responses_job(client_for(server), PARAMS)

    def reconcile(step: retryledger.Step, error: BaseException) -> Reconciliation[Any]:
        url = server.base[: -len("/v1")] + "/lookup?key=" + quote(step.idempotency_key, safe="")
        try:
            with urlopen(url) as r:
                body = json.loads(r.read())
        except HTTPError:
            return Reconciliation("failed_no_effect")
        return Reconciliation("succeeded", JobAnswer(status=body["status"], value=body, id=body["id"]))

    calls = JobCalls(submit=base.submit, poll=base.poll, cancel=base.cancel, reconcile=reconcile)
    result = run_job(job_policy(6), calls, KEY, clock=clock, sleep=clock.sleep)
    assert server.creates == 1, "exactly one submit reached the provider"
    assert server.lookups == 1
    assert server.retrieves == 1
    assert result.terminal == "completed"
    assert result.bundle["attempts"]["attempts"][0]["reconciled"] == "succeeded"
    assert retryledger.verify_bundle(result.bundle_json)["kind"] == "verified"


def test_async_background_response_and_lost_create_answer(server_factory: Any) -> None:
    lost_server = server_factory(["drop", {"status": 200}], ["completed"])
    ok_server = server_factory([{"status": 200}], ["queued", "completed"])
    clock = FakeClock()

    async def main() -> None:
        client = openai.AsyncOpenAI(api_key="test-key", base_url=ok_server.base, max_retries=0)
        result = await run_job_async(
            job_policy(6), openai_responses_job_async(client, PARAMS), KEY, clock=clock, sleep=clock.async_sleep
        )
        assert result.value.status == "completed"
        assert ok_server.creates == 1
        assert ok_server.retrieves == 2
        assert clock.sleeps == [200, 400]
        lost = openai.AsyncOpenAI(api_key="test-key", base_url=lost_server.base, max_retries=0)
        with pytest.raises(retryledger.RunStoppedError) as info:
            await run_job_async(
                job_policy(6), openai_responses_job_async(lost, PARAMS), KEY, clock=clock, sleep=clock.async_sleep
            )
        assert info.value.terminal == "stop_indeterminate"
        assert lost_server.creates == 1, "exactly one submit reached the provider"

    asyncio.run(main())


def test_run_job_refuses_a_policy_without_async_job(server_factory: Any) -> None:
    server = server_factory([{"status": 200}], ["completed"])
    with pytest.raises(retryledger.PolicyError) as info:
        run_job(make_policy(), openai_responses_job(client_for(server), PARAMS), KEY)
    assert info.value.code == "invalid_async_job"
    assert server.creates == 0


def test_status_outside_the_documented_set_is_a_protocol_violation(server_factory: Any) -> None:
    odd = {"status": 200, "body": {"id": JOB, "object": "response", "status": "paused", "output": []}}
    server = server_factory([odd], ["completed"])
    clock = FakeClock()
    with pytest.raises(retryledger.RunStoppedError) as info:
        run_job(job_policy(6), openai_responses_job(client_for(server), PARAMS), KEY, clock=clock, sleep=clock.sleep)
    assert info.value.terminal == "stop_non_retryable"
    assert info.value.bundle["attempts"]["attempts"][0]["outcome"]["kind"] == "protocol_violation"
    assert server.creates == 1


def test_poll_past_the_deadline_stops_and_cancels(server_factory: Any) -> None:
    server = server_factory([{"status": 200}], ["in_progress"])
    clock = FakeClock()
    policy = make_policy(async_job={"max_polls": 10, "poll_base_ms": 200, "poll_max_ms": 1_000}, deadline_ms=1_500)
    with pytest.raises(retryledger.RunStoppedError) as info:
        run_job(policy, openai_responses_job(client_for(server), PARAMS), KEY, clock=clock, sleep=clock.sleep)
    assert info.value.terminal == "stop_deadline"
    assert info.value.receipt["job"]["left_running"] is True
    # Polls at 200, 600 and 1400; the fourth would start at 2400, past the deadline.
    assert clock.sleeps == [200, 400, 800]
    assert server.retrieves == 3
    assert server.cancels == 1


def cancelling_policy(max_polls: int, deadline_ms: int) -> Dict[str, Any]:
    """A job policy whose run cancels the job it would leave running."""
    return make_policy(
        async_job={"cancel_left_running": True, "max_polls": max_polls, "poll_base_ms": 200, "poll_max_ms": 1_000},
        deadline_ms=deadline_ms,
    )


def _check_cancelled_at_deadline(server: ResponsesServer, error: retryledger.RunStoppedError) -> None:
    assert error.terminal == "stop_deadline"
    assert server.creates == 1
    assert server.retrieves == 3
    assert server.cancels == 1, "exactly one cancel reached the provider"
    assert server.cancelled == [JOB]
    attempts = error.bundle["attempts"]["attempts"]
    assert [a["job"]["kind"] for a in attempts] == ["submit", "poll", "poll", "poll", "cancel"]
    cancel = attempts[-1]
    assert cancel["outcome"] == {"class": "success"}
    assert cancel["job"]["job_sha256"] == hashlib.sha256(JOB.encode()).hexdigest()
    # The one dispatch that may start at or after the deadline.
    assert cancel["started_at_ms"] == 1_900
    assert cancel["started_at_ms"] >= error.bundle["policy"]["deadline_ms"]
    job = error.receipt["job"]
    assert job["cancel"] == "accepted"
    assert job["left_running"] is False
    assert retryledger.verify_bundle(error.bundle_json)["kind"] == "verified"


def test_cancel_left_running_at_the_deadline_is_sent_once_and_recorded(server_factory: Any) -> None:
    server = server_factory([{"status": 200}], ["in_progress"])
    clock = FakeClock()
    base = openai_responses_job(client_for(server), PARAMS)

    def poll(job_id: str, step: retryledger.Step) -> JobAnswer[Any]:
        answer = base.poll(job_id, step)
        if (step.plan.job or {}).get("poll") == 3:
            clock.advance(500)  # the third poll completes at 1900, past the deadline
        return answer

    calls = JobCalls(submit=base.submit, poll=poll, cancel=base.cancel)
    with pytest.raises(retryledger.RunStoppedError) as info:
        run_job(cancelling_policy(10, 1_500), calls, KEY, clock=clock, sleep=clock.sleep)
    _check_cancelled_at_deadline(server, info.value)


def test_async_cancel_left_running_at_the_deadline_is_sent_once_and_recorded(server_factory: Any) -> None:
    server = server_factory([{"status": 200}], ["in_progress"])
    clock = FakeClock()

    async def main() -> None:
        client = openai.AsyncOpenAI(api_key="test-key", base_url=server.base, max_retries=0)
        base = openai_responses_job_async(client, PARAMS)

        async def poll(job_id: str, step: retryledger.Step) -> JobAnswer[Any]:
            answer = await base.poll(job_id, step)
            if (step.plan.job or {}).get("poll") == 3:
                clock.advance(500)
            return answer

        calls = AsyncJobCalls(submit=base.submit, poll=poll, cancel=base.cancel)
        with pytest.raises(retryledger.RunStoppedError) as info:
            await run_job_async(cancelling_policy(10, 1_500), calls, KEY, clock=clock, sleep=clock.async_sleep)
        _check_cancelled_at_deadline(server, info.value)

    asyncio.run(main())


def test_cancel_left_running_refused_cancel_is_recorded_failed_never_retried(server_factory: Any) -> None:
    server = server_factory([{"status": 200}], ["in_progress"], cancel=400)
    clock = FakeClock()
    with pytest.raises(retryledger.RunStoppedError) as info:
        run_job(
            cancelling_policy(3, 20_000),
            openai_responses_job(client_for(server), PARAMS),
            KEY,
            clock=clock,
            sleep=clock.sleep,
        )
    assert info.value.terminal == "stop_total_attempts"
    last = info.value.bundle["attempts"]["attempts"][-1]
    assert last["job"]["kind"] == "cancel"
    assert last["outcome"]["class"] == "non_retryable"
    assert info.value.receipt["job"]["cancel"] == "failed"
    assert info.value.receipt["job"]["left_running"] is True
    assert server.cancels == 1, "the refused cancel is neither retried nor sent again after sealing"


def test_cancel_left_running_needs_calls_cancel(server_factory: Any) -> None:
    server = server_factory([{"status": 200}], ["completed"])
    base = openai_responses_job(client_for(server), PARAMS)
    with pytest.raises(retryledger.PolicyError) as info:
        run_job(cancelling_policy(3, 20_000), JobCalls(submit=base.submit, poll=base.poll), KEY)
    assert info.value.code == "invalid_async_job"
    assert info.value.path == "/async_job/cancel_left_running"
    assert server.creates == 0


def _cancel_during_poll(server: ResponsesServer, policy: Dict[str, Any]) -> retryledger.RunCancelledError:
    """Run the job as a task and cancel it while its second poll is in
    flight (the server holds its answer); the sealed error."""
    clock = FakeClock()
    seen: List[retryledger.RunCancelledError] = []

    async def main() -> None:
        client = openai.AsyncOpenAI(api_key="test-key", base_url=server.base, max_retries=0)
        task = asyncio.ensure_future(
            run_job_async(
                policy,
                openai_responses_job_async(client, PARAMS),
                KEY,
                clock=clock,
                sleep=clock.async_sleep,
                on_cancel=seen.append,
            )
        )
        assert await asyncio.to_thread(server.holding.wait, 10), "the second poll reached the server"
        task.cancel()
        with pytest.raises(asyncio.CancelledError) as info:
            await task
        if isinstance(info.value, retryledger.RunCancelledError):  # Python 3.11 and later
            assert info.value is seen[0]

    asyncio.run(main())
    server.release.set()
    assert len(seen) == 1
    error = seen[0]
    assert isinstance(error, retryledger.RunCancelledError)
    assert server.creates == 1
    assert server.retrieves == 2
    attempts = error.bundle["attempts"]["attempts"]
    cancelled_poll = attempts[2]
    assert cancelled_poll["job"]["kind"] == "poll"
    assert cancelled_poll["job"]["poll"] == 2
    assert cancelled_poll["outcome"]["class"] == "indeterminate"
    assert "cancelled_at_ms" in error.bundle["attempts"]
    assert retryledger.verify_bundle(error.bundle_json)["kind"] == "verified"
    return error


def test_async_cancel_left_running_a_task_cancelled_during_a_poll_sends_the_cancel_once(
    server_factory: Any,
) -> None:
    server = server_factory([{"status": 200}], ["in_progress"], hold_poll=2)
    error = _cancel_during_poll(server, cancelling_policy(10, 20_000))
    assert error.code == "stop_cancelled"
    assert server.cancels == 1, "exactly one cancel reached the provider"
    assert server.cancelled == [JOB]
    attempts = error.bundle["attempts"]["attempts"]
    assert [a["job"]["kind"] for a in attempts] == ["submit", "poll", "poll", "cancel"]
    cancel = attempts[-1]
    assert cancel["outcome"] == {"class": "success"}
    assert cancel["job"]["job_sha256"] == hashlib.sha256(JOB.encode()).hexdigest()
    assert cancel["started_at_ms"] >= error.bundle["attempts"]["cancelled_at_ms"]
    job = error.receipt["job"]
    assert job["cancel"] == "accepted"
    assert job["left_running"] is False
    assert job["polls"] == 2


def test_async_task_cancelled_during_a_poll_without_cancel_left_running(server_factory: Any) -> None:
    # Not a RunError run_not_terminal: the cancelled poll planned the next
    # poll, and the run is cancelled there.
    server = server_factory([{"status": 200}], ["in_progress"], hold_poll=2)
    error = _cancel_during_poll(server, job_policy(6))
    assert error.code == "stop_cancelled"
    attempts = error.bundle["attempts"]["attempts"]
    assert [a["job"]["kind"] for a in attempts] == ["submit", "poll", "poll"]
    job = error.receipt["job"]
    assert job["left_running"] is True
    assert "cancel" not in job
    # Cancelled at the provider after sealing, unrecorded.
    assert server.cancels == 1
