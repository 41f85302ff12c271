"""docker/compose.scale.yaml as compose renders it, and the side images built as `make` does."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from support import ROOT
from support.compose import compose_binary

BASE = ROOT / "docker" / "compose.yaml"


SCALE = ROOT / "docker" / "compose.scale.yaml"


ENV_FILE = ROOT / "docker" / "arcvllm.env"


def compose_config(
    *profiles: str,
    env: dict[str, str] | None = None,
    scale: Path = SCALE,
    extra: tuple[Path, ...] = (),
) -> subprocess.CompletedProcess:
    args = [*compose_binary(), "--env-file", str(ENV_FILE), "-f", str(BASE), "-f", str(scale)]
    for path in extra:
        args += ["-f", str(path)]
    for profile in profiles:
        args += ["--profile", profile]
    return subprocess.run(
        [*args, "config"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", **(env or {})},
    )


def services(
    *profiles: str, env: dict[str, str] | None = None, extra: tuple[Path, ...] = ()
) -> dict[str, dict]:
    result = compose_config(*profiles, env=env, extra=extra)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)["services"]


def ports(service: dict) -> list[tuple[str, int, int]]:
    """(host address, published, target) whether compose printed the short or long form."""
    out = []
    for p in service.get("ports", []):
        if isinstance(p, str):
            host, published, target = p.split("/")[0].rsplit(":", 2)
            out.append((host, int(published), int(target)))
        else:
            out.append((p.get("host_ip", ""), int(p["published"]), int(p["target"])))
    return out


def side_image(name: str) -> str:
    """A side image's tag as configs/stacks.yaml declares it (`side_images:`, read by the one
    stacks loader): what `make` builds and compose runs."""
    from arcvllm.stack import side_images

    return side_images()[name].ref


ROUTER_IMAGE = side_image("router")


def build_target(target: str, tag: str) -> None:
    """Build the side image TARGET of docker/Dockerfile as `make` does (arcvllm.builder.image:
    the CPU stack's build args from configs/stacks.yaml, the image's SIDE_TAG, the commit's
    SOURCE_DATE_EPOCH for its SBOM), tagged TAG."""
    from arcvllm.builder import image

    spec = image.spec_for(None, side=target)
    spec.tags = [tag]
    image.build(spec, root=ROOT)
