"""A Hugging Face model id as model.checkpoint, resolved by huggingface_hub's own client.

`model.checkpoint=ORG/NAME` names a repository of the Hub (of HF_ENDPOINT) when no local path
of that text exists: an existing path always wins. `model.revision` (a branch, a tag or a
commit hash; null: the default branch) chooses its commit. The id is resolved to a snapshot
folder of this machine's Hugging Face cache (HF_HOME, HF_HUB_CACHE): files already cached are
used, others downloaded, none with HF_HUB_OFFLINE=1 (a branch or tag is then read from the
cache's refs). The token is huggingface_hub's own (HF_TOKEN, or `hf auth login`), never a key.

The driver resolves the id once (hub_checkpoint: the commit, then the rules of
tasks.model.checkpoint on the cached snapshot, or on config.json and the safetensors headers
read from the Hub when the weights are not cached); each task resolves that commit on its own
node (local_model), one download per commit and node under a file lock.
"""

from __future__ import annotations

import fcntl
import re
from dataclasses import replace
from pathlib import Path

from tasks.model.checkpoint import CONFIG, INDEX, PICKLES, SINGLE, Checkpoint, read_checkpoint
from tasks.specs import ConfigError, ModelSpec

ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")  # the Hub's ORG/NAME
# what a variant loads: config, weights, tokenizer; subfolders (onnx/, original/) hold other formats
WANTED = [CONFIG, INDEX, "*.safetensors", "generation_config.json", "tokenizer*", "special_tokens_map.json",
          "vocab.json", "merges.txt"]  # fmt: skip
SUBFOLDERS = "*/*"
OFFLINE = "HF_HUB_OFFLINE=1 forbids a download (unset it, or fill the cache first: hf download ORG/NAME)"


def is_hub_id(value: str | None) -> bool:
    """ORG/NAME naming no existing local path: a Hugging Face id (an existing path always wins)."""
    text = str(value or "")
    return bool(ID.fullmatch(text)) and ".." not in text and not Path(text).expanduser().exists()


def hub_checkpoint(repo_id: str, revision: str | None) -> Checkpoint:
    """The id's checkpoint at `revision`, its `revision` the commit: the cached snapshot with
    every rule of tasks.model.checkpoint checked, or, when the cache lacks its weights, its
    config.json checked against the safetensors headers alone. A one-line ConfigError naming
    the id otherwise. The listing comes first: no config.json or only pickle weights are
    refused before any weights are asked for."""
    label = repr(repo_id) + (f" (model.revision={revision!r})" if revision else "")
    first = _snapshot(repo_id, revision, [CONFIG, INDEX], label)  # the commit, its listing, config.json
    commit = first.name
    named = f"{label} (commit {commit})"
    _check_listing(repo_id, commit, named)
    shapes = _remote_shapes(repo_id, commit, named)
    if shapes is not None:  # the weights are not here: their headers suffice, each task fetches them on its node
        return replace(read_checkpoint(str(first), named, shapes), revision=commit)
    root = _snapshot(repo_id, commit, WANTED, label)
    return replace(read_checkpoint(str(root), named), revision=commit)


def _snapshot(repo_id: str, revision: str | None, patterns: list[str], label: str) -> Path:
    """snapshot_download of `patterns`, its errors as one line naming the id."""
    # lazy: huggingface_hub's client (httpx and its API), only for a Hub id
    from huggingface_hub import constants, errors, is_offline_mode, snapshot_download

    def refuse(why: str) -> ConfigError:
        return ConfigError(f"model.checkpoint={label}: {why}")

    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns, ignore_patterns=SUBFOLDERS))
    except errors.GatedRepoError:
        raise refuse("a gated repository: accept its conditions on its Hub page, then log in (hf auth login, or HF_TOKEN)") from None
    except errors.RepositoryNotFoundError:
        raise refuse(
            "no such local folder, and no Hugging Face repository of that id this token can read (a private one "
            "needs hf auth login, or HF_TOKEN)"
        ) from None
    except errors.RevisionNotFoundError:
        raise refuse(f"the repository has no revision {revision!r}; give a branch, a tag or a commit hash") from None
    except errors.LocalEntryNotFoundError as e:  # offline, or the Hub out of reach
        why = OFFLINE if is_offline_mode() else f"the Hub cannot be reached ({type(e.__cause__ or e).__name__})"
        raise refuse(
            f"no such local folder, and the Hugging Face cache ({constants.HF_HUB_CACHE}) lacks it or some of its files "
            f"at this revision; {why}"
        ) from None
    except errors.HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "?"
        raise refuse(f"the Hub answered HTTP {status} ({str(e).splitlines()[0]})") from None
    except errors.HFValidationError as e:
        raise refuse(f"not a valid Hugging Face id ({e})") from None


