"""Done-when 3: `logs --follow` survives connections cut mid-stream, with the log complete and in order."""

from __future__ import annotations

import asyncio
import socket
import threading

from dsv4bench.remote import logs, outcome
from tests.remote.conftest import write_ssh_config
from tests.remote.helpers import small_repo, submit

LINES = 6000


class CuttableProxy:
    """A TCP relay to sshd on its own event loop thread; `cut()` aborts every open connection."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.loop = asyncio.new_event_loop()
        self.transports: list[asyncio.StreamWriter] = []
        self.cuts = 0
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(ready,), daemon=True).start()
        ready.wait(10)

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._relay, "127.0.0.1", self.port))
        ready.set()
        self.loop.run_forever()

    async def _relay(self, reader, writer) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.transports += [writer, up_writer]

        async def pipe(src, dst):
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self) -> None:
        def abort_all():
            for w in self.transports:
                w.transport.abort()
            self.transports.clear()
        self.loop.call_soon_threadsafe(abort_all)
        self.cuts += 1

    def close(self) -> None:
        async def shutdown():
            self.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


class CuttingSink:
    """Collects the streamed bytes; cuts the connection when it has seen 1/4 and 2/3 of the lines
    (the job pauses after its last line, so both cuts happen while it still runs)."""

    def __init__(self, proxy: CuttableProxy, total: int):
        self.data = bytearray()
        self.proxy = proxy
        self.marks = [total // 4, 2 * total // 3]

    def write(self, chunk: bytes) -> None:
        self.data += chunk
        if self.marks and self.data.count(b"\n") >= self.marks[0]:
            self.marks.pop(0)
            self.proxy.cut()

    def flush(self) -> None:
        pass


def test_follow_resumes_after_forced_disconnects(sshd, make_host, stub_python, tmp_path):
    proxy = CuttableProxy(sshd.port)
    try:
        config = tmp_path / "ssh_config_proxy"
        write_ssh_config(config, sshd.root, proxy.port)
        make_host(python=str(stub_python / "fakepython"), ssh_config=str(config))
        job = submit("loop", ["count", str(LINES), "3"], small_repo(tmp_path / "repo", {"a": ""}))[0]
        sink, notes = CuttingSink(proxy, LINES), []
        status = asyncio.run(logs.stream(job, sink, follow=True, poll_s=0.05, note=notes.append))
        assert proxy.cuts == 2
        assert sum("connection lost" in n for n in notes) == 2, notes
        assert status.outcome == outcome.PASS
        assert sink.data.decode() == "".join(f"line {i}\n" for i in range(1, LINES + 1))
    finally:
        proxy.close()
