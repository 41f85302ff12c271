"""A Kubernetes API server's pods, in this process: the part of the core v1 API a pod
watcher uses (kube-rs's `watcher`, as vllm-router runs it), with RBAC as a namespaced Role
grants it.

What it serves, as kube-apiserver does:
- `GET /api/v1/namespaces/NS/pods` (and `/api/v1/pods`, all namespaces): a PodList with
  the store's resourceVersion; `labelSelector` (equality terms) and `fieldSelector`
  `metadata.name=` honoured, anything else refused with 400 rather than ignored;
- the same with `watch=true`: from `resourceVersion` on (absent or "0": the current pods
  as ADDED first), ADDED / MODIFIED / DELETED events each carrying its object's
  resourceVersion, a BOOKMARK every `bookmark_s` when `allowWatchBookmarks=true`, the
  stream closed after `timeoutSeconds`; a resourceVersion older than the store's history
  gets an ERROR event 410 Gone (the client relists);
- a bearer token per service account (401 without one); 403 with a Status `Forbidden` for
  a verb or namespace the account's Role does not grant, as the RBAC authorizer answers;
- a pod deleted gracefully: MODIFIED with `deletionTimestamp` first (the kubelet's grace
  period), DELETED when `finish_delete` removes it.

Everything else (writes through the API, other resources, field managers, admission) is
not emulated: the test changes the pods directly, as the kubelet and controllers would."""

from __future__ import annotations

import copy
import datetime
import json
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import yaml

from support.httpd import QuietHandler


class Refused(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> dict:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }


