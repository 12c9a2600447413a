"""`remote hosts`: reach each host and read its GPU, driver, CUDA and cutlass-dsl versions."""

from __future__ import annotations

from dsv4bench.remote.config import HostConfig
from dsv4bench.remote.ssh import InfraError, Remote

# $1: the host's setup line, $2: its python. Prints KEY=VALUE lines.
_SCRIPT = r"""
eval "$1" >/dev/null 2>&1
smi() { nvidia-smi "$@" 2>/dev/null; }
echo "gpu=$(smi --query-gpu=index,name --format=csv,noheader | paste -sd ';' -)"
echo "driver=$(smi --query-gpu=driver_version --format=csv,noheader | head -n 1)"
echo "cuda=$(smi | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1)"
echo "cutlass_dsl=$("$2" -c 'from importlib.metadata import version; print(version("nvidia-cutlass-dsl"))' 2>/dev/null)"
echo "python=$("$2" -c 'import platform; print(platform.python_version())' 2>/dev/null)"
"""
FIELDS = ("gpu", "driver", "cuda", "cutlass_dsl", "python")


async def probe(host: HostConfig) -> dict[str, str]:
    """The host's facts; {"error": ...} when it cannot be reached."""
    try:
        async with Remote(host) as remote:
            out = (await remote.run(["bash", "-c", _SCRIPT, "probe", host.setup, host.python], timeout=60)).stdout
    except InfraError as e:
        return {"error": str(e)}
    facts = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return {k: facts.get(k, "") for k in FIELDS}
