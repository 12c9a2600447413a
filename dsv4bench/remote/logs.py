"""Stream a job's output.log by byte offset, so a dropped connection resumes exactly where it was:
no line lost, none doubled."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import BinaryIO, Callable

from dsv4bench.remote import jobs, outcome
from dsv4bench.remote.registry import JobRecord
from dsv4bench.remote.ssh import InfraError, Remote


async def stream(record: JobRecord, sink: BinaryIO, *, follow: bool, task: int | None = None, poll_s: float = 0.5,
                 reconnect_s: float = 300.0, note: Callable[[str], None] = lambda m: print(m, file=sys.stderr)
                 ) -> jobs.JobStatus | None:
    """Write the log to `sink`; with `follow`, until the job ends (returns its status).
    Reconnects for up to `reconnect_s` seconds after each connection loss."""
    offset = 0
    path = jobs.log_path(record, task)
    lost_since: float | None = None
    while True:
        try:
            async with Remote(record.host) as remote:
                if lost_since is not None:
                    note(f"reconnected; resuming at byte {offset}")
                    lost_since = None
                status = None
                while True:
                    chunk = await remote.read_from(path, offset)
                    if chunk:
                        sink.write(chunk)
                        sink.flush()
                        offset += len(chunk)
                        continue
                    if not follow or status is not None and outcome.finished(status.outcome):
                        return status  # read to the end after the job had finished: nothing comes after
                    status = await jobs.status(remote, record)
                    if not outcome.finished(status.outcome):
                        await asyncio.sleep(poll_s)
        except InfraError as e:
            now = time.monotonic()
            if lost_since is None:
                lost_since = now
                note(f"connection lost at byte {offset} ({e}); reconnecting")
            elif now - lost_since > reconnect_s:
                raise
            await asyncio.sleep(1.0)
