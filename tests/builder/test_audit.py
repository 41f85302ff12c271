"""The fidelity audit (`arcvllm stack audit`) and the XPU lock (`arcvllm stack lock`).

The tests marked `vllm` read real release sdists (vLLM 0.20.2, 0.23.0, 0.33.0 from PyPI,
cached under build/sdists by the audit itself, sha256-checked); the others need nothing.
"""

from __future__ import annotations

import pytest
import yaml
from support import ROOT
from support.processes import free_port
from support.stacks import XPU_STACKS

from arcvllm import stack
from arcvllm.builder import audit, facts, lock, sdist, shell
from arcvllm.cli import main

# vllm-0.23.0.tar.gz as PyPI's simple index lists it (36624042 bytes).
SHA_0_23 = "760269db3d9611e12e524681df1bca0977d5d2f5fcb4481cc34d33efc4ae7ff5"


def _stacks_file(tmp_path, differences=None, **args):
    """A stacks file with one XPU stack, xpu-0.23, pinned to the real 0.23.0 sdist."""
    pins = {
        "VLLM_SDIST_SHA256": SHA_0_23,
        "PYTHON_VERSION": "3.12",
        "XPU_BASE_IMAGE": "ubuntu:24.04",
        "XPU_LOCK": "configs/locks/xpu-0.23.txt",
        **args,
    }
    entry = {
        "flavor": "xpu",
        "vllm": {"version": "0.23.0"},
        "args": {k: {"value": v, "from": "test"} for k, v in pins.items()},
    }
    if differences is not None:
        entry["differences"] = differences
    path = tmp_path / "stacks.yaml"
    path.write_text(
        yaml.safe_dump({"defaults": {"xpu": "xpu-0.23"}, "stacks": {"xpu-0.23": entry}})
    )
    return path


@pytest.fixture(scope="module")
def release_0_23():
    path = sdist.fetch_sdist({"VLLM_SDIST_SHA256": SHA_0_23}, "0.23.0", sdist.default_cache())
    return sdist.read_release(path, "0.23.0", SHA_0_23)


# ---- the pure parts ------------------------------------------------------------------------


def test_shell_commands_follow_the_if_the_build_args_decide():
    script = shell.substitute(
        'set -eux; if [ -n "$URL" ]; then pip uninstall -y oneccl || true; fi; '
        'if [ -n "$SHIM" ]; then pip install "triton==$SHIM"; else echo none; fi',
        {"URL": "", "SHIM": "3.8.0+xpu"},
    )
    run = [c[:3] for c in shell.commands(script)]
    assert ["pip", "uninstall", "-y"] not in run
    assert ["pip", "install", "triton==3.8.0+xpu"] in run
    assert ["echo", "none"] not in run


def test_variables_resolve_as_the_shell_would_and_unknown_ones_stay():
    values = {"LOCK": "configs/locks/x.txt", "EMPTY": "", "IDX": "https://i"}
    assert shell.substitute("${LOCK#configs/locks/}", values) == "x.txt"
    assert shell.substitute("${EMPTY:-d} ${IDX:+--extra-index-url $IDX}", values) == (
        "d --extra-index-url https://i"
    )
    assert shell.substitute("$LD_LIBRARY_PATH:/usr/local/lib", values) == (
        "$LD_LIBRARY_PATH:/usr/local/lib"
    )


def test_facts_of_a_dockerfile_come_from_the_target_stages_chain():
    text = "\n".join(
        [
            "ARG BASE=ubuntu:24.04",
            "FROM ${BASE} AS base",
            "ARG PYTHON_VERSION",
            "RUN apt-get update && apt-get install -y --no-install-recommends vim \\",
            '    "python${PYTHON_VERSION}-dev" curl && apt-get purge -y curl',
            "ENV LD_LIBRARY_PATH=/opt/venv/lib:$LD_LIBRARY_PATH",
            "FROM base AS build",
            "RUN apt-get install -y gcc && pip install torch==2.11.0+xpu oneccl==1 \\",
            "    && pip uninstall -y oneccl",
            "FROM base AS final",
            "COPY --from=build /opt/venv /opt/venv",
            "ENV CCL_ZE_IPC_EXCHANGE=sockets",
        ]
    )
    found = facts.dockerfile_facts(text, {"PYTHON_VERSION": "3.12"}, lambda _: None, "final")
    values = found.values
    assert values["base"] == "ubuntu:24.04"
    assert values["python"] == "3.12"
    assert {k for k in values if k.startswith("apt:")} == {"apt:vim", "apt:python3.12-dev"}
    assert values["env:LD_LIBRARY_PATH"] == "/opt/venv/lib:$LD_LIBRARY_PATH"
    assert values["env:CCL_ZE_IPC_EXCHANGE"] == "sockets"
    assert values["pin:torch"] == "2.11.0+xpu"
    assert found.uninstalled == {"oneccl"} and "oneccl" not in found.installed


