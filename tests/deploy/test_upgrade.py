"""The operator's running deployment on the CPU flavour, as the documents say: the
documents' `cpu` blocks run as written, in order (docs/deploy.md's start: the settings
file copied from docker/arcvllm.env, the key, `make up`; README.md's first call,
docs/deploy.md's monitoring, docs/upgrade.md's switch and rollback with NEW and OLD two
references of the CPU image), one deployment for the whole module.

Proves README.md's first call answers over TLS with the key; docs/deploy.md's `make
monitoring` starts Prometheus, the canary and Alertmanager without touching the gateway
(the same container, never restarted); the documented upgrade replaces the server's image
and the rollback puts it back while the gateway stays, its certificate with it; and,
without an engine, that the documented upgrade stops at its first step when the settings
file has no IMAGE= line.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from pathlib import Path
from typing import NamedTuple

import pytest
from support import ROOT, documents
from support.docker import docker
from support.processes import free_port, make
from support.scale import build_target, side_image

UPGRADE = ROOT / "docs" / "upgrade.md"
DEPLOY = ROOT / "docs" / "deploy.md"
README = ROOT / "README.md"
TEMPLATE = ROOT / "docker" / "arcvllm.env"
SIDES = ("gateway", "prometheus", "alertmanager")
# A block that (re)starts the server, as `make up` does: the document's own 120 s is for
# blocks that start nothing; under CI's load the switch took longer than that.
BLOCK_TIMEOUT = 900


def cpu_blocks(doc: Path) -> list[documents.Block]:
    """DOC's `cpu` blocks, in order."""
    blocks, problems = documents.read(doc, doc.relative_to(ROOT).as_posix())
    assert not problems, problems
    return [b for b in blocks if b.kind == "cpu"]


def upgrade_blocks() -> dict[str, documents.Block]:
    """docs/upgrade.md's `cpu` blocks by what they do: the image serving now, the switch
    to NEW, the rollback to OLD."""
    cpu = cpu_blocks(UPGRADE)
    named = {
        "now": [b for b in cpu if "grep '^IMAGE='" in b.text],
        "switch": [b for b in cpu if "sha256:NEW" in b.text],
        "rollback": [b for b in cpu if "sha256:OLD" in b.text],
    }
    assert all(len(found) == 1 for found in named.values()) and len(cpu) == 3, named
    return {what: found[0] for what, found in named.items()}


def given(
    block: documents.Block, project: str, port: int = 8443, new: str = "NEW", old: str = "OLD"
) -> documents.Block:
    """BLOCK with its placeholders given values: the digests NEW and OLD (the start's
    arcvllm:cpu is OLD), the project and the gateway's port."""
    text = block.text.replace("REGISTRY/arcvllm@sha256:NEW", new)
    text = text.replace("REGISTRY/arcvllm@sha256:OLD", old).replace("-p arcvllm ", f"-p {project} ")
    text = text.replace("IMAGE=arcvllm:cpu|", f"IMAGE={old}|")
    return dataclasses.replace(block, text=text.replace("127.0.0.1:8443", f"127.0.0.1:{port}"))


class Deployment(NamedTuple):
    where: Path  # the scratch checkout the documents' commands run in
    settings: Path  # mine.env, in it
    project: str
    url: str
    ca_cert: Path
    gateway: str  # the gateway's container ID
    started: str  # and when it started
    old: str
    new: str
    gateway_image: str

    def env(self) -> dict[str, str]:
        """What the reader's shell has exported: this project, the CPU flavour, the port,
        the gateway's image, a smaller /dev/shm (as for the start)."""
        return {"PROJECT": self.project, "FLAVOR": "cpu", "PORT": self.url.rpartition(":")[2],
                "SHM_SIZE": "1g", "GATEWAY_IMAGE": self.gateway_image,
                **scratch_package(self.where)}  # fmt: skip

    def make(self, *args: str):
        return make(*args, f"ENV_FILE={self.settings}", f"PROJECT={self.project}", "FLAVOR=cpu")


def scratch_package(where: Path) -> dict[str, str]:
    """The scratch checkout's own arcvllm first on the path: the linked venv's is the real
    checkout's (an editable install), whose docker/ would put `make key`'s file (the
    settings' ../secrets/api-key) in the real checkout, not beside the reader's mine.env."""
    return {"PYTHONPATH": str(where)}


def container(project: str, service: str) -> str:
    label = f"label=com.docker.compose.project={project}"
    named = f"label=com.docker.compose.service={service}"
    return docker("ps", "-q", "--filter", label, "--filter", named).stdout.strip()


def state(cid: str) -> dict:
    return json.loads(docker("inspect", cid).stdout)[0]


def wait_healthy(deployment: Deployment, timeout: float = 900) -> float:
    """Seconds until the server answers /health through the gateway."""
    from arcvllm.client.api import Client, WaitTimeout

    start = time.monotonic()
    try:
        Client(deployment.url, ca_cert=str(deployment.ca_cert)).wait_healthy(timeout, interval=1)
    except WaitTimeout as exc:
        cid = container(deployment.project, "vllm-cpu")
        logs = docker("logs", "--tail", "40", cid, check=False) if cid else None
        pytest.fail(f"not healthy: {exc}\n{logs.stderr[-3000:] if logs else '(no container)'}")
    return time.monotonic() - start


