"""`kubedgx operator` in a subprocess, as users and the chart run it, its stderr (kopf's log) collected
line by line (test_cli_operator.py, test_metrics.py)."""

from __future__ import annotations

import asyncio
import signal

STARTUP_TIMEOUT = 30.0


class OperatorProcess:
    """The CLI in a subprocess; its stderr (kopf's log) is collected line by line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        async for raw in self.proc.stderr:
            self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))

    async def stop(self) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(self.proc.wait(), timeout=30)
        await self.reader
        return code