def test_a_script_a_run_step_mounts_and_runs_is_read_with_its_arguments():
    text = (ROOT / "docker" / "build-vllm-xpu.sh").read_text()
    run = list(shell.script_commands(text, ["/src/vllm", "/tmp/reqs.txt", "/tmp/dist"], {}))
    assert ["pip", "install", "--no-deps", "--require-hashes", "-r", "/tmp/reqs.txt"] in run


def test_compare_names_unlisted_and_stale_differences():
    release = facts.Facts({"base": "a", "apt:vim": "installed", "pin:torch": "2"})
    ours = facts.Facts({"base": "b", "pin:torch": "2", "env:HF_HOME": "/x"})
    rows = audit.compare(release, ours, {"base": "we build on Ubuntu", "pin:torch": "why"})
    status = {r.key: r.status for r in rows}
    assert status == {
        "base": "listed",
        "apt:vim": "unlisted",
        "pin:torch": "stale",
        "lock": "same",
    }  # env:HF_HOME is ours alone and no device variable: not compared
    lines = audit.problems("s", rows)
    assert lines == [
        "s: unlisted difference apt:vim (release installed, ours -)",
        "s: listed difference pin:torch no longer differs: remove it",
    ]


def test_lock_closure_keeps_what_vllm_needs_and_drops_test_tools():
    text = "\n".join(
        [
            "pytest==9.0.2",
            "    # via -r requirements/test/xpu.in",
            "pluggy==1.6.0",
            "    # via pytest",
            "torch==2.11.0+xpu",
            "    # via",
            "    #   -c requirements/xpu.txt",
            "    #   accelerate",
            "tcmlib==1.4.1",
            "    # via",
            "    #   torch",
            "    #   umf",
        ]
    )
    entries = lock.parse_lock(text)
    assert entries["tcmlib"].via == ("torch", "umf")
    kept = lock.closure(entries, lock.requirement_names("torch==2.11.0\n-r common.txt\n"))
    assert set(kept) == {"torch", "tcmlib"}


# ---- bad input: one line, exit 2 or 3 ------------------------------------------------------


