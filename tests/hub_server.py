"""A local stand-in for the Hugging Face Hub on 127.0.0.1, for huggingface_hub's own client.

It speaks the part of the Hub's HTTP API that `snapshot_download` and `hf_hub_download` use
(HF_ENDPOINT=http://127.0.0.1:PORT): the repository's info at a revision
(/api/models/ORG/NAME/revision/REV), its file listing (/api/models/ORG/NAME/tree/REV), and
each file (HEAD and GET /ORG/NAME/resolve/REV/FILE, ranges included), with the Hub's headers
(X-Repo-Commit, ETag, X-Error-Code: RepoNotFound, RevisionNotFound, EntryNotFound,
GatedRepo). Repositories are folders of files held in memory; commits are made up. Every
request is logged, so a test sees what was downloaded, and that offline nothing was asked.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

LFS = (".safetensors", ".bin")  # stored in git-lfs on the Hub: their ETag is their sha256


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit -> {path: bytes}
    refs: dict[str, str] = field(default_factory=dict)  # branch or tag -> commit
    gated: bool = False  # files answer 403 GatedRepo (the repository's info stays public, as on the Hub)

    def add(self, ref: str, files: dict[str, bytes]) -> str:
        """A commit of `files`, which `ref` then names; its made-up hash."""
        commit = hashlib.sha1(json.dumps(sorted((k, hashlib.sha256(v).hexdigest()) for k, v in files.items())).encode()).hexdigest()
        self.commits[commit], self.refs[ref] = files, commit
        return commit

    def resolve(self, revision: str) -> str | None:
        return revision if revision in self.commits else self.refs.get(revision)


def folder_files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _entry(path: str, data: bytes) -> dict:
    """A file as the tree listing gives it."""
    blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's blob id
    entry = {"type": "file", "oid": blob, "size": len(data), "path": path}
    if path.endswith(LFS):
        entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
    return entry


class Hub(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.repos: dict[str, Repo] = {}
        self.log: list[tuple[str, str]] = []  # (method, path) of every request
        self.sent: dict[str, int] = {}  # file name -> bytes of it sent

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> Hub:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def downloads(self, name: str) -> int:
        """Whole GETs of a file of that name (not a range of it)."""
        return sum(1 for method, path in self.log if method == "GET" and "/resolve/" in path and path.endswith("/" + name))


class _Handler(BaseHTTPRequestHandler):
    server: Hub

    def log_message(self, *args) -> None:  # quiet: the Hub's log holds what tests read
        pass

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    def _answer(self, head: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        ranged = "Range" in self.headers
        self.server.log.append(("HEAD" if head else "RANGE" if ranged else "GET", path))
        parts = path.strip("/").split("/")
        api = parts[:2] == ["api", "models"]
        repo_id = "/".join(parts[2:4] if api else parts[0:2])
        repo = self.server.repos.get(repo_id)
        if repo is None:  # the Hub answers 401 for a repository it does not show this caller
            return self._error(401, "RepoNotFound", "Repository not found", head)
        kind, revision, rest = (parts[4], parts[5], parts[6:]) if api else (parts[2], parts[3], parts[4:])
        commit = repo.resolve(revision)
        if commit is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", head)
        files = repo.commits[commit]
        if api and kind == "revision":
            siblings = [{"rfilename": name} for name in files]
            return self._json({"id": repo_id, "modelId": repo_id, "sha": commit, "private": False, "gated": "auto" if repo.gated else False, "siblings": siblings}, head)
        if api and kind == "tree":
            return self._json([_entry(name, data) for name, data in files.items()], head)
        if kind != "resolve":
            return self._error(404, None, "Not found", head)
        if repo.gated:
            return self._error(403, "GatedRepo", "Access to this model is restricted", head)
        name = "/".join(rest)
        if name not in files:
            return self._error(404, "EntryNotFound", f"{name} does not exist", head)
        self._file(files[name], _entry(name, files[name]), commit, head)

    def _file(self, data: bytes, entry: dict, commit: str, head: bool) -> None:
        start, end = 0, len(data) - 1
        ranged = self.headers.get("Range", "")
        if ranged.startswith("bytes="):
            first, _, last = ranged[6:].partition("-")
            start, end = int(first or 0), min(int(last) if last else end, end)
        self.send_response(206 if ranged else 200)
        etag = entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]
        self.send_header("ETag", f'"{etag}"')
        self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Length", str(end - start + 1))
        if ranged:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.end_headers()
        if not head:  # counted before it is written: a client that has it finds it counted
            name = entry["path"]
            self.server.sent[name] = self.server.sent.get(name, 0) + end + 1 - start
            self.wfile.write(data[start : end + 1])

    def _json(self, obj, head: bool) -> None:
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _error(self, status: int, code: str | None, message: str, head: bool) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)


def tiny_llama_hub(folder: Path, repo_id: str) -> Hub:
    """A started Hub serving the tiny llama preset (its save_pretrained) as `repo_id`; its
    main commit is the Hub's `main`."""
    from tasks.model.models import build_model
    from tests.conftest import model_spec

    build_model(model_spec("llama")).save_pretrained(folder)
    hub = Hub().start()
    hub.repos[repo_id] = Repo()
    hub.main = hub.repos[repo_id].add("main", folder_files(folder))
    return hub