def pod(namespace: str, name: str, labels: dict[str, str], ip: str, ready: bool = True) -> dict:
    """A Running pod as the kubelet reports it: its IP and its Ready condition."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels),
            "uid": f"{namespace}-{name}",
        },
        "spec": {"containers": [{"name": "vllm", "image": "arcvllm"}]},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def role_grants(role: dict, binding: dict) -> dict[str, dict[str, set[str]]]:
    """What a rendered Role and its RoleBinding grant: {service account "ns/name":
    {namespace: verbs on core pods}}."""
    assert binding["roleRef"]["kind"] == "Role"
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    namespace = role["metadata"]["namespace"]
    verbs = {
        verb
        for rule in role["rules"]
        if "" in rule.get("apiGroups", []) and {"pods", "*"} & set(rule.get("resources", []))
        for verb in rule["verbs"]
    }
    return {
        f"{s.get('namespace', binding['metadata']['namespace'])}/{s['name']}": {namespace: verbs}
        for s in binding["subjects"]
        if s["kind"] == "ServiceAccount"
    }


def _selects(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, selector.split(",")):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.split("==", 1) if "==" in term else term.split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        else:
            raise Refused(400, "BadRequest", f"label selector not emulated: {term!r}")
    return True


class PodsApi:
    """The emulated API server: pods in memory, served over http on 127.0.0.1."""

    def __init__(
        self, grants: dict[str, dict[str, set[str]]], bookmark_s: float = 5.0, history: int = 10_000
    ) -> None:
        self.history = history  # events kept for watches that resume from a resourceVersion
        self.grants = grants  # service account -> namespace -> verbs (role_grants)
        self.tokens = {f"token-{i}": sa for i, sa in enumerate(sorted(grants))}
        self.bookmark_s = bookmark_s
        self.pods: dict[tuple[str, str], dict] = {}
        self.events: list[tuple[int, str, dict]] = []  # (resourceVersion, type, pod)
        self.version = 1
        self.requests: list[
            tuple[str, str, int, str]
        ] = []  # (verb, namespace or "*", status, query)
        self.changed = threading.Condition()
        self.closed = False
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> PodsApi:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        with self.changed:
            self.closed = True
            self.changed.notify_all()
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path: Path, account: str) -> Path:
        """A kubeconfig for ACCOUNT ("ns/name"), as in-cluster credentials would be: the
        emulator's address and the account's token."""
        token = next(t for t, sa in self.tokens.items() if sa == account)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulated", "cluster": {"server": self.url}}],
            "users": [{"name": account, "user": {"token": token}}],
            "contexts": [
                {
                    "name": "emulated",
                    "context": {
                        "cluster": "emulated",
                        "user": account,
                        "namespace": account.split("/")[0],
                    },
                }
            ],
            "current-context": "emulated",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    # ---- what the kubelet and the controllers do --------------------------------------

    def _record(self, kind: str, obj: dict) -> None:
        """Under self.changed: a new resourceVersion on OBJ, the event kept and announced."""
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        self.events.append((self.version, kind, copy.deepcopy(obj)))
        del self.events[: -self.history]
        self.changed.notify_all()

    def put(self, obj: dict) -> None:
        """Create or replace a pod."""
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        with self.changed:
            kind = "MODIFIED" if key in self.pods else "ADDED"
            self.pods[key] = copy.deepcopy(obj)
            self._record(kind, self.pods[key])

    def set_ready(self, namespace: str, name: str, ready: bool) -> None:
        with self.changed:
            obj = self.pods[(namespace, name)]
            for condition in obj["status"]["conditions"]:
                if condition["type"] == "Ready":
                    condition["status"] = "True" if ready else "False"
            self._record("MODIFIED", obj)

    def delete(self, namespace: str, name: str, grace_s: int = 30) -> None:
        """`kubectl delete pod`: the pod is terminating (deletionTimestamp), still there."""
        with self.changed:
            obj = self.pods[(namespace, name)]
            now = datetime.datetime.now(datetime.timezone.utc)
            obj["metadata"]["deletionTimestamp"] = now.strftime("%Y-%m-%dT%H:%M:%SZ")
            obj["metadata"]["deletionGracePeriodSeconds"] = grace_s
            self._record("MODIFIED", obj)

    def finish_delete(self, namespace: str, name: str) -> None:
        """The kubelet reports the containers gone: the pod is removed (DELETED)."""
        with self.changed:
            obj = self.pods.pop((namespace, name))
            self._record("DELETED", obj)

    # ---- the API --------------------------------------------------------------------

    def _authorize(self, header: str | None, verb: str, namespace: str | None) -> None:
        account = self.tokens.get((header or "").removeprefix("Bearer ").strip())
        if account is None:
            raise Refused(401, "Unauthorized", "Unauthorized")
        granted = self.grants[account]
        if namespace is None:  # all namespaces: a ClusterRole's, which nobody here has
            allowed = False
            where = "at the cluster scope"
        else:
            allowed = verb in granted.get(namespace, set())
            where = f'in the namespace "{namespace}"'
        if not allowed:
            sa_ns, sa = account.split("/")
            raise Refused(
                403,
                "Forbidden",
                f'pods is forbidden: User "system:serviceaccount:'
                f'{sa_ns}:{sa}" cannot {verb} resource "pods" in API group "" {where}',
            )

    @staticmethod
    def _matches(obj: dict, namespace: str | None, query: dict[str, str]) -> bool:
        meta = obj["metadata"]
        if namespace is not None and meta["namespace"] != namespace:
            return False
        if not _selects(query.get("labelSelector", ""), meta.get("labels", {})):
            return False
        for term in filter(None, query.get("fieldSelector", "").split(",")):
            key, _, value = term.partition("=")
            if key != "metadata.name":
                raise Refused(400, "BadRequest", f"field selector not emulated: {term!r}")
            if meta["name"] != value.lstrip("="):
                return False
        return True

    def list(self, namespace: str | None, query: dict[str, str]) -> dict:
        if "continue" in query:
            raise Refused(400, "BadRequest", "continue tokens are not emulated (no limit here)")
        with self.changed:
            items = [
                copy.deepcopy(p) for p in self.pods.values() if self._matches(p, namespace, query)
            ]
            version = self.version
        return {
            "apiVersion": "v1",
            "kind": "PodList",
            "metadata": {"resourceVersion": str(version)},
            "items": items,
        }

    def watch(self, namespace: str | None, query: dict[str, str]):
        """The events of a watch from QUERY's resourceVersion, until its timeout (or close)."""
        deadline = time.monotonic() + float(query.get("timeoutSeconds", 1800))
        bookmarks = query.get("allowWatchBookmarks") == "true"
        since = query.get("resourceVersion", "")
        with self.changed:
            if since in ("", "0"):
                for p in self.pods.values():
                    if self._matches(p, namespace, query):
                        yield {"type": "ADDED", "object": copy.deepcopy(p)}
                seen = self.version
            else:
                seen = int(since)
                oldest = self.events[0][0] if self.events else self.version + 1
                if seen < oldest - 1:
                    yield {
                        "type": "ERROR",
                        "object": Refused(
                            410, "Expired", f"too old resource version: {seen} ({oldest - 1})"
                        ).status(),
                    }
                    return
        next_bookmark = time.monotonic() + self.bookmark_s
        while True:
            with self.changed:
                while not self.closed and self.version == seen:
                    now = time.monotonic()
                    if now >= deadline or (bookmarks and now >= next_bookmark):
                        break
                    wait = min(deadline, next_bookmark if bookmarks else deadline) - now
                    self.changed.wait(timeout=wait)
                if self.closed:
                    return
                fresh = [(v, k, o) for v, k, o in self.events if v > seen]
                seen = self.version
            for _, kind, obj in fresh:
                if self._matches(obj, namespace, query):
                    yield {"type": kind, "object": copy.deepcopy(obj)}
            now = time.monotonic()
            if now >= deadline:
                return
            if bookmarks and now >= next_bookmark:
                next_bookmark = now + self.bookmark_s
                yield {
                    "type": "BOOKMARK",
                    "object": {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {"resourceVersion": str(seen)},
                    },
                }

    def _handler(self):
        api = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                parts = url.path.strip("/").split("/")
                watching = query.get("watch") in ("true", "1")
                verb = "watch" if watching else "list"
                if parts == ["api", "v1", "pods"]:
                    namespace = None
                elif (
                    len(parts) == 5
                    and parts[:3] == ["api", "v1", "namespaces"]
                    and parts[4] == "pods"
                ):
                    namespace = parts[3]
                else:
                    api.requests.append(("get", url.path, 404, url.query))
                    self.send(404, json.dumps(Refused(404, "NotFound", "not emulated").status()))
                    return
                try:
                    api._authorize(self.headers.get("Authorization"), verb, namespace)
                    api._matches(pod("", "", {}, ""), None, query)  # a selector it can serve
                    body = None if watching else api.list(namespace, query)
                except Refused as exc:
                    api.requests.append((verb, namespace or "*", exc.code, url.query))
                    self.send(exc.code, json.dumps(exc.status()))
                    return
                api.requests.append((verb, namespace or "*", 200, url.query))
                if body is not None:
                    self.send(200, json.dumps(body))
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    for event in api.watch(namespace, query):
                        line = json.dumps(event).encode() + b"\n"
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

        return Handler
