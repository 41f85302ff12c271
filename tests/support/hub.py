"""A stand-in for the Hugging Face Hub's HTTP interface, for `arcvllm model fetch` tests.

The hub is not reachable from CI. This small real HTTP server on loopback serves, from a
local folder per repository, the endpoints huggingface_hub's snapshot_download calls, with
the headers the client reads (huggingface_hub's own code decides what it does with them):

- GET  /api/models/{repo}/revision/{rev}   repo_info: `sha` (the commit), `siblings`
- GET  /api/models/{repo}/tree/{rev}       list_repo_tree: files with size, oid and `lfs`
- HEAD /{repo}/resolve/{rev}/{path}        file metadata: X-Repo-Commit, ETag (the git
                                            blob id, or the sha256 of an LFS file),
                                            Content-Length, Accept-Ranges
- GET  /{repo}/resolve/{rev}/{path}        the bytes, with Range (206) for a resumed file

Unknown repositories and revisions answer 404 with the hub's X-Error-Code
(RepoNotFound, RevisionNotFound); with a token set, a request without
`Authorization: Bearer <token>` answers 401. Every request is recorded (method, path,
Range, whether it carried the token). `cut_after` makes each GET that starts at byte 0
stop after that many bytes (a dropped connection; huggingface_hub keeps what it wrote in
whole 10 MiB chunks and asks for the rest with Range), `broken` makes a GET of the named
files answer 500: what resuming is tested with.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

# Files the hub keeps in LFS (their ETag is the sha256 of the content).
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    range: str | None
    authorized: bool


@dataclass
class Repo:
    folder: Path
    commit: str
    branches: dict[str, str] = field(default_factory=dict)

    def files(self) -> list[Path]:
        return sorted(p for p in self.folder.rglob("*") if p.is_file())

    def entry(self, path: Path) -> dict:
        data = path.read_bytes()
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        entry = {"type": "file", "path": path.relative_to(self.folder).as_posix()}
        entry |= {"size": len(data), "oid": blob}
        if path.name.endswith(LFS_SUFFIXES):
            sha = hashlib.sha256(data).hexdigest()
            entry["lfs"] = {"oid": sha, "size": len(data), "pointerSize": 134}
        return entry


@dataclass
class HubStandIn:
    """The stand-in's state: its repositories, what it was asked, how it misbehaves."""

    repos: dict[str, Repo] = field(default_factory=dict)
    token: str | None = None
    cut_after: int | None = None
    broken: set[str] = field(default_factory=set)
    seen: list[Seen] = field(default_factory=list)
    url: str = ""

    def add(self, repo_id: str, folder: Path, commit: str | None = None) -> Repo:
        commit = commit or hashlib.sha1(repo_id.encode() + folder.name.encode()).hexdigest()
        repo = Repo(folder, commit, {"main": commit})
        self.repos[repo_id] = repo
        return repo

    def requests(self, method: str | None = None) -> list[Seen]:
        return [s for s in self.seen if method is None or s.method == method]


def _handler(hub: HubStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:
            self.answer(head=True)

        def do_GET(self) -> None:
            self.answer(head=False)

        def send(self, status: int, body: bytes, headers: dict[str, str], head: bool) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def error(self, status: int, code: str, message: str, head: bool) -> None:
            body = json.dumps({"error": message}).encode()
            headers = {"Content-Type": "application/json", "X-Error-Code": code}
            self.send(status, body, headers | {"X-Error-Message": message}, head)

        def answer(self, head: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            auth = self.headers.get("Authorization")
            authorized = hub.token is not None and auth == f"Bearer {hub.token}"
            hub.seen.append(Seen(self.command, path, self.headers.get("Range"), authorized))
            if hub.token is not None and not authorized:
                return self.error(401, "", "Invalid credentials in Authorization header", head)
            if path.startswith("/api/models/"):
                return self.api(path.removeprefix("/api/models/"), head)
            if "/resolve/" in path:
                return self.resolve(path.lstrip("/"), head)
            return self.error(404, "EntryNotFound", f"no route {path}", head)

        def repo_and_commit(self, repo_id: str, revision: str, head: bool) -> Repo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self.error(404, "RepoNotFound", f"Repository {repo_id} not found", head)
                return None
            if revision not in (repo.commit, *repo.branches):
                self.error(404, "RevisionNotFound", f"Invalid rev id: {revision}", head)
                return None
            return repo

        def api(self, rest: str, head: bool) -> None:
            for verb in ("/revision/", "/tree/"):
                if verb in rest:
                    repo_id, _, revision = rest.partition(verb)
                    break
            else:
                repo_id, verb, revision = rest, "", "main"
            revision = revision.split("/", 1)[0]
            repo = self.repo_and_commit(repo_id, revision, head)
            if repo is None:
                return
            if verb == "/tree/":
                body = [repo.entry(p) for p in repo.files()]
            else:
                siblings = [{"rfilename": e["path"]} for e in map(repo.entry, repo.files())]
                body = {"id": repo_id, "modelId": repo_id, "sha": repo.commit}
                body |= {"private": False, "siblings": siblings, "tags": []}
            headers = {"Content-Type": "application/json", "X-Repo-Commit": repo.commit}
            self.send(200, json.dumps(body).encode(), headers, head)

        def resolve(self, rest: str, head: bool) -> None:
            repo_id, _, tail = rest.partition("/resolve/")
            revision, _, name = tail.partition("/")
            repo = self.repo_and_commit(repo_id, revision, head)
            if repo is None:
                return
            file = repo.folder / name
            if not file.is_file():
                return self.error(404, "EntryNotFound", f"{name} not in {repo_id}", head)
            if name in hub.broken and not head:
                return self.error(500, "", "stand-in: this file is broken on purpose", head)
            entry = repo.entry(file)
            etag = entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]
            data = file.read_bytes()
            headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{etag}"'}
            headers |= {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
            wanted = self.headers.get("Range")
            if head or not wanted:
                cut = hub.cut_after
                if head or cut is None or cut >= len(data):
                    return self.send(200, data, headers, head)
                # A dropped connection: the full length promised, part of it sent.
                self.send_response(200)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[:cut])
                self.wfile.flush()
                self.close_connection = True
                return None
            start = int(wanted.removeprefix("bytes=").split("-", 1)[0])
            part = data[start:]
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            return self.send(206, part, headers, head)

    return Handler


@contextmanager
def hub_standin() -> Iterator[HubStandIn]:
    """The stand-in hub on a loopback port for the block; its URL in `.url`."""
    hub = HubStandIn()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    server.daemon_threads = True
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
