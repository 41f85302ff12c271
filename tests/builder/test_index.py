"""arcvllm.builder.index.fetch: a download checked by sha256, asked for again when the connection
breaks mid-body (a real HTTP server on 127.0.0.1 that cuts its first answers short)."""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator

import pytest

from arcvllm.builder import index
from arcvllm.errors import ArcvllmError, Unavailable

BODY = b"wheel bytes " * 4096
SHA256 = hashlib.sha256(BODY).hexdigest()


class Server(http.server.ThreadingHTTPServer):
    cut_first: int = 0  # how many answers end before their Content-Length
    status: int = 200
    asked: int = 0


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        server: Server = self.server  # type: ignore[assignment]
        server.asked += 1
        self.send_response(server.status)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        if server.asked <= server.cut_first:
            self.wfile.write(BODY[:100])  # then the connection closes: a short body
            self.close_connection = True
            return
        self.wfile.write(BODY)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server(monkeypatch) -> Iterator[Server]:
    monkeypatch.setattr(index, "RETRY_DELAY", 0.0)
    srv = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join()


def url(srv: Server) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}/impi_rt-1-py3-none-any.whl"


def test_a_download_cut_short_is_asked_for_again_and_verified(server, tmp_path, capsys):
    server.cut_first = 1
    got = index.fetch(url(server), SHA256, tmp_path)
    assert got.read_bytes() == BODY and server.asked == 2
    assert "trying again (2/3)" in capsys.readouterr().err


def test_a_download_cut_short_every_time_fails_after_three_tries_and_leaves_nothing(
    server, tmp_path
):
    server.cut_first = 99
    with pytest.raises(Unavailable) as err:
        index.fetch(url(server), SHA256, tmp_path)
    assert server.asked == 3 and "cannot download" in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_nothing_listening_is_said_once(tmp_path, capsys):
    from support.processes import free_port

    with pytest.raises(Unavailable):
        index.fetch(f"http://127.0.0.1:{free_port()}/a.whl", SHA256, tmp_path)
    assert "trying again" not in capsys.readouterr().err


def test_a_missing_file_is_not_asked_for_again(server, tmp_path):
    server.status = 404
    with pytest.raises(Unavailable):
        index.fetch(url(server), SHA256, tmp_path)
    assert server.asked == 1


def test_a_wrong_sum_is_refused_and_the_file_not_kept(server, tmp_path):
    with pytest.raises(ArcvllmError) as err:
        index.fetch(url(server), "0" * 64, tmp_path)
    assert "the pin says" in str(err.value) and list(tmp_path.iterdir()) == []


def test_uv_is_told_pip_s_index_first_then_the_extra_ones_that_exist(monkeypatch, tmp_path):
    """uv takes the first index that has a project, pip weighs them all alike: pip's own
    index leads, so a mirror's other build of a locked wheel cannot shadow it."""
    local = tmp_path / "simple"
    local.mkdir()
    monkeypatch.setenv("PIP_INDEX_URL", "https://mirror.example/simple")
    extras = f"file://{tmp_path}/absent file://{local} https://extra.example/simple"
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", extras)
    monkeypatch.setenv("PIP_FIND_LINKS", "/srv/wheels")
    assert index.uv_sources() == [
        "--index", "https://mirror.example/simple",
        "--index", f"file://{local}",
        "--index", "https://extra.example/simple",
        "--find-links", "/srv/wheels",
        "--default-index", "https://mirror.example/simple",
        "--system-certs",
    ]  # fmt: skip


def test_the_ca_file_is_pips_cert_else_the_platforms(monkeypatch, tmp_path):
    cert = tmp_path / "mirror-ca.pem"
    monkeypatch.setenv("PIP_CERT", str(cert))
    assert index.ca_bundle() == str(cert)
    monkeypatch.delenv("PIP_CERT")
    monkeypatch.setattr(index, "pip_config", lambda: {})
    platform = tmp_path / "store.pem"
    platform.write_text("")
    monkeypatch.setenv("SSL_CERT_FILE", str(platform))
    assert index.ca_bundle() == str(platform)


def test_an_index_that_does_not_answer_is_not_said_to_lack_the_file(monkeypatch):
    """Before, every failure read "has no FILE": a certificate the client refused too."""

    def unreadable(project, where):
        raise index.Unavailable(f"index {where}: cannot read project {project}: SSLError")

    monkeypatch.setattr(index, "_packages", unreadable)
    with pytest.raises(index.Unavailable, match="cannot read project vllm: SSLError"):
        index.file_url("vllm", "vllm-0.20.2.tar.gz", "0" * 64, "https://mirror.example/simple")
    monkeypatch.setattr(index, "_packages", lambda project, where: [])
    with pytest.raises(index.Unavailable, match=r"has no vllm-0\.20\.2\.tar\.gz for project vllm"):
        index.file_url("vllm", "vllm-0.20.2.tar.gz", "0" * 64, "https://mirror.example/simple")
