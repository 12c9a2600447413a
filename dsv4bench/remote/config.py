"""Remote hosts: `~/.config/dsv4bench/hosts.toml` (or `--hosts FILE`), one table per host.

    [hosts.b200]
    ssh = "b200"                      # alias resolved through ~/.ssh/config (or `ssh_config`)
    workdir = "/scratch/me/dsv4bench" # jobs/, trees/, blobs/, locks/ live here
    python = "/opt/venv/bin/python"   # runs `python -m dsv4bench ARGS`
    setup = "source /opt/venv/bin/activate"   # a shell line run before the job (your own config)
    env = { CUTE_DSL_ARCH = "sm_100a" }
    gpu = 0                           # CUDA_VISIBLE_DEVICES and the per-GPU lock; omit for one host-wide lock
    timeout_s = 1800
    kill_grace_s = 15
    keep_jobs = 20                    # finished job directories kept on the host

    [hosts.cluster]
    backend = "slurm"
    ssh = "login"
    workdir = "/home/me/dsv4bench"
    sbatch = ["--gres=gpu:1", "--partition=gpu"]
    slurm_bin = "/opt/slurm/bin"      # where sbatch/sacct/scancel live; omit to use the login PATH
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

DEFAULT_HOSTS = Path("~/.config/dsv4bench/hosts.toml")
BACKENDS = ("ssh", "slurm")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class ConfigError(ValueError):
    """A hosts file that cannot be used: reported as one line, exit status 2."""


@dataclass(frozen=True)
class HostConfig:
    name: str
    ssh: str
    workdir: str
    backend: str = "ssh"
    python: str = "python3"
    setup: str = ""
    env: dict[str, str] = field(default_factory=dict)
    gpu: int | None = None
    gpu_lock: bool = True
    timeout_s: float = 3600.0
    kill_grace_s: float = 15.0
    connect_timeout_s: float = 20.0
    keep_jobs: int = 20
    ssh_config: str | None = None
    sbatch: tuple[str, ...] = ()
    slurm_bin: str = ""

    @property
    def lock_name(self) -> str:
        return f"gpu{self.gpu}" if self.gpu is not None else "host"

    def job_env(self) -> dict[str, str]:
        env = dict(self.env)
        if self.gpu is not None:
            env.setdefault("CUDA_VISIBLE_DEVICES", str(self.gpu))
        return env


def hosts_path(path: str | os.PathLike | None) -> Path:
    return Path(path or os.environ.get("DSV4BENCH_HOSTS") or DEFAULT_HOSTS).expanduser()


def load_hosts(path: str | os.PathLike | None = None) -> dict[str, HostConfig]:
    file = hosts_path(path)
    try:
        data = tomllib.loads(file.read_text())
    except FileNotFoundError:
        raise ConfigError(f"no hosts file at {file} (see `dsv4bench remote --help` for its format)") from None
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read hosts file {file}: {e}") from None
    tables = data.get("hosts")
    if not isinstance(tables, dict) or not tables:
        raise ConfigError(f"{file} defines no hosts (a table hosts.NAME per host)")
    return {name: _host(name, table, file) for name, table in tables.items()}


def get_host(name: str, path: str | os.PathLike | None = None) -> HostConfig:
    hosts = load_hosts(path)
    if name not in hosts:
        raise ConfigError(f"unknown host '{name}' (known: {', '.join(sorted(hosts))})")
    return hosts[name]


def _host(name: str, table: object, file: Path) -> HostConfig:
    where = f"{file}, host '{name}'"
    if not isinstance(table, dict):
        raise ConfigError(f"{where} is not a table")
    known = {f.name for f in fields(HostConfig)} - {"name"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")
    for key in ("ssh", "workdir"):
        if not isinstance(table.get(key), str) or not table[key]:
            raise ConfigError(f"{where}: '{key}' (a string) is required")
    if table.get("backend", "ssh") not in BACKENDS:
        raise ConfigError(f"{where}: backend must be one of {', '.join(BACKENDS)}")
    env = table.get("env", {})
    if not isinstance(env, dict) or any(not _ENV_NAME.match(k) for k in env):
        raise ConfigError(f"{where}: env must map variable names to values")
    gpu = table.get("gpu")
    if gpu is not None and (not isinstance(gpu, int) or gpu < 0):
        raise ConfigError(f"{where}: gpu must be a GPU index (>= 0)")
    sbatch = table.get("sbatch", [])
    if not isinstance(sbatch, list) or not all(isinstance(s, str) for s in sbatch):
        raise ConfigError(f"{where}: sbatch must be a list of strings")
    for key in ("timeout_s", "kill_grace_s", "connect_timeout_s"):
        if key in table and not (isinstance(table[key], (int, float)) and table[key] > 0):
            raise ConfigError(f"{where}: {key} must be a positive number")
    values = {**table, "env": {k: str(v) for k, v in env.items()}, "sbatch": tuple(sbatch)}
    if values.get("ssh_config"):
        values["ssh_config"] = str((file.parent / Path(values["ssh_config"]).expanduser()).resolve())
    return HostConfig(name=name, **values)
