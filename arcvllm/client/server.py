"""The running server a client command is pointed at, from any host that reaches it: its
URL, the served model (or the preset naming it), the API key, the CA bundle and where its
log comes from. Smoke, verify and bench each add their own options to these."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from arcvllm.client.log import LogSource


@dataclass(frozen=True)
class ServerOptions:
    """The server and how to reach it: the fields smoke's, verify's and bench's options share."""

    base_url: str
    model: str | None = None
    preset: str | None = None
    api_key: str | None = None
    ca_cert: str | None = None
    log: LogSource = field(default_factory=LogSource)

    @staticmethod
    def server_fields(args: argparse.Namespace) -> dict[str, Any]:
        """These fields from argparse (options.add_server, add_log_source): what a command
        does not offer is None (a deployment gives the server, key and log itself)."""
        return {
            "base_url": getattr(args, "base_url", None),
            "model": args.model,
            "preset": args.preset,
            "api_key": getattr(args, "api_key", None),
            "ca_cert": str(args.ca_cert) if getattr(args, "ca_cert", None) else None,
            "log": LogSource(
                file=getattr(args, "log_file", None), cmd=getattr(args, "log_cmd", None)
            ),
        }
