"""HTTP servers in the test process: fakes that speak vLLM's shapes."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing and answers with one call."""

    def log_message(self, *args) -> None:
        pass

    def send(self, code: int, body: str, ctype: str = "application/json") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def start_events(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()

    def event(self, payload: dict | str) -> None:
        """One server-sent event, as vLLM streams them: a JSON chunk, or "[DONE]"."""
        data = payload if isinstance(payload, str) else json.dumps(payload)
        self.wfile.write(f"data: {data}\n\n".encode())
        self.wfile.flush()
