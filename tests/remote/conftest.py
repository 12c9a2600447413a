"""A real OpenSSH sshd on 127.0.0.1 with throwaway host and client keys, reached through an
ssh_config alias exactly as a user's host is; plus a hosts file, a job registry and helpers.

Nothing here touches ~/.ssh or the system sshd: every file lives in a temporary directory."""

from __future__ import annotations

import getpass
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD = Path("/usr/sbin/sshd")
STUBS = Path(__file__).parent / "stubs"
ALIAS = "loopback"


@dataclass
class Sshd:
    root: Path
    port: int
    ssh_config: Path
    proc: subprocess.Popen


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-N", "", "-t", "ed25519", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def write_ssh_config(path: Path, root: Path, port: int) -> None:
    """An ssh_config for the alias, and a known_hosts pinning the throwaway host key at that port."""
    known_hosts = path.with_name(path.name + ".known_hosts")
    known_hosts.write_text(f"[127.0.0.1]:{port} {(root / 'host_key.pub').read_text().strip()}\n")
    path.write_text(f"""Host {ALIAS}
    HostName 127.0.0.1
    Port {port}
    User {getpass.getuser()}
    IdentityFile {root / "client_key"}
    IdentitiesOnly yes
    UserKnownHostsFile {known_hosts}
""")


@pytest.fixture(scope="session")
def sshd(tmp_path_factory) -> Sshd:
    if not SSHD.exists():
        pytest.skip("needs /usr/sbin/sshd (Debian package openssh-server)")
    root = tmp_path_factory.mktemp("sshd")
    _keygen(root / "host_key")
    (root / "authorized_keys").write_text(_keygen(root / "client_key") + "\n")
    try:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    except OSError as e:
        pytest.skip(f"sshd needs /run/sshd, which cannot be created here: {e}")
    for _ in range(5):  # sshd takes no Port=0: pick a free port, retry if it is taken meanwhile
        port = _free_port()
        proc = subprocess.Popen([
            str(SSHD), "-D", "-e", "-f", "/dev/null", f"-oPort={port}", "-oListenAddress=127.0.0.1",
            f"-oHostKey={root / 'host_key'}", f"-oAuthorizedKeysFile={root / 'authorized_keys'}",
            "-oStrictModes=no", "-oPasswordAuthentication=no", "-oKbdInteractiveAuthentication=no",
            "-oPermitRootLogin=prohibit-password", "-oSubsystem=sftp internal-sftp", "-oMaxStartups=100",
            "-oMaxSessions=100", f"-oPidFile={root / 'sshd.pid'}",
        ], stdout=subprocess.DEVNULL, stderr=open(root / "sshd.log", "wb"))
        deadline = time.monotonic() + 10
        while proc.poll() is None and not _listening(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is None and _listening(port):
            break
        proc.kill()
    else:
        pytest.fail(f"sshd did not start: {(root / 'sshd.log').read_text()[-2000:]}")
    write_ssh_config(root / "ssh_config", root, port)
    yield Sshd(root, port, root / "ssh_config", proc)
    proc.terminate()
    proc.wait(10)


def toml_value(v) -> str:
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return repr(v)


@pytest.fixture
def make_host(sshd, tmp_path, monkeypatch):
    """make_host(name="loop", **settings) -> hosts file path; jobs are recorded under tmp_path."""
    hosts = tmp_path / "hosts.toml"
    monkeypatch.setenv("DSV4BENCH_HOSTS", str(hosts))
    monkeypatch.setenv("DSV4BENCH_STATE_DIR", str(tmp_path / "state"))
    tables: dict[str, dict] = {}

    def make(name: str = "loop", **settings) -> Path:
        table = {"ssh": ALIAS, "ssh_config": str(sshd.ssh_config), "workdir": str(tmp_path / "remote"),
                 "python": sys.executable, "timeout_s": 120, "kill_grace_s": 2, **settings}
        tables[name] = table
        hosts.write_text("".join(f"[hosts.{n}]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in t.items())
                                 for n, t in tables.items()))
        return hosts

    return make


@pytest.fixture
def stub_python(tmp_path) -> Path:
    """A directory of stub programs (tests/remote/stubs) to point `python` or PATH at."""
    bin_dir = tmp_path / "stubs"
    bin_dir.mkdir()
    for stub in STUBS.iterdir():
        (bin_dir / stub.name).write_bytes(stub.read_bytes())
        (bin_dir / stub.name).chmod(0o755)
    return bin_dir


def group_members(pgid: int) -> list[str]:
    """Live (non-zombie) processes of process group `pgid`, as `ps` lines."""
    out = subprocess.run(["ps", "-eo", "pgid=,pid=,stat=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.split()[0] == str(pgid) and not line.split()[2].startswith("Z")]