def _check_listing(repo_id: str, commit: str, label: str) -> None:
    """What the repository holds at `commit`, from the listing huggingface_hub cached with the
    snapshot: a config.json and safetensors weights. No listing cached (a cache another tool
    filled): the folder's own rules tell."""
    from huggingface_hub import errors, get_cached_repo_tree  # lazy: only for a Hub id

    try:
        files = [f.path for f in get_cached_repo_tree(repo_id, revision=commit)]
    except errors.CachedRepoTreeNotFoundError:
        return
    top = [f for f in files if "/" not in f]
    if CONFIG not in top:
        raise ConfigError(f"model.checkpoint={label}: the repository has no {CONFIG}; transformers needs it to build the model")
    if not any(f.endswith(".safetensors") for f in top):
        pickles = [f for f in top if f.endswith(PICKLES)]
        found = f"only pickle weights ({', '.join(pickles[:3])}), never loaded" if pickles else "no weights"
        raise ConfigError(f"model.checkpoint={label}: the repository holds {found}; phasesweep loads {SINGLE} (or sharded safetensors) only")


def _remote_shapes(repo_id: str, commit: str, label: str) -> dict[str, list[int]] | None:
    """The tensors' shapes from the Hub's safetensors headers (HTTP ranges, never the weights),
    when the cache lacks some of the weights and the Hub may be asked; else None."""
    # lazy: huggingface_hub's client, only for a Hub id
    from huggingface_hub import HfApi, errors, is_offline_mode, snapshot_download

    if is_offline_mode():
        return None
    try:  # the cache holds every file of the snapshot already: read there
        snapshot_download(repo_id, revision=commit, allow_patterns=WANTED, ignore_patterns=SUBFOLDERS, local_files_only=True)
        return None
    except errors.LocalEntryNotFoundError:
        pass
    try:
        found = HfApi().get_safetensors_metadata(repo_id, revision=commit)
    except (errors.NotASafetensorsRepoError, errors.SafetensorsParsingError) as e:
        raise ConfigError(f"model.checkpoint={label}: {str(e).splitlines()[0]}") from None
    except (errors.HfHubHTTPError, OSError):
        return None  # the headers out of reach: the weights themselves are fetched and read
    return {name: list(t.shape) for meta in found.files_metadata.values() for name, t in meta.tensors.items()}


def local_model(model: ModelSpec) -> ModelSpec:
    """`model` with a Hugging Face id made this node's snapshot folder of its commit (the
    cache's, or downloaded once per node and commit); a folder or preset unchanged."""
    if not model.revision or not model.checkpoint:
        return model
    # lazy: huggingface_hub's client, only for a Hub id
    from huggingface_hub import constants, snapshot_download

    repo = "models--" + model.checkpoint.replace("/", "--")  # the cache's own folder name
    lock = Path(constants.HF_HUB_CACHE) / ".locks" / repo / f"{model.revision}.phasesweep.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # two tasks of this node: the second finds the first's files; closing releases it
        root = snapshot_download(model.checkpoint, revision=model.revision, allow_patterns=WANTED, ignore_patterns=SUBFOLDERS)
    return replace(model, checkpoint=root)