def side_images() -> dict[str, str]:
    """The side images the deployment runs: as they are on the engine when ARCVLLM_TEST_IMAGE
    says to take what is there, else built as `make` builds them (a cache hit)."""
    images = {side: side_image(side) for side in SIDES}
    if not os.environ.get("ARCVLLM_TEST_IMAGE"):
        for side, tag in images.items():
            build_target(side, tag)
    return images


def leftovers(project: str) -> dict[str, list[str]]:
    label = f"label=com.docker.compose.project={project}"
    return {
        "containers": docker("ps", "-aq", "--filter", label).stdout.split(),
        "networks": docker("network", "ls", "-q", "--filter", label).stdout.split(),
        "volumes": docker("volume", "ls", "-q", "--filter", label).stdout.split(),
    }


@pytest.fixture(scope="module")
def deployment(cpu_image, tmp_path_factory):
    """docs/deploy.md's start on the CPU flavour, as written (mine.env copied from
    docker/arcvllm.env, IMAGE=OLD, `make key`, `make up`), in a scratch checkout; the shell
    exports this run's port, project, gateway image and a smaller /dev/shm."""
    assert "IMAGE" not in os.environ, "an exported IMAGE wins over the settings file's"
    images = side_images()
    port = free_port()
    project = f"arcvllm-upgrade-{port}"
    old, new = f"arcvllm:cpu-upgrade-{port}-old", f"arcvllm:cpu-upgrade-{port}-new"
    for tag in (old, new):
        docker("tag", cpu_image, tag)
    # The gateway's image under a tag of this module's own: another test's build of the
    # shared tag (a cache hit, yet another image ID: a dated provenance record) would make the
    # upgrade's `make up` recreate the gateway, as a real new gateway image would.
    gateway_image = f"arcvllm-gateway:upgrade-{port}"
    docker("tag", images["gateway"], gateway_image)
    where = documents.scratch_copy(ROOT, tmp_path_factory.mktemp("checkout"))
    (start,) = [b for b in cpu_blocks(DEPLOY) if "make up" in b.text]
    shell = {"PROJECT": project, "PORT": str(port), "SHM_SIZE": "1g",
             "GATEWAY_IMAGE": gateway_image, **scratch_package(where)}  # fmt: skip
    settings = where / "mine.env"
    args = (f"ENV_FILE={settings}", f"PROJECT={project}", "FLAVOR=cpu")
    try:
        problem = documents.run(given(start, project, port, old=old), where, env=shell,
                                timeout=BLOCK_TIMEOUT)  # fmt: skip
        assert problem is None, problem
        assert f"\nIMAGE={old}\n" in settings.read_text()
        gateway = container(project, "gateway")
        cert = "/var/lib/arcvllm-gateway/tls/cert.pem"
        from arcvllm.client.api import wait_until

        wait_until(lambda: docker("exec", gateway, "test", "-s", cert, check=False).returncode == 0,
                   60, 0.5, "the gateway's certificate")  # fmt: skip
        ca_cert = where / "gateway-ca.pem"
        ca_cert.write_text(docker("exec", gateway, "cat", cert).stdout)
        running = Deployment(
            where, settings, project, f"https://127.0.0.1:{port}", ca_cert, gateway,
            state(gateway)["State"]["StartedAt"], old, new, gateway_image,
        )  # fmt: skip
        yield running  # the server may still be loading: the tests that need it wait
    finally:
        make("down", *args, "DOWN_FLAGS=-v")
        left = leftovers(project)
        if left["containers"]:
            docker("rm", "-f", *left["containers"], check=False)
        for kind in ("network", "volume"):
            names = leftovers(project)[f"{kind}s"]
            if names:
                docker(kind, "rm", *names, check=False)
        # the two tags made here, untagged: --force, else refused while any container runs
        # the image (another test's, by its own tag); cpu_image's tag keeps the image
        docker("rmi", "--force", old, new, gateway_image, check=False)


def assert_gateway_untouched(deployment: Deployment) -> None:
    """The gateway is the container `make up` made, never restarted since."""
    now = container(deployment.project, "gateway")
    assert now == deployment.gateway, "the gateway was recreated"
    seen = state(now)["State"]
    assert seen["Running"] and seen["StartedAt"] == deployment.started, seen


@pytest.mark.docker
def test_the_readmes_first_call_lists_the_model_over_tls_with_the_key(deployment):
    """README.md's first call, as written: the key file, the gateway's certificate as the
    CA, /v1/models answered (curl -f: an HTTP error fails the block)."""
    wait_healthy(deployment)
    (block,) = cpu_blocks(README)
    port = int(deployment.url.rpartition(":")[2])
    run = given(block, deployment.project, port)
    assert documents.run(run, deployment.where, env=deployment.env(), timeout=BLOCK_TIMEOUT) is None
    ca = (deployment.where / "ca.pem").read_text()
    assert ca == deployment.ca_cert.read_text() and "BEGIN CERTIFICATE" in ca
    wrong = dataclasses.replace(run, text=run.text.replace("$KEY", "not-the-key"))
    problem = documents.run(wrong, deployment.where, env=deployment.env())
    assert problem is not None and "exit 22" in problem, problem  # 401: curl -f fails


