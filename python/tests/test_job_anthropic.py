"""Async jobs (docs/JOBS.md) with the real ``anthropic`` package against a
loopback Message Batches server: create, retrieve by id, results once the
batch ended, cancel. The server counts every request."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Iterator, List, Union

import anthropic
import pytest

import retryledger
from retryledger.job import anthropic_batch_job, anthropic_batch_job_async, run_job, run_job_async
from retryledger.testing import FakeClock

from conftest import KEY, make_policy

BATCH = "msgbatch_01HkcTjaV5uDC8jWR4ZsDV8d"
PARAMS = {"model": "claude-fake", "max_tokens": 256, "messages": [{"role": "user", "content": "summarize INC-4471"}]}


class BatchesServer:
    """POST /v1/messages/batches answers ``submit`` in order (``"drop"`` drops
    the connection); GET /v1/messages/batches/{id} answers the processing
    statuses of ``polls`` (the last repeats); GET .../results answers the
    request's result of type ``result``; POST .../cancel answers canceling."""

    def __init__(self, submit: List[Union[str, int]], polls: List[str], result: str) -> None:
        self.creates = 0
        self.retrieves = 0
        self.results = 0
        self.cancels = 0
        server = self

        def batch(status: str) -> Dict[str, Any]:
            return {
                "id": BATCH,
                "type": "message_batch",
                "processing_status": status,
                "request_counts": {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0},
                "created_at": "2026-12-03T10:00:00Z",
                "expires_at": "2026-12-04T10:00:00Z",
                "ended_at": "2026-12-03T10:05:00Z" if status == "ended" else None,
                "cancel_initiated_at": None,
                "archived_at": None,
                "results_url": f"{server.base}/v1/messages/batches/{BATCH}/results" if status == "ended" else None,
            }

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status: int, payload: Any, kind: str = "application/json") -> None:
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path == "/v1/messages/batches":
                    n = server.creates
                    server.creates += 1
                    assert len(json.loads(body)["requests"]) == 1
                    reply = submit[min(n, len(submit) - 1)]
                    if reply == "drop":
                        self.close_connection = True
                        self.connection.close()
                        return
                    assert isinstance(reply, int)
                    if reply == 200:
                        self._send(200, batch("in_progress"))
                    else:
                        self._send(reply, {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
                    return
                if self.path == f"/v1/messages/batches/{BATCH}/cancel":
                    server.cancels += 1
                    self._send(200, batch("canceling"))
                    return
                self._send(404, {"type": "error", "error": {"type": "not_found_error", "message": "no"}})

            def do_GET(self) -> None:  # noqa: N802
                if self.path.startswith(f"/v1/messages/batches/{BATCH}/results"):
                    server.results += 1
                    if result == "succeeded":
                        r: Dict[str, Any] = {
                            "type": "succeeded",
                            "message": {
                                "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-fake",
                                "content": [{"type": "text", "text": "Severity 2."}],
                                "stop_reason": "end_turn", "stop_sequence": None,
                                "usage": {"input_tokens": 10, "output_tokens": 4},
                            },
                        }
                    else:
                        r = {"type": result, "error": {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}}
                    line = json.dumps({"custom_id": "request", "result": r}) + "\n"
                    self._send(200, line.encode(), "application/binary")
                    return
                if self.path.startswith(f"/v1/messages/batches/{BATCH}"):
                    n = server.retrieves
                    server.retrieves += 1
                    self._send(200, batch(polls[min(n, len(polls) - 1)]))
                    return
                self._send(404, {"type": "error", "error": {"type": "not_found_error", "message": "no"}})

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server_factory() -> Iterator[Any]:
    made: List[BatchesServer] = []

    def make(submit: List[Union[str, int]], polls: List[str], result: str) -> BatchesServer:
        s = BatchesServer(submit, polls, result)
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


def client_for(server: BatchesServer) -> Any:
    return anthropic.Anthropic(api_key="test-key", base_url=server.base, max_retries=0)


def test_batch_one_create_polls_until_ended_result_returned(server_factory: Any) -> None:
    server = server_factory([200], ["in_progress", "canceling", "ended"], "succeeded")
    clock = FakeClock()
    result = run_job(job_policy(6), anthropic_batch_job(client_for(server), PARAMS), KEY, clock=clock, sleep=clock.sleep)
    assert server.creates == 1
    assert server.results == 1
    assert clock.sleeps == [200, 400, 800]
    assert result.value.status == "completed"
    assert result.value.value.message.content[0].text == "Severity 2."
    assert result.receipt["job"]["polls"] == 3
    assert BATCH not in result.bundle_json


def test_dropped_batch_create_answer_is_never_resubmitted(server_factory: Any) -> None:
    server = server_factory(["drop", 200], ["ended"], "succeeded")
    clock = FakeClock()
    with pytest.raises(retryledger.RunStoppedError) as info:
        run_job(job_policy(6), anthropic_batch_job(client_for(server), PARAMS), KEY, clock=clock, sleep=clock.sleep)
    assert info.value.terminal == "stop_indeterminate"
    assert server.creates == 1, "exactly one submit reached the provider"
    assert server.retrieves == 0


def test_overloaded_create_retried_errored_result_stops(server_factory: Any) -> None:
    server = server_factory([529, 200], ["ended"], "errored")
    clock = FakeClock()
    with pytest.raises(retryledger.RunStoppedError) as info:
        run_job(job_policy(6), anthropic_batch_job(client_for(server), PARAMS), KEY, clock=clock, sleep=clock.sleep)
    assert info.value.terminal == "stop_non_retryable"
    assert info.value.receipt["job"]["status"] == "failed"
    assert info.value.receipt["job"]["submits"] == 2
    assert server.creates == 2
    assert server.cancels == 0


def test_poll_bound_cancels_the_batch(server_factory: Any) -> None:
    server = server_factory([200], ["in_progress"], "succeeded")
    clock = FakeClock()
    with pytest.raises(retryledger.RunStoppedError) as info:
        run_job(job_policy(2), anthropic_batch_job(client_for(server), PARAMS), KEY, clock=clock, sleep=clock.sleep)
    assert info.value.terminal == "stop_total_attempts"
    assert info.value.receipt["job"]["left_running"] is True
    assert server.creates == 1
    assert server.retrieves == 2
    assert server.cancels == 1


def test_anthropic_client_with_its_own_retries_is_refused() -> None:
    client = anthropic.Anthropic(api_key="test-key", base_url="http://127.0.0.1:9")
    with pytest.raises(retryledger.PolicyError) as info:
        anthropic_batch_job(client, PARAMS)
    assert info.value.code == "retry_owner_not_harness"


def test_async_batch_one_create_then_result(server_factory: Any) -> None:
    server = server_factory([200], ["in_progress", "ended"], "succeeded")
    clock = FakeClock()

    async def main() -> None:
        client = anthropic.AsyncAnthropic(api_key="test-key", base_url=server.base, max_retries=0)
        result = await run_job_async(
            job_policy(6), anthropic_batch_job_async(client, PARAMS), KEY, clock=clock, sleep=clock.async_sleep
        )
        assert result.value.status == "completed"
        assert result.value.value.message.content[0].text == "Severity 2."
        assert server.creates == 1
        assert server.results == 1
        assert clock.sleeps == [200, 400]

    asyncio.run(main())


def test_cancel_left_running_cancels_the_batch_once_and_records_it(server_factory: Any) -> None:
    server = server_factory([200], ["in_progress"], "succeeded")
    clock = FakeClock()
    policy = make_policy(
        async_job={"cancel_left_running": True, "max_polls": 2, "poll_base_ms": 200, "poll_max_ms": 1_000},
        deadline_ms=20_000,
    )
    with pytest.raises(retryledger.RunStoppedError) as info:
        run_job(policy, anthropic_batch_job(client_for(server), PARAMS), KEY, clock=clock, sleep=clock.sleep)
    assert info.value.terminal == "stop_total_attempts"
    attempts = info.value.bundle["attempts"]["attempts"]
    assert [a["job"]["kind"] for a in attempts] == ["submit", "poll", "poll", "cancel"]
    assert attempts[-1]["outcome"] == {"class": "success"}
    assert info.value.receipt["job"]["cancel"] == "accepted"
    assert info.value.receipt["job"]["left_running"] is False
    assert retryledger.verify_bundle(info.value.bundle_json)["kind"] == "verified"
    assert server.creates == 1
    assert server.retrieves == 2
    assert server.cancels == 1, "exactly one cancel reached the provider"
