"""One combination of group choices of a sweep (orchestrator.plan.compose): its config, each
top-level node's raw content and fingerprint, and a job's value overrides applied on top,
as Hydra's compose applies them (to a config) or as plain sets (to a node's raw content)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from hydra.core.override_parser.types import Override
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

__all__ = ["Combination", "apply", "exists", "has_interpolation", "set_plain"]


def apply(overrides: Sequence[Override], cfg: DictConfig) -> None:
    """Plain `key=value` overrides of existing keys, applied as Hydra's compose applies them."""
    for o in overrides:
        try:
            OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True)
        except OmegaConfBaseException as e:
            raise ConfigCompositionException(f"Error merging override {o.input_line}") from e


def set_plain(content: Any, sets: Sequence[tuple[Sequence[str], Any]]) -> Any | None:
    """`content` (a node's raw content) with each (path, value) set as `apply` sets a value
    that is no dict, on a node that is no dict: copied along each path, the rest shared.
    None where `apply` would merge (a dict), or would put a scalar in place of a list."""
    for path, value in sets:
        if not path or isinstance(value, dict) or not isinstance(content, dict):
            return None
        content = node = dict(content)
        for part in path[:-1]:
            child = node.get(part)
            if type(child) is not dict:
                return None
            node[part] = node = dict(child)
        old = node.get(path[-1])
        if path[-1] not in node or isinstance(old, dict) or (isinstance(old, list) and not isinstance(value, list)):
            return None
        node[path[-1]] = value
    return content


def has_interpolation(obj: Any) -> bool:
    if isinstance(obj, str):
        return "${" in obj
    if isinstance(obj, dict):
        return any(has_interpolation(k) or has_interpolation(v) for k, v in obj.items())
    if isinstance(obj, list | tuple):
        return any(has_interpolation(v) for v in obj)
    return False


def exists(cfg: DictConfig, key: str) -> bool:
    """`key` (dotted) names a node of `cfg` reached through dicts only."""
    node: Any = cfg
    for part in key.split("."):
        if not isinstance(node, DictConfig) or not part or part not in node:
            return False
        node = None if OmegaConf.is_interpolation(node, part) else node[part]  # not followed, as Hydra resolves it
    return True


class Combination:
    """One combination of group overrides, composed by Hydra (its defaults list recorded when
    it could be), or the reference with some groups swapped in from stars (`swaps`): then
    its config is made only when asked for."""

    def __init__(
        self,
        cfg: DictConfig | None,
        defaults: list[tuple[Any, ...]] | None = None,
        reference: Combination | None = None,
        swaps: dict[str, tuple[str, Combination]] | None = None,  # group -> (option, its star)
        task: list[str] | None = None,
    ):
        self._cfg, self.defaults = cfg, defaults
        self.reference, self.swaps, self.task = reference, swaps or {}, task
        source = cfg if cfg is not None else reference.cfg
        self.top = tuple(str(k) for k in source)
        self.choices = set(source.hydra.runtime.choices) if "hydra" in source else set()
        self._raw: dict[str, Any] = {}
        self._fingerprints: dict[str, tuple[str, bool]] = {}
        self._takes: dict[str, bool] = {}

    @property
    def cfg(self) -> DictConfig:
        """Its config (the reference's copy with the swapped groups' nodes, when swapped)."""
        if self._cfg is None:
            cfg = copy.deepcopy(self.reference.cfg)
            with open_dict(cfg):
                for group, (option, star) in self.swaps.items():
                    cfg[group] = copy.deepcopy(star.cfg[group])
                    cfg.hydra.runtime.choices[group] = option
                cfg.hydra.overrides.task = list(self.task)
            self._cfg = cfg
        return self._cfg

    def owner(self, key: str) -> Combination:
        """The combination whose config holds this combination's node `key` (a dotted key)."""
        top = key.split(".", 1)[0]
        if top in self.swaps:
            return self.swaps[top][1]
        return self if self.reference is None else self.reference

    def node(self, key: str) -> Any:
        """Its top-level node `key`, in the config that holds it (not a copy: read only)."""
        return self.owner(key).cfg[key]

    def takes(self, key: str) -> bool:
        """A value override of `key` can be applied on top: the combination has that key,
        reached through dicts, and it is not a group."""
        if key not in self._takes:
            owner = self.owner(key)
            self._takes[key] = key not in self.choices and (
                owner.takes(key) if owner is not self else exists(self.cfg, key)
            )
        return self._takes[key]

    def raw(self, key: str) -> Any:
        """The top-level node `key`'s content as plain dicts and lists, unresolved (shared:
        read only); None when it has no such node."""
        if key not in self._raw:
            owner = self.owner(key)
            if owner is not self:
                self._raw[key] = owner.raw(key)
            else:
                self._raw[key] = OmegaConf.to_container(OmegaConf.masked_copy(self.cfg, [key]), resolve=False).get(key)
        return self._raw[key]

    def fingerprint(self, key: str) -> tuple[str, bool]:
        """(the top-level node `key`'s raw content as text, whether it holds an interpolation)."""
        if key not in self._fingerprints:
            owner = self.owner(key)
            if owner is not self:
                self._fingerprints[key] = owner.fingerprint(key)
            else:
                raw = self.raw(key)
                self._fingerprints[key] = (repr(raw), has_interpolation(raw))
        return self._fingerprints[key]
