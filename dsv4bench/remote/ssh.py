"""One SSH connection to a host (asyncssh): quoted commands, SFTP transfers, infrastructure errors.

The host's `ssh` alias is resolved through `~/.ssh/config` (or the host's `ssh_config`), so
ProxyJump, IdentityFile, Port and UserKnownHostsFile stay where the user keeps them. Host keys are
checked against known_hosts (asyncssh's default); nothing here turns that off.
"""

from __future__ import annotations

import posixpath
import secrets
import shlex
import stat
from pathlib import Path

import asyncssh

from dsv4bench.remote.config import HostConfig

CHUNK = 1 << 20


class InfraError(RuntimeError):
    """The host, the connection or the transfer failed (exit status 5), not the job."""


def command(argv: list[str], cwd: str | None = None) -> str:
    """A remote shell command line in which every piece is quoted: data never becomes shell."""
    line = shlex.join(argv)
    return f"cd {shlex.quote(cwd)} && {line}" if cwd else line


class Remote:
    """An open connection; `async with Remote(host) as r:`."""

    def __init__(self, host: HostConfig):
        self.host = host
        self.conn: asyncssh.SSHClientConnection | None = None
        self.sftp: asyncssh.SFTPClient | None = None
        self.workdir = host.workdir

    async def __aenter__(self) -> "Remote":
        config = [self.host.ssh_config] if self.host.ssh_config else ()
        try:
            self.conn = await asyncssh.connect(self.host.ssh, config=config,
                                               connect_timeout=self.host.connect_timeout_s)
            self.sftp = await self.conn.start_sftp_client()
            self.workdir = await self._absolute(self.host.workdir)
        except (OSError, asyncssh.Error) as e:
            await self.close()
            hint = "; check its key, or connect once with `ssh` to record it" \
                if isinstance(e, asyncssh.HostKeyNotVerifiable) else ""
            raise InfraError(f"cannot reach host '{self.host.name}' (ssh {self.host.ssh}): {_describe(e)}{hint}") from None
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        if self.sftp:
            self.sftp.exit()
        if self.conn:
            self.conn.close()
            await self.conn.wait_closed()
        self.conn = self.sftp = None

    async def _absolute(self, path: str) -> str:
        if path.startswith("~/"):
            path = path[2:]
        return path if path.startswith("/") else posixpath.join(await self.sftp.realpath("."), path)

    def path(self, *parts: str) -> str:
        return posixpath.join(self.workdir, *parts)

    async def run(self, argv: list[str], cwd: str | None = None, check: bool = True,
                  timeout: float | None = 120) -> asyncssh.SSHCompletedProcess:
        try:
            result = await self.conn.run(command(argv, cwd), check=False, timeout=timeout)
        except (OSError, asyncssh.Error, TimeoutError) as e:
            raise InfraError(f"{self.host.name}: {argv[0]} failed: {_describe(e)}") from None
        if check and result.exit_status != 0:
            err = (result.stderr or result.stdout or "").strip().splitlines()
            raise InfraError(f"{self.host.name}: {argv[0]} exited {result.exit_status}: {err[-1] if err else ''}")
        return result

    async def launch(self, argv: list[str], cwd: str, log: str) -> None:
        """Start `argv` detached (stdio redirected, in the background): returns at once and
        survives the connection."""
        await self.run(["sh", "-c", f'{command(argv, cwd)} </dev/null >>"$0" 2>&1 &', log])

    async def listdir(self, path: str) -> list[str]:
        return [n for n in await self._sftp(self.sftp.listdir(path)) if n not in (".", "..")]

    async def touch(self, path: str) -> None:
        await self._sftp(self.sftp.utime(path))

    async def exists(self, path: str) -> bool:
        return await self._sftp(self.sftp.exists(path))

    async def makedirs(self, path: str) -> None:
        await self._sftp(self.sftp.makedirs(path, exist_ok=True))

    async def write(self, path: str, data: bytes, mode: int = 0o600) -> None:
        """Write atomically: a temporary name, then rename."""
        async def put():
            tmp = f"{path}.{secrets.token_hex(4)}.part"  # unique: two submits may send the same tree
            async with self.sftp.open(tmp, "wb", asyncssh.SFTPAttrs(permissions=mode)) as f:
                await f.write(data)
            await self.sftp.posix_rename(tmp, path)
        await self._sftp(put())

    async def read_from(self, path: str, offset: int) -> bytes:
        """Up to CHUNK bytes of `path` from `offset` (b"" at its current end, or when it does not exist yet)."""
        async def get():
            try:
                async with self.sftp.open(path, "rb") as f:
                    return await f.read(CHUNK, offset)
            except asyncssh.SFTPNoSuchFile:
                return b""
        return await self._sftp(get())

    async def download_tree(self, remote_dir: str, local_dir: Path, skip: frozenset[str] = frozenset()) -> list[Path]:
        """Mirror `remote_dir` into `local_dir` (regular files only, none named in `skip`);
        returns the files written."""
        written: list[Path] = []

        async def walk(rdir: str, ldir: Path) -> None:
            ldir.mkdir(parents=True, exist_ok=True)
            for entry in await self.sftp.readdir(rdir):
                if entry.filename in (".", "..", *skip) or entry.filename.endswith((".tmp", ".part")):
                    continue
                rpath, lpath = posixpath.join(rdir, entry.filename), ldir / entry.filename
                if stat.S_ISDIR(entry.attrs.permissions or 0):
                    await walk(rpath, lpath)
                elif stat.S_ISREG(entry.attrs.permissions or 0):
                    await self.sftp.get(rpath, str(lpath))
                    written.append(lpath)

        await self._sftp(walk(remote_dir, local_dir))
        return written

    async def _sftp(self, awaitable):
        try:
            return await awaitable
        except (OSError, asyncssh.Error) as e:
            raise InfraError(f"{self.host.name}: file transfer failed: {_describe(e)}") from None


def _describe(e: BaseException) -> str:
    text = getattr(e, "reason", None) or str(e) or type(e).__name__
    return " ".join(str(text).split())
