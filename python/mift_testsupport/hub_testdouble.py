"""TEST DOUBLE: a stand-in for the Hugging Face hub, for ``HF_ENDPOINT``.

The project has no hub account and reaches no address but loopback and the test hosts, so this small
stdlib HTTP server answers the endpoints ``huggingface_hub.snapshot_download`` uses (read from
huggingface_hub 1.33's ``hf_api.py``, ``file_download.py``, ``utils/_http.py``), serving local folders as
repos:

- ``GET /api/{models,datasets}/ORG/NAME/revision/REV``: the repo info (``sha``: the commit, ``siblings``);
- ``GET /api/{models,datasets}/ORG/NAME/tree/REV?recursive=...``: every file (``oid`` the git blob sha1,
  ``lfs`` with the sha256 for weight files), one page;
- ``HEAD``/``GET /[datasets/]ORG/NAME/resolve/REV/PATH``: ``X-Repo-Commit``, ``ETag`` (the blob sha1, or for
  an LFS file the sha256 as ``X-Linked-Etag``), ``Content-Length`` / ``X-Linked-Size``; an LFS file answers
  ``302`` with ``Location`` to ``http://localhost:PORT/lfs-objects/SHA256`` (another host name, as the hub's
  CDN: the client stops there for the metadata and sends no token), which serves the bytes.

Errors as the hub sends them (the headers huggingface_hub reads): a gated repo without a token ``401``
``X-Error-Code: GatedRepo``; a token it does not know ``401`` ``X-Error-Message: Invalid credentials in
Authorization header``; a known token not granted the repo ``403`` ``GatedRepo``; an unknown repo ``404``
``RepoNotFound``; an unknown revision ``404`` ``RevisionNotFound``. Every request is kept in ``requests``
(method, path, whether a token came: never the token).

    python -m mift_testsupport.hub_testdouble --port 0 --repo ORG/NAME=FOLDER --gated ORG/NAME \\
        --token-file FILE      # prints "serving http://127.0.0.1:PORT"
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    from collections.abc import Iterator

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")
INVALID_CREDENTIALS = "Invalid credentials in Authorization header"
CDN_HOST = "localhost"  # the same server under another name than the endpoint's 127.0.0.1


def _git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


@dataclass
class Repo:
    """One repo served: its files (relative path -> bytes), its commit, who may read it."""

    repo_id: str
    repo_type: str  # model | dataset
    files: dict[str, bytes]
    gated: bool = False
    granted: set[str] = field(default_factory=set)  # tokens granted access to a gated repo
    branches: tuple[str, ...] = ("main",)

    @property
    def commit(self) -> str:
        digest = hashlib.sha1(usedforsecurity=False)
        for rel in sorted(self.files):
            digest.update(rel.encode() + b"\0" + _git_blob_sha1(self.files[rel]).encode())
        return digest.hexdigest()

    @classmethod
    def from_folder(cls, repo_id: str, folder: Path, repo_type: str = "model", **kw: object) -> Repo:
        files = {
            p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
        }
        return cls(repo_id, repo_type, files, **kw)  # type: ignore[arg-type]


@dataclass
class HubState:
    repos: dict[tuple[str, str], Repo] = field(default_factory=dict)  # (type, id) -> repo
    tokens: set[str] = field(default_factory=set)  # tokens the hub knows
    requests: list[tuple[str, str, bool]] = field(default_factory=list)

    def add(self, repo: Repo) -> None:
        self.repos[(repo.repo_type, repo.repo_id)] = repo
        self.tokens |= repo.granted

    def blob(self, sha256: str) -> bytes | None:
        for repo in self.repos.values():
            for data in repo.files.values():
                if hashlib.sha256(data).hexdigest() == sha256:
                    return data
        return None


class _Refused(Exception):  # noqa: N818 - an answer, not a failure of ours
    def __init__(self, status: int, code: str | None, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    # --- routing

    def _answer(self, *, head: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        auth = self.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else None
        self.server.state.requests.append((self.command, path, token is not None))
        try:
            if path.startswith("/lfs-objects/"):
                data = self._object(path.rsplit("/", 1)[1])
                self._send(200, data, {"ETag": f'"{hashlib.sha256(data).hexdigest()}"'}, head=head)
            elif path.startswith("/api/"):
                self._api(path.removeprefix("/api/"), token)
            else:
                self._resolve(path.lstrip("/"), token, head=head)
        except _Refused as err:
            headers = {"X-Error-Message": err.message, **({"X-Error-Code": err.code} if err.code else {})}
            self._send(err.status, json.dumps({"error": err.message}).encode(), headers, head=head)

    def _object(self, sha256: str) -> bytes:
        data = self.server.state.blob(sha256)
        if data is None:
            raise _Refused(404, "EntryNotFound", "no such object")
        return data

    def _repo(self, repo_type: str, repo_id: str, token: str | None) -> Repo:
        state = self.server.state
        if token is not None and token not in state.tokens:
            raise _Refused(401, None, INVALID_CREDENTIALS)
        repo = state.repos.get((repo_type, repo_id))
        if repo is None:
            raise _Refused(401 if token is None else 404, "RepoNotFound", "Repository not found")
        if repo.gated and token is None:
            raise _Refused(
                401,
                "GatedRepo",
                f"Access to {repo_type} {repo_id} is restricted. You must have access to it and be "
                "authenticated to access it. Please log in.",
            )
        if repo.gated and token not in repo.granted:
            raise _Refused(
                403,
                "GatedRepo",
                f"Access to {repo_type} {repo_id} is restricted and you are not in the authorized list.",
            )
        return repo

    @staticmethod
    def _commit_of(repo: Repo, revision: str) -> str:
        if revision in repo.branches or revision == repo.commit:
            return repo.commit
        raise _Refused(404, "RevisionNotFound", f"Invalid rev id: {revision}")

    def _api(self, rest: str, token: str | None) -> None:
        kind, _, rest = rest.partition("/")  # models | datasets
        parts = rest.split("/")
        if kind not in ("models", "datasets") or len(parts) < 4 or parts[2] not in ("revision", "tree"):
            raise _Refused(404, None, "no such endpoint")
        repo = self._repo(kind[:-1], "/".join(parts[:2]), token)
        commit = self._commit_of(repo, parts[3])
        if parts[2] == "revision":
            body = {
                "id": repo.repo_id,
                "sha": commit,
                "private": False,
                "gated": "manual" if repo.gated else False,
                "siblings": [{"rfilename": rel} for rel in sorted(repo.files)],
            }
        else:
            body = [self._tree_entry(rel, data) for rel, data in sorted(repo.files.items())]  # type: ignore[assignment]
        self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"}, head=False)

    @staticmethod
    def _tree_entry(rel: str, data: bytes) -> dict[str, object]:
        entry: dict[str, object] = {
            "type": "file",
            "oid": _git_blob_sha1(data),
            "size": len(data),
            "path": rel,
        }
        if rel.endswith(LFS_SUFFIXES):
            entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return entry

    def _resolve(self, rest: str, token: str | None, *, head: bool) -> None:
        repo_type = "model"
        if rest.startswith("datasets/"):
            repo_type, rest = "dataset", rest.removeprefix("datasets/")
        parts = rest.split("/")
        if len(parts) < 5 or parts[2] != "resolve":
            raise _Refused(404, None, "no such endpoint")
        repo = self._repo(repo_type, "/".join(parts[:2]), token)
        commit = self._commit_of(repo, parts[3])
        rel = "/".join(parts[4:])
        if rel not in repo.files:
            raise _Refused(404, "EntryNotFound", f"{rel} does not exist on {parts[3]}")
        data = repo.files[rel]
        headers = {"X-Repo-Commit": commit}
        if rel.endswith(LFS_SUFFIXES):
            sha256 = hashlib.sha256(data).hexdigest()
            # another host name, as the hub's CDN is: huggingface_hub takes the file's metadata from this
            # answer and sends no token there
            headers |= {
                "Location": f"http://{CDN_HOST}:{self.server.server_address[1]}/lfs-objects/{sha256}",
                "X-Linked-Etag": f'"{sha256}"',
                "X-Linked-Size": str(len(data)),
                "ETag": f'"{_git_blob_sha1(data)}"',
            }
            self._send(302, b"", headers, head=head)
        else:
            self._send(200, data, headers | {"ETag": f'"{_git_blob_sha1(data)}"'}, head=head)

    def _send(self, status: int, body: bytes, headers: dict[str, str], *, head: bool) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, state: HubState, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.state = state

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@contextlib.contextmanager
def serving(state: HubState, port: int = 0) -> Iterator[_Server]:
    """The stand-in hub on 127.0.0.1 (``port`` 0: a free one) in a thread of this process."""
    server = _Server(state, port)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mift_testsupport.hub_testdouble", description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--repo", action="append", default=[], help="ORG/NAME=FOLDER (a model repo)")
    parser.add_argument("--dataset", action="append", default=[], help="ORG/NAME=FOLDER (a dataset repo)")
    parser.add_argument("--gated", action="append", default=[], help="a repo id readable with a token only")
    parser.add_argument("--token-file", type=Path, help="the one token granted the gated repos")
    args = parser.parse_args(argv)
    granted = {args.token_file.read_text().strip()} if args.token_file else set()
    state = HubState()
    for spec, kind in [(r, "model") for r in args.repo] + [(d, "dataset") for d in args.dataset]:
        repo_id, _, folder = spec.partition("=")
        gated = repo_id in args.gated
        state.add(
            Repo.from_folder(repo_id, Path(folder), kind, gated=gated, granted=granted if gated else set())
        )
    with serving(state, args.port) as server:
        print(f"serving {server.url}", flush=True)
        threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