@pytest.mark.docker
def test_make_monitoring_starts_prometheus_the_canary_and_alertmanager_gateway_untouched(
    deployment,
):
    """docs/deploy.md's monitoring block, as written."""
    (block,) = [b for b in cpu_blocks(DEPLOY) if "make monitoring" in b.text]
    problem = documents.run(
        given(block, deployment.project), deployment.where, env=deployment.env()
    )
    assert problem is None, problem
    for service in ("prometheus-single", "canary", "alertmanager"):
        cid = container(deployment.project, service)
        assert cid and state(cid)["State"]["Running"], f"{service} is not running"
    canary = state(container(deployment.project, "canary"))
    assert canary["Config"]["Image"] == deployment.old  # the deployment's own image
    assert_gateway_untouched(deployment)
    again = deployment.make("monitoring")  # twice is once: nothing is recreated
    assert again.returncode == 0, again.stderr
    assert_gateway_untouched(deployment)


@pytest.mark.docker
def test_the_documented_upgrade_and_rollback_change_the_servers_image_and_keep_the_gateway(
    deployment,
):
    wait_healthy(deployment)  # serving before the upgrade
    blocks = upgrade_blocks()
    p, new, old = deployment.project, deployment.new, deployment.old
    run = {what: given(block, p, new=new, old=old) for what, block in blocks.items()}
    env = deployment.env()

    def serving() -> tuple[str, str]:
        cid = container(p, "vllm-cpu")
        return cid, state(cid)["Config"]["Image"]

    assert documents.run(run["now"], deployment.where, env=env, timeout=BLOCK_TIMEOUT) is None
    first, image = serving()
    assert image == old

    assert documents.run(run["switch"], deployment.where, env=env, timeout=BLOCK_TIMEOUT) is None
    switched, image = serving()
    assert image == new and switched != first, "the server was not replaced by NEW"
    down = wait_healthy(deployment)
    assert_gateway_untouched(deployment)

    assert documents.run(run["rollback"], deployment.where, env=env, timeout=BLOCK_TIMEOUT) is None
    back, image = serving()
    assert image == old and back != switched, "the rollback did not bring OLD back"
    wait_healthy(deployment)
    assert_gateway_untouched(deployment)
    print(f"server back through the gateway {down:.0f} s after the switch's make up")


def test_the_documented_upgrade_stops_at_its_first_step_without_image_in_the_settings(tmp_path):
    """A settings file with no IMAGE= line (one copied before it had one): the documented
    `grep '^IMAGE='` fails the first block, and the switch's sed changes nothing."""
    import subprocess

    blocks = upgrade_blocks()
    mine = tmp_path / "mine.env"
    mine.write_text("".join(
        line for line in TEMPLATE.read_text().splitlines(keepends=True)
        if not line.startswith("IMAGE=")
    ))  # fmt: skip
    problem = documents.run(blocks["now"], tmp_path)
    assert problem is not None and problem.startswith("docs/upgrade.md:"), problem
    assert "exit 1" in problem, problem
    before = mine.read_text()
    (sed,) = [line for line in blocks["switch"].text.splitlines() if line.startswith("sed ")]
    subprocess.run(["bash", "-c", sed], cwd=tmp_path, check=True)
    assert mine.read_text() == before  # the switch would start the old image again
    mine.write_text(TEMPLATE.read_text())
    assert documents.run(dataclasses.replace(blocks["now"], text="grep '^IMAGE=' mine.env\n"),
                         tmp_path) is None  # fmt: skip


@pytest.mark.docker
def test_make_down_removes_the_deployment_and_what_monitoring_started(deployment):
    """Last: `make down DOWN_FLAGS=-v` leaves nothing of the project (a container left
    running, Alertmanager's say, would keep the network in use)."""
    down = deployment.make("down", "DOWN_FLAGS=-v")
    assert down.returncode == 0, down.stdout + down.stderr
    assert leftovers(deployment.project) == {"containers": [], "networks": [], "volumes": []}


def test_every_cpu_block_of_the_documents_is_one_this_module_runs():
    """A block marked `cpu` is run here, or the mark claims what no test does."""
    ran = {b.at(-1) for b in (*cpu_blocks(README), *cpu_blocks(UPGRADE))}
    ran |= {b.at(-1) for b in cpu_blocks(DEPLOY) if re.search(r"make (up|monitoring) ", b.text)}
    marked = {
        b.at(-1) for doc in (README, *sorted((ROOT / "docs").glob("*.md"))) for b in cpu_blocks(doc)
    }
    assert marked == ran and len(ran) == 6, sorted(marked ^ ran)