def test_unknown_stack_is_a_usage_error(tmp_path, capsys):
    assert main(["stack", "--stacks-file", str(_stacks_file(tmp_path)), "audit", "xpu-9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown stack 'xpu-9'" in err[0]


def test_a_tampered_sdist_fails_with_one_line(tmp_path, capsys):
    cache = tmp_path / "sdists"
    cache.mkdir()
    (cache / "vllm-0.23.0.tar.gz").write_bytes(b"not the release")
    argv = ["stack", "--stacks-file", str(_stacks_file(tmp_path)), "audit", "xpu-0.23"]
    assert main([*argv, "--cache-dir", str(cache)]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"the stack pins {SHA_0_23}" in err[0]


def test_an_unreachable_sdist_fails_with_one_line(tmp_path, capsys):
    url = f"http://127.0.0.1:{free_port()}/vllm-0.23.0.tar.gz"
    path = _stacks_file(tmp_path, VLLM_SDIST_URL=url)
    argv = ["stack", "--stacks-file", str(path), "audit", "xpu-0.23", "--cache-dir", str(tmp_path)]
    assert main(argv) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and url in err[0]


# ---- real releases -------------------------------------------------------------------------


@pytest.mark.vllm
def test_the_audit_reads_the_release_0_23_0_facts(release_0_23):
    seen = facts.release_facts(release_0_23).values
    assert seen["base"] == "intel/deep-learning-essentials:2025.3.2-0-devel-ubuntu24.04"
    assert seen["oneccl-installer"] == "intel-oneccl-2021.15.9.14_offline.sh"
    assert seen["pin:torch"] == "2.11.0+xpu"
    assert seen["pin:triton-xpu"] == "3.7.0"  # the lock's, and the "FIX triton" reinstall's
    assert seen["pin:vllm-xpu-kernels"] == "0.1.9"
    assert seen["apt:python3.12-dev"] == "installed"
    assert seen["deb:level-zero"] == "1.26.0+u24.04"
    assert seen["env:VLLM_TARGET_DEVICE"] == "xpu"
    assert seen["wheel:intel-sycl-rt"] == "2025.3.2"
    assert seen["req:openai"] == "installed"  # resolved from vLLM's ranges at build time
    rows = {r.key: r for r in audit.compare(facts.release_facts(release_0_23), facts.Facts(), {})}
    assert rows["uninstall:oneccl"].release == "removed"  # "remove torch bundled oneccl"
    assert rows["uninstall:triton"].release == "removed"  # "FIX triton"


@pytest.mark.vllm
def test_the_lock_keeps_the_runtime_closure_of_0_23_0(release_0_23):
    pins = lock.requirement_pins(release_0_23.runtime_lock("xpu-0.23"))
    assert pins["transformers"] == "5.5.3"
    assert pins["torch"] == "2.11.0+xpu" and pins["intel-sycl-rt"] == "2025.3.2"
    assert not {"pytest", "pytest-asyncio", "lm-eval", "schemathesis"} & set(pins)


@pytest.mark.vllm
def test_an_unlisted_difference_fails_naming_it_and_a_stale_one_too(tmp_path, capsys):
    first = audit.audit("xpu-0.23", file=_stacks_file(tmp_path))
    differing = {r.key: "reason" for r in first.rows if r.status == "unlisted"}
    assert "base" in differing and "apt:vim" in differing

    everything = _stacks_file(tmp_path, differing)
    assert main(["stack", "--stacks-file", str(everything), "audit", "xpu-0.23"]) == 0
    capsys.readouterr()

    unlisted = _stacks_file(tmp_path, {k: v for k, v in differing.items() if k != "apt:vim"})
    assert main(["stack", "--stacks-file", str(unlisted), "audit", "xpu-0.23", "--json"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["arcvllm: xpu-0.23: unlisted difference apt:vim (release installed, ours -)"]

    stale = _stacks_file(tmp_path, {**differing, "apt:python3.12": "we have none"})
    assert main(["stack", "--stacks-file", str(stale), "audit", "xpu-0.23"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "arcvllm: xpu-0.23: listed difference apt:python3.12 no longer differs: remove it"
    ]


@pytest.mark.vllm
def test_a_lock_that_is_not_what_stack_lock_writes_fails(tmp_path):
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "Dockerfile").write_text((ROOT / "docker" / "Dockerfile").read_text())
    locks = tmp_path / "configs" / "locks"
    locks.mkdir(parents=True)
    stacks = _stacks_file(tmp_path)
    written = audit.write_lock("xpu-0.23", file=stacks, root=tmp_path, resolve=False)
    assert written == locks / "xpu-0.23.txt"
    text = written.read_text()
    (locks / "xpu-0.23.txt").write_text(text.replace("transformers==5.5.3", "transformers==5.5.4"))
    rows = {r.key: r for r in audit.audit("xpu-0.23", file=stacks, root=tmp_path).rows}
    assert (rows["lock"].ours, rows["lock"].status) == ("stale", "unlisted")
    (locks / "xpu-0.23.txt").write_text(text)
    rows = {r.key: r for r in audit.audit("xpu-0.23", file=stacks, root=tmp_path).rows}
    assert (rows["lock"].ours, rows["lock"].status) == ("current", "same")


@pytest.mark.vllm
@pytest.mark.parametrize("name", XPU_STACKS)
def test_every_xpu_stack_matches_its_release_but_for_listed_differences(name):
    """CI's fidelity audit: the release's own Dockerfile.xpu, requirements and lock against
    our Dockerfile and stacks file; every difference is listed with its reason."""
    assert audit.audit(name, root=ROOT).problems() == []


@pytest.mark.vllm
def test_xpu_0_33_resolves_from_the_indexes_its_release_names():
    """The release's requirements/xpu.txt names PyTorch's XPU index and vLLM's own (for the
    triton==3.8.0+xpu shim); the stack passes exactly those, and the lock keeps the shim."""
    import re

    s = stack.get("xpu-0.33")
    args = s.build_args()
    path = sdist.fetch_sdist(args, s.vllm_version, sdist.default_cache())
    release = sdist.read_release(path, s.vllm_version, args["VLLM_SDIST_SHA256"])
    named = set(re.findall(r"--extra-index-url[= ](\S+)", release.files["xpu"]))
    assert named == {args["TORCH_INDEX_URL"], args["TRITON_INDEX_URL"]}
    assert "triton==3.8.0+xpu" in (ROOT / args["XPU_LOCK"]).read_text().split()


def test_a_lock_splits_into_the_release_part_and_the_resolved_part():
    text = "# head\na==1\n\n# Resolved here: how\nb==2\n"
    assert lock.split(text) == ("# head\na==1\n", "# Resolved here: how\nb==2\n")
    assert lock.split("# head\na==1\n") == ("# head\na==1\n", "")


def test_unpinned_names_what_would_resolve_at_build_time():
    text = "a==1\n\n# Resolved here\nb==2\n"
    assert lock.unpinned(text, ["A", "b", "c", "vllm_xpu_kernels"]) == ["c"]


@pytest.mark.vllm
def test_the_default_stack_lock_pins_every_vllm_requirement(tmp_path):
    """The flagship's lock leaves nothing to resolve at build time; drop one pin from its
    resolved part and the audit names the requirement the build would then download
    unpinned."""
    name = stack.load()[1]["xpu"]
    assert audit.audit(name, root=ROOT).problems() == []
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "Dockerfile").write_text((ROOT / "docker" / "Dockerfile").read_text())
    args = stack.get(name).build_args()
    target = tmp_path / args["XPU_LOCK"]
    target.parent.mkdir(parents=True)
    text = (ROOT / args["XPU_LOCK"]).read_text()
    resolved = lock.split(text)[1]
    # A requirement the release's own lock lacks, pinned in the part resolved here.
    pinned = [line.split("==")[0] for line in resolved.splitlines() if "==" in line]
    name_of = next(n for n in pinned if not n.startswith("#"))
    assert f"\n{name_of}==" in resolved
    target.write_text(text.replace(f"\n{name_of}==", f"\n# {name_of}=="))
    result = audit.audit(name, root=tmp_path)
    rows = {r.key: r for r in result.rows}
    assert (rows["lock:unpinned"].ours, rows["lock:unpinned"].status) == (name_of, "unlisted")
    assert any("lock:unpinned" in line for line in result.problems())


@pytest.mark.vllm
def test_the_resolved_part_is_what_stack_lock_compiles_today(tmp_path):
    """`arcvllm stack lock` compiles the missing requirements again (uv, the package index
    pip is configured with, files published before the release): same pins as committed."""
    name = stack.load()[1]["xpu"]
    args = stack.get(name).build_args()
    committed = lock.split((ROOT / args["XPU_LOCK"]).read_text())[1]
    (tmp_path / "configs" / "locks").mkdir(parents=True)
    written = audit.write_lock(name, root=tmp_path, hashes=False)
    assert lock.split(written.read_text())[1] == lock.without_hashes(committed)


@pytest.mark.vllm
def test_the_lock_hashes_are_the_ones_the_index_publishes():
    """A sample of the default stack's hashed pins (one per twenty), looked up again on the
    package index pip is configured with; the +xpu pins carry none."""
    args = stack.get(stack.load()[1]["xpu"]).build_args()
    text = (ROOT / args["XPU_LOCK"]).read_text()
    pinned = [line for line in text.splitlines() if "--hash=sha256:" in line]
    assert len(pinned) > 100
    sample = "\n".join(pinned[::20]) + "\n"
    published = audit.published_hashes(sample, args["PYTHON_VERSION"])
    assert lock.with_hashes(sample, published) == sample
    assert not [line for line in text.splitlines() if "+xpu" in line and "--hash" in line]


def test_hashes_are_the_wheels_the_image_can_take():
    accepted = lock.wheel_tags("3.12")
    files = [
        ("x-1.0-cp312-cp312-manylinux_2_28_x86_64.whl", "a" * 64),
        ("x-1.0-cp311-cp311-manylinux_2_28_x86_64.whl", "b" * 64),
        ("x-1.0-cp312-cp312-manylinux_2_28_aarch64.whl", "c" * 64),
        ("x-1.0-py3-none-any.whl", "d" * 64),
        ("x-1.1-py3-none-any.whl", "e" * 64),
        ("x-1.0.tar.gz", "f" * 64),
    ]
    assert lock.file_hashes(files, "1.0", accepted) == ["a" * 64, "d" * 64]
    text = "# head\nx==1.0\ny==2+xpu\n"
    hashed = lock.with_hashes(text, {"x": ["a" * 64]})
    assert hashed == f"# head\nx==1.0 --hash=sha256:{'a' * 64}\ny==2+xpu\n"
    assert lock.without_hashes(hashed) == text
    assert lock.parse_lock(hashed)["x"].version == "1.0"
