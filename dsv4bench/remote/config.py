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
        raise ConfigError(f"no hosts file at {file}; create it with a table per host, at least "
                          f'[hosts.NAME] ssh = "ALIAS" workdir = "DIR" (every key: docs/remote.md, section Hosts)'
                          ) from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read hosts file {file}: {e}") from None
    tables = data.get("hosts")
    if not isinstance(tables, dict) or not tables:
        raise ConfigError(f"{file} defines no hosts (a table hosts.NAME per host)")
    return {name: parse_host(name, table, f"{file}, host '{name}'", file.parent) for name, table in tables.items()}


def get_host(name: str, path: str | os.PathLike | None = None) -> HostConfig:
    hosts = load_hosts(path)
    if name not in hosts:
        raise ConfigError(f"unknown host '{name}' (known: {', '.join(sorted(hosts))})")
    return hosts[name]


def _string(v) -> bool:
    return isinstance(v, str)


def _text(v) -> bool:
    return isinstance(v, str) and v != ""


def _real(v) -> bool:  # TOML booleans are Python ints: refused wherever a number is wanted
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _positive(v) -> bool:
    return _real(v) and v > 0


def _count(v) -> bool:
    return isinstance(v, int) and _real(v) and v >= 0


def _env(v) -> bool:
    return isinstance(v, dict) and all(_ENV_NAME.match(k) and (_string(x) or _real(x)) for k, x in v.items())


# Every key's type, checked before anything connects or launches: key -> (check, what it must do).
_CHECKS = {
    "ssh": (_text, "be a non-empty string"),
    "workdir": (_text, "be a non-empty string"),
    "backend": (lambda v: v in BACKENDS, f"be one of {', '.join(BACKENDS)}"),
    "python": (_text, "be a non-empty string"),
    "setup": (_string, "be a string"),
    "env": (_env, "map variable names to strings or numbers"),
    "gpu": (_count, "be a GPU index (an integer >= 0)"),
    "gpu_lock": (lambda v: isinstance(v, bool), "be true or false"),
    "timeout_s": (_positive, "be a positive number"),
    "kill_grace_s": (_positive, "be a positive number"),
    "connect_timeout_s": (_positive, "be a positive number"),
    "keep_jobs": (_count, "be an integer >= 0"),
    "ssh_config": (_text, "be a path (a non-empty string)"),
    "sbatch": (lambda v: isinstance(v, list) and all(map(_string, v)), "be a list of strings"),
    "slurm_bin": (_string, "be a string"),
}
assert set(_CHECKS) == {f.name for f in fields(HostConfig)} - {"name"}


def parse_host(name: str, table: object, where: str, base: Path) -> HostConfig:
    """A host's settings from its table, every key type-checked (`where` names it in errors);
    a relative `ssh_config` is under `base`."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where} is not a table")
    unknown = sorted(set(table) - set(_CHECKS))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")
    for key in ("ssh", "workdir"):
        if not isinstance(table.get(key), str) or not table[key]:
            raise ConfigError(f"{where}: '{key}' (a string) is required")
    for key, value in table.items():
        check, what = _CHECKS[key]
        if not check(value):
            raise ConfigError(f"{where}: {key} must {what}, not {value!r:.60}")
    values = {**table, "env": {k: str(v) for k, v in table.get("env", {}).items()},
              "sbatch": tuple(table.get("sbatch", ()))}
    if "ssh_config" in values:
        values["ssh_config"] = str((base / Path(values["ssh_config"]).expanduser()).resolve())
    return HostConfig(name=name, **values)
