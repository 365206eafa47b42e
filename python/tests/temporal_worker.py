"""A worker process for the Temporal tests: the test workflows and the
loopback attempt activity on the task queue given, until it is killed.

    python temporal_worker.py <task queue>
"""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import timedelta

from temporalio.client import Client
from temporalio.worker import Worker

import temporal_support as support


async def main(task_queue: str) -> None:
    client = await Client.connect(os.environ["TEMPORAL_ADDRESS"])
    worker = Worker(
        client,
        task_queue=task_queue,
        workflows=support.WORKFLOWS,
        activities=support.ACTIVITIES,
        workflow_runner=support.runner(),
        # A killed worker's sticky queue is given up quickly.
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
    )
    async with worker:
        print("ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
