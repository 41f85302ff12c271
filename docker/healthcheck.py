#!/usr/bin/env python3
"""arcvllm-healthcheck: the one health probe of every image and compose file.

    arcvllm-healthcheck URL            GET URL: exit 0 on a 2xx answer, 1 otherwise
    arcvllm-healthcheck --tls HOST:PORT  a TLS handshake only (the gateway: its own health,
                                       not the server's behind it; no certificate check)
    arcvllm-healthcheck --status URL   print the HTTP status URL answers (0: no answer), exit 0

${VAR} and ${VAR:-default} in the argument are the environment's (a HEALTHCHECK's exec
form expands none: the image's ARCVLLM_PORT, ROUTER_PORT, GATEWAY_PORT). Standard library only: it runs
in every image (the server, the router, Prometheus, Alertmanager, the gateway), each with
the python3 of its base. --timeout SECONDS (4) stays under the healthchecks' own 5 s.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import ssl
import sys
import urllib.error
import urllib.request


_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand(text: str, environ=os.environ) -> str:
    """TEXT with each ${VAR} or ${VAR:-default} replaced as a shell would."""
    return _VARIABLE.sub(lambda m: environ.get(m.group(1)) or (m.group(2) or ""), text)


def status(url: str, timeout: float) -> int:
    """The HTTP status URL answers a GET with; 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):
        return 0


def handshake(address: str, timeout: float) -> bool:
    """Whether HOST:PORT completes a TLS handshake (any certificate: the gateway's own may be
    self-signed)."""
    host, _, port = address.rpartition(":")
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, int(port)), timeout) as raw:
            context.wrap_socket(raw, server_hostname=host).close()
    except (OSError, ValueError):
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="arcvllm-healthcheck", description=__doc__)
    parser.add_argument("target", help="a URL, or HOST:PORT with --tls")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--tls", action="store_true", help="a TLS handshake with HOST:PORT only")
    mode.add_argument("--status", action="store_true", help="print the status, exit 0")
    parser.add_argument("--timeout", type=float, default=4.0, help="seconds (4)")
    args = parser.parse_args(argv)
    target = expand(args.target)
    if args.tls:
        return 0 if handshake(target, args.timeout) else 1
    code = status(target, args.timeout)
    if args.status:
        print(code)
        return 0
    return 0 if 200 <= code < 300 else 1


if __name__ == "__main__":
    sys.exit(main())
