"""`arcvllm scale`: N replicas behind the router (arcvllm.operate.scale)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from arcvllm import options
from arcvllm.operate import replicas, scale, single


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "scale",
        help="N replicas behind vLLM's router (docker/compose.scale.yaml), started or stopped",
        description=scale.__doc__.splitlines()[0],
    )
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = sub.add_parser(
        "up",
        help="start N replicas + the router; wait until they serve",
        description="Start N replicas (K Arc Pro B70s each, K the preset's "
        "tensor-parallel-size) and the gateway, wait until "
        "they are healthy, then start the router with the healthy ones and wait until it "
        "serves. A replica that is not healthy by --timeout while another is gets stopped "
        "alone and named (exit 4); with none healthy, everything started is stopped (exit 3). "
        "The single deployment of the same settings must be stopped first (exit 2); its "
        "gateway's certificate is the one served, so clients keep their CA.",
        exit_rows=scale.EXIT_ROWS,
    )
    start.add_argument("--replicas", type=int, default=2, help="how many (2)")
    gpus_per_replica(start)
    start.add_argument("--cpu", action="store_true", help="two CPU replicas of the tiny model")
    start.add_argument(
        "--monitoring",
        action="store_true",
        help="Prometheus and Alertmanager too (ALERT_WEBHOOK_URL)",
    )
    start.add_argument("--timeout", type=float, default=1800.0, help="replica health, s (1800)")
    start.add_argument("--router-timeout", type=float, default=60.0, help="router ready, s (60)")
    start.add_argument(
        "--single-project",
        default=single.PROJECT,
        help="the single deployment (make up's project) it takes over from: stopped first, "
        f"its gateway's certificate served ({single.PROJECT})",
    )
    start.add_argument("--dev-root", default="/", help=argparse.SUPPRESS)
    made = sub.add_parser(
        "render",
        help="write the XPU replicas' compose file for this host's B70s (compose by hand)",
        description="Write the compose file of N XPU replicas, K Arc Pro B70s of this host "
        "each (their render nodes, by-path entries and GID only), to use after compose.yaml "
        "and compose.scale.yaml. `scale up` writes the same file for itself.",
    )
    made.add_argument("--replicas", type=int, default=2, help="how many (2)")
    gpus_per_replica(made)
    made.add_argument("--out", type=Path, required=True, help="the file to write")
    made.add_argument("--dev-root", default="/", help=argparse.SUPPRESS)
    options.add_json(made)
    made.set_defaults(func=_render)
    stop = sub.add_parser(
        "down",
        help="stop and remove the scale-out project (volumes kept unless --purge)",
        description="Stop and remove the scale-out project's containers. Each server gets "
        "SIGTERM and drains its requests for up to its preset's shutdown_timeout, within the "
        "services' stop_grace_period. The named volumes (compile caches, Prometheus and "
        "Alertmanager data) are kept unless --purge.",
    )
    stop.add_argument(
        "--purge",
        action="store_true",
        help="remove the project's named volumes too (compile caches: the next start "
        "compiles again; Prometheus history)",
    )
    for each in (start, stop):
        each.add_argument(
            "--env-file",
            type=options.existing_file,
            default="docker/arcvllm.env",
            help="the settings file (docker/arcvllm.env)",
        )
        each.add_argument(
            "--project",
            default=scale.PROJECT,
            help="the compose project: a second deployment on this host needs its own "
            f"({scale.PROJECT})",
        )
        options.add_json(each)
    start.set_defaults(func=_up)
    stop.set_defaults(func=_down)


def gpus_per_replica(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gpus-per-replica",
        type=int,
        default=1,
        metavar="K",
        help="Arc Pro B70s per replica, its TP group: must divide the host's B70s and equal "
        "the preset's tensor-parallel-size (1)",
    )


def start_of(args: argparse.Namespace) -> scale.Start:
    """What `scale up`'s ARGS ask to start."""
    return scale.Start(
        env_file=args.env_file,
        project=args.project,
        replicas=args.replicas,
        cpu=args.cpu,
        monitoring=args.monitoring,
        timeout=args.timeout,
        router_timeout=args.router_timeout,
        dev_root=Path(args.dev_root),
        gpus_per_replica=args.gpus_per_replica,
        single_project=args.single_project,
    )


def said(started: scale.Started, as_json: bool) -> int:
    """What `scale up` prints of STARTED (AS_JSON: as JSON), each replica down named on
    stderr: the exit status (degraded, with a replica down)."""
    if as_json:
        down = [{"replica": r, "why": why} for r, why in started.failed.items()]
        doc: dict[str, Any] = {"project": started.project, "replicas": started.serving}
        doc |= {"gateway": f"https://127.0.0.1:{started.port}", "down": down}
        doc |= {"degraded": bool(started.failed), "profiles": started.profiles}
        print(json.dumps(doc, indent=2))
    else:
        print(
            f"{len(started.serving)} of {len(started.replicas)} replicas healthy behind the "
            f"router, gateway on port {started.port}"
        )
    for name, why in started.failed.items():
        print(f"arcvllm: degraded: replica {name} is down (stopped): {why}", file=sys.stderr)
    return scale.DEGRADED if started.failed else 0


def _up(args: argparse.Namespace) -> int:
    return said(scale.up(start_of(args)), args.json)


def _render(args: argparse.Namespace) -> int:
    out = args.out.resolve()
    groups = scale.write_replicas_file(
        args.replicas, out, Path(args.dev_root), args.gpus_per_replica
    )
    if args.json:
        rows = [
            {
                "replica": replicas.name(i),
                "gpus": [{"slot": c.slot, "render": c.path, "gid": c.gid} for c in group],
                "mask": replicas.mask(group),
            }
            for i, group in enumerate(groups)
        ]
        print(json.dumps({"file": str(out), "replicas": rows}, indent=2))
        return 0
    for i, group in enumerate(groups):
        gpus = ", ".join(f"{c.slot} {c.path} (GID {c.gid})" for c in group)
        print(f"{replicas.name(i)}: {gpus}")
    print(f"wrote {out}")
    return 0


def _down(args: argparse.Namespace) -> int:
    scale.down(args.env_file, args.project, args.purge)
    if args.json:
        print(json.dumps({"project": args.project, "down": True, "volumes_removed": args.purge}))
    elif args.purge:
        print(f"{args.project}: down; its named volumes (compile caches, Prometheus data) removed")
    else:
        print(f"{args.project}: down; named volumes kept (compile caches, Prometheus data)")
    return 0
