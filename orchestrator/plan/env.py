"""The env group: the libraries a variant runs with instead of the driver's (env.pip), made
once per node by the variant's tasks (tasks/worker/envs.py; docs/regressions.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tasks.specs import EnvSpec, check_pins


@dataclass
class EnvCfg:
    pip: Any = None  # exact pins NAME==VERSION: one string or a list; null: the driver's own libraries

    def check(self) -> None:
        self.pip = list(check_pins("env.pip", self.pip))

    def spec(self) -> EnvSpec:
        return EnvSpec(tuple(check_pins("env.pip", self.pip)))
