"""Declared variants as config overrides: a family's CuTeDSL impl whose `config(case)` is the
shipped tile rule's with some fields replaced (`cutedsl:<name>`, run only when named)."""

from __future__ import annotations

from dataclasses import replace


class ConfigKnobs:
    """Mix in before the family's CuTeDSL impl class. An override that makes an impossible
    configuration (the config's ValueError) leaves the case UNSUPPORTED, with the reason."""

    def __init__(self, name: str, knobs: dict):
        self.variant, self.name, self.knobs = name, f"cutedsl:{name}", dict(knobs)

    def config(self, case):
        return replace(super().config(case), **self.knobs)

    def supports(self, case, arch: str | None = None) -> str | None:
        try:
            self.config(case)
        except ValueError as e:
            return f"{self.name}: {e}"
        return super().supports(case, arch)
