"""`python sweep.py --help` alone: Hydra's help text, made through Hydra's public compose API.
Hydra's own --help lists every config group, its own included, before it drops those from the
app's help: some 80 loader calls, each copying Hydra's config store, most of the command's
time. This lists the app's groups only. Any other command line, or a help template that asks
for more than the app's groups and config, is left to Hydra. Equal to Hydra's: tests/test_config.py."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.object_type import ObjectType
from omegaconf import OmegaConf

__all__ = ["fast_help"]

ASKS = {"APP_CONFIG_GROUPS", "CONFIG"}  # the template's fields this module fills


def fast_help(argv: list[str], conf: Path, config_name: str, job_name: str) -> str | None:
    """Hydra's --help text for `argv` (the command line after the script), or None where
    Hydra must answer."""
    if argv not in (["--help"], ["-h"]) or GlobalHydra.instance().is_initialized():
        return None
    with initialize_config_dir(config_dir=str(conf), version_base="1.3", job_name=job_name):
        cfg = compose(config_name, return_hydra_config=True)
        template = string.Template(cfg.hydra.help.template)
        if not set(template.get_identifiers()) <= ASKS:
            return None
        loader = GlobalHydra.instance().config_loader()
        groups = _app_groups(loader, "")
        listed = "".join(f"{g}: {', '.join(sorted(options))}\n" for g, options in sorted(groups.items()))
        app = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
        return template.substitute(APP_CONFIG_GROUPS=listed, CONFIG=OmegaConf.to_yaml(app))


def _app_groups(loader: Any, parent: str) -> dict[str, list[str]]:
    """Each config group under `parent` but Hydra's own, with its options (as Hydra's help lists them)."""
    found: dict[str, list[str]] = {}
    for group in loader.list_groups(parent):
        name = f"{parent}/{group}" if parent else group
        if name == "hydra":
            continue
        options = loader.get_group_options(name, ObjectType.CONFIG)
        if options:
            found[name] = options
        if loader.get_group_options(name, ObjectType.GROUP):
            found.update(_app_groups(loader, name))
    return found
