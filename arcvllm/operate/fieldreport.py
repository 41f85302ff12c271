"""`arcvllm field-report`: everything a bug report about a deployment needs, in one tarball.

Collected from the compose service `make up` started: doctor on the host and in the
container, the image's labels and patch manifest, the smoke test, a short bench, sycl-ls,
xpu-smi and the XPU probe, host kernel / driver / firmware versions, the packages in the
image and the server log; plus the commands that produced each file and a one-screen
summary. A step that fails is recorded (its output and exit code), not fatal: a broken
host is when the report matters most.

Secrets never leave: every value of VLLM_API_KEY / HF_TOKEN (from the settings file and
the environment) and anything shaped like a bearer token, an `--api-key` argument or a
Hugging Face token is replaced by `<redacted>` in every file, the commands included.
"""

from __future__ import annotations

import io
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from arcvllm import options
from arcvllm.docker import docker_binary
from arcvllm.errors import UsageError
from arcvllm.operate.canary import ROWS as CANARY_ROWS
from arcvllm.operate.host import api_key_file
from arcvllm.paths import checkout_root

SECRET_KEYS = ("VLLM_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
REDACTED = "<redacted>"
_PATTERNS = (
    re.compile(r"(?i)(bearer\s+)[^\s'\"]+"),
    re.compile(r"(--api-key[=\s]+)[^\s'\"]+"),
    re.compile(r"((?:api_key|VLLM_API_KEY|HF_TOKEN)['\"]?\s*[:=]\s*\[?['\"]?)[^\s'\",\]]+"),
    re.compile(r"()hf_[A-Za-z0-9]{20,}"),
)
# What a short bench is: a few prompts, one decode run across one block boundary.
SHORT_BENCH = "--num-prompts 4 --input-len 128 --output-len 32 --crossings 1 --runs 1"


# oneCCL's libfabric as the image has it: the environment that picks it, every libfabric,
# provider and fi_info under ROOTS, and impi-rt's fi_info listing the tcp provider (the
# tree a B70 build really has, docs/images.md). Always exit 0: what is missing is the news.
LIBFABRIC_ENV = ("CCL_ROOT", "CCL_OFI_LIBRARY_PATH", "FI_PROVIDER_PATH", "I_MPI_ROOT")
FI_INFO = "/opt/venv/bin/libfabric/fi_info"
# The compile caches on the volume: a warm restart loads them instead of compiling again.
CACHE_ENV = ("NEO_CACHE_DIR", "SYCL_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
             "VLLM_CACHE_ROOT")  # fmt: skip
# The server's own health, asked in its container by the image's probe (docker/healthcheck.py).
HEALTH = "arcvllm-healthcheck http://127.0.0.1:8000/health"


def libfabric_command(roots: tuple[str, ...] = ("/opt", "/usr"), fi_info: str = FI_INFO) -> str:
    names = " ".join(LIBFABRIC_ENV)
    where = " ".join(shlex.quote(r) for r in roots)
    return (
        f'for v in {names}; do printf \'%s=%s\\n\' "$v" "$(printenv "$v")"; done; '
        "echo '# libfabric, its providers and fi_info in this image:'; "
        f"find {where} -xdev \\( -name 'libfabric.so*' -o -name 'lib*-fi.so' -o -name fi_info \\) "
        "2>/dev/null | sort; "
        f"echo '# {fi_info} -p tcp:'; "
        f"if [ -x {shlex.quote(fi_info)} ]; then {shlex.quote(fi_info)} -p tcp 2>&1 | head -n 24; "
        "else echo 'fi_info: not in this image'; fi; true"
    )


def caches_command(names: tuple[str, ...] = CACHE_ENV) -> str:
    return (
        f'for v in {" ".join(names)}; do d=$(printenv "$v"); '
        'if [ -n "$d" ] && [ -d "$d" ]; then '
        'echo "$v=$d: $(find "$d" -type f | wc -l) files, $(du -sk "$d" | cut -f1) KiB"; '
        'else echo "$v=${d:-unset}: no folder"; fi; done'
    )


def restart_command(compose: str, service: str, timeout: int = 1800) -> str:
    """Restart SERVICE and time it to a healthy /health (inside it): the warm restart."""
    inner = shlex.quote(HEALTH)
    return (
        f"start=$(date +%s); {compose} restart {service} >/dev/null && "
        f"until {compose} exec -T {service} sh -c {inner} >/dev/null 2>&1; do "
        f'[ $(($(date +%s) - start)) -lt {timeout} ] || {{ echo "not healthy after {timeout} s"; '
        "exit 124; }; sleep 2; done; "
        'echo "healthy after $(($(date +%s) - start)) s"'
    )


def secrets_from(values: Mapping[str, str]) -> set[str]:
    return {values[k] for k in SECRET_KEYS if values.get(k)}


def redact(text: str, secrets: Iterable[str]) -> str:
    """TEXT with every secret value and every token-shaped string replaced."""
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + REDACTED, text)
    return text


@dataclass
class Step:
    """One file of the report and the command (or probe) that made it."""

    name: str
    command: str
    rc: int
    seconds: float
    text: str  # what goes into the tarball: stdout, then stderr (a .json file: stdout only)
    stdout: str = ""
    stderr: str = ""  # a .json file's stderr, kept beside it as NAME.stderr.txt


@dataclass
class Collector:
    compose: str
    service: str
    secrets: set[str] = field(default_factory=set)
    steps: list[Step] = field(default_factory=list)
    timeout: float = 900

    def shell(self, name: str, command: str, env: Mapping[str, str] | None = None) -> Step:
        start = time.monotonic()
        try:
            done = subprocess.run(
                command,
                shell=True,
                capture_output=True,
                text=True,
                timeout=self.timeout,
                env={**os.environ, **(env or {})},
            )
            rc, out, err = done.returncode, done.stdout, done.stderr
        except subprocess.TimeoutExpired as exc:
            rc, out, err = 124, "", f"timed out after {exc.timeout} s"
        # A JSON member stays parseable: its stderr goes into a file of its own.
        apart = name.endswith(".json")
        text = out if apart else out + (f"\n{err}" if err else "")
        seconds = round(time.monotonic() - start, 1)
        step = Step(name, command, rc, seconds, text, out, err if apart else "")
        self.steps.append(step)
        return step

    def exec(self, name: str, command: str) -> Step:
        """COMMAND inside the service's container (sh -c, so $VARS expand in there)."""
        inner = shlex.quote(command)
        return self.shell(name, f"{self.compose} exec -T {self.service} sh -c {inner}")

    def add(self, name: str, what: str, text: str) -> Step:
        step = Step(name, what, 0, 0.0, text, text)
        self.steps.append(step)
        return step


def host_versions() -> str:
    """Kernel, xe driver, GPU firmware and GPUs of the host, read from /proc, /sys, /lib."""
    from arcvllm.operate import doctor
    from arcvllm.operate import host as hosts

    host = hosts.Host()
    lines = [
        f"kernel: {host.kernel_release() or platform.release()}",
        f"/proc/version: {(host.read('/proc/version') or '?').strip()}",
        f"xe module: {(host.read('/sys/module/xe/srcversion') or 'not loaded').strip()}",
    ]
    for gpu in hosts.intel_gpus(host):
        bar = doctor.gib(max(gpu.bars)) if gpu.bars else "?"
        lines.append(
            f"gpu {gpu.slot}: 8086:{gpu.device:04x} {gpu.name}, driver {gpu.driver}, "
            f"largest BAR {bar}"
        )
    for base in doctor.FIRMWARE_DIRS:
        folder = Path(base) / "xe"
        if folder.is_dir():
            for blob in sorted(folder.glob("bmg_*")):
                lines.append(f"firmware: {blob} {blob.stat().st_size} bytes")
    for debugfs in sorted(Path("/sys/kernel/debug/dri").glob("*/gt0/uc/guc_info")):
        try:
            head = debugfs.read_text().splitlines()[:6]
        except OSError:
            continue
        lines += [f"{debugfs}: {line}" for line in head]
    pkgs = doctor.dpkg_versions(host)
    for name in (*doctor.COMPUTE_RUNTIME_PKGS, *doctor.LEVEL_ZERO_PKGS, "intel-gsc"):
        if name in pkgs:
            lines.append(f"host package: {name} {pkgs[name]}")
    return "\n".join(lines) + "\n"


def key_file_secret(settings: Mapping[str, str]) -> set[str]:
    """The key in the file compose hands out as the secret `api-key` (operate.host's
    api_key_file: the shell's VLLM_API_KEY_FILE, else the settings file's, else compose's
    default, a relative one read from docker/), to redact; nothing when it cannot be read."""
    file = api_key_file(settings, checkout_root() / "docker", os.environ)
    try:
        return {options.read_key(file)}
    except ValueError:
        return set()


@dataclass(frozen=True)
class Asked:
    """What a field report is of and what it runs (`arcvllm field-report`'s options): the
    deployment's compose command prefix, service and image; the preset (None: the
    container's $ARCVLLM_PRESET); the settings file, whose secrets are redacted and whose
    VLLM_API_KEY is the key unless API_KEY is given; the docker client (None: arcvllm's
    one choice); and the steps beside the always-run ones."""

    compose: str
    service: str
    image: str
    preset: str | None = None
    env_file: Path | None = None
    api_key: str | None = None
    docker: str | None = None
    smoke: bool = True
    verify: bool = True
    verify_rows: str = ",".join(CANARY_ROWS)  # `arcvllm verify --rows`
    bench: bool = True
    bench_args: str = SHORT_BENCH
    restart: bool = False  # last: the warm restart timed to healthy


def collect(asked: Asked, settings: Mapping[str, str]) -> Collector:
    """Every step of the report ASKED, with SETTINGS (the settings file's): what each
    step made."""
    c = Collector(asked.compose, asked.service, secrets_from({**os.environ, **settings}))
    key = asked.api_key or settings.get("VLLM_API_KEY", "")
    c.secrets |= {key} if key else set()
    c.secrets |= key_file_secret(settings)
    me = f"{shlex.quote(sys.executable)} -m arcvllm"
    preset = asked.preset or c.exec("preset.txt", "printenv ARCVLLM_PRESET").stdout.strip()
    # With the deployment's settings file: its RENDER_GID is checked against the host's nodes.
    env_file = f" --env-file {shlex.quote(str(asked.env_file))}" if asked.env_file else ""
    c.shell("host/doctor.json", f"{me} doctor --json --preset {shlex.quote(preset)}{env_file}")
    c.exec("container/doctor.json", "arcvllm doctor --json")
    c.add("host/versions.txt", "read /proc, /sys, /lib/firmware, dpkg", host_versions())
    docker = shlex.quote(asked.docker or docker_binary())
    labels = c.shell(
        "image/labels.json",
        f"{docker} image inspect --format '{{{{json .Config.Labels}}}}' {shlex.quote(asked.image)}",
    )
    manifest = _label(labels.stdout, "org.arcvllm.patches.manifest")
    if manifest:
        c.exec("image/patch-manifest.json", f"cat {shlex.quote(manifest)}")
    c.exec(
        "container/packages.txt",
        "dpkg-query -W -f '${Package} ${Version}\\n' 2>/dev/null | grep -E "
        "'^(libze|level-zero|intel-|libigdgmm|libigc)' ; python3 -m pip list 2>/dev/null | "
        "grep -i -E '^(vllm|torch|triton|oneccl|intel|transformers|arcvllm)'",
    )
    c.exec("container/libfabric.txt", libfabric_command())
    c.exec("container/compile-caches.txt", caches_command())
    for tool, args in (("sycl-ls", ""), ("xpu-smi", " discovery")):
        c.exec(
            f"container/{tool}.txt",
            f"if command -v {tool} >/dev/null; then {tool}{args}; "
            f"else echo '{tool}: not installed in this image'; fi",
        )
    # The devices as the image's PyTorch sees them (arcvllm/serving/probe.py); its exit
    # status is part of what it says (3: no device, 1: one computes wrong).
    c.exec("container/xpu-probe.txt", 'arcvllm gpus --probe 2>&1; echo "exit $?"')
    if asked.smoke:
        # Inside the container, against the server itself: the gateway in front serves
        # neither /tokenize nor /metrics, which the smoke test reads. The key is the
        # container's own ($VLLM_API_KEY_FILE, else $VLLM_API_KEY): never on a command line.
        out = "/tmp/arcvllm-field-smoke.json"
        c.exec(
            "smoke/smoke.txt",
            f"rm -f {out}; arcvllm smoke --base-url http://127.0.0.1:8000 "
            f"--preset {shlex.quote(preset)} --out {out}",
        )
        c.exec("smoke/smoke.json", f"cat {out} 2>/dev/null || echo '{{}}'")
    if asked.verify:
        # A bounded set of the verify suite's rows (the canary's by default): is the
        # output right, the model itself the oracle (docs/verify.md).
        out = "/tmp/arcvllm-field-verify.json"
        c.exec(
            "verify/verify.txt",
            f"rm -f {out}; arcvllm verify --base-url http://127.0.0.1:8000 "
            f"--preset {shlex.quote(preset)} --rows {shlex.quote(asked.verify_rows)} --out {out}",
        )
        c.exec("verify/verify.json", f"cat {out} 2>/dev/null || echo '{{}}'")
    if asked.bench:
        out = "/tmp/arcvllm-field-bench"
        c.exec(
            "bench/bench.txt",
            f"rm -rf {out} && arcvllm bench --base-url http://127.0.0.1:8000 "
            f"--preset {shlex.quote(preset)} --out {out} {asked.bench_args}",
        )
        c.exec("bench/bench.json", f"cat {out}/bench.json")
    c.shell("server.log", f"{asked.compose} logs --no-color --tail=5000 {asked.service}")
    if asked.restart:
        # Last: the caches are warm from the steps above; the log is already taken.
        command = restart_command(asked.compose, asked.service, int(c.timeout) - 30)
        c.shell("restart/restart.txt", command)
        c.exec("restart/compile-caches.txt", caches_command())
    return c


def _label(labels_json: str, key: str) -> str | None:
    try:
        return json.loads(labels_json).get(key)
    except (ValueError, AttributeError):
        return None


def _json(step: Step | None) -> dict | None:
    try:
        value = json.loads(step.stdout) if step else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def bench_line(bench: dict) -> str:
    """Decode tokens/s and, on a speculative server, the acceptance: the numbers a B70
    operator sends back."""
    decode = (bench.get("summary") or {}).get("decode_tok_s")
    out = f", decode {decode:.1f} tok/s" if isinstance(decode, int | float) else ""
    spec = bench.get("speculation") or {}
    rate, length = spec.get("acceptance_rate"), spec.get("mean_accepted_length")
    if isinstance(rate, int | float) and isinstance(length, int | float):
        out += f", speculative: acceptance {rate:.1%}, mean accepted length {length:.2f}"
    return out


def summary(c: Collector, started: str) -> str:
    """One screen: what ran, what failed, the doctor verdicts, smoke and bench in a line."""
    by_name = {s.name: s for s in c.steps}
    lines = [f"arcvllm field report, {started}", ""]
    for where in ("host", "container"):
        doc = _json(by_name.get(f"{where}/doctor.json"))
        if doc and "rows" in doc:
            bad = [f"{r['check']} ({r['status']})" for r in doc["rows"] if r["status"] != "ok"]
            lines.append(
                f"doctor {where}: preset {doc['preset']}, "
                f"{'ok' if doc['ok'] else 'FAIL'}; not ok: {', '.join(bad) or 'none'}"
            )
        else:
            lines.append(f"doctor {where}: no report")
    for name in ("smoke", "verify"):
        if f"{name}/{name}.json" in by_name:
            report = _json(by_name[f"{name}/{name}.json"]) or {}
            failed = ", ".join(report.get("failed") or [])
            lines.append(
                f"{name}: {report.get('verdict', 'no report')}" + (f" ({failed})" if failed else "")
            )
    if "restart/restart.txt" in by_name:
        lines.append(
            f"warm restart: {by_name['restart/restart.txt'].stdout.strip() or 'no result'}"
        )
    if "bench/bench.json" in by_name:
        bench = by_name["bench/bench.json"]
        lines.append(f"bench: {'bench/bench.json' if bench.rc == 0 else 'no result'}")
        lines[-1] += bench_line(_json(bench) or {})
    lines += ["", "step                          rc  seconds"]
    for s in c.steps:
        lines.append(f"{s.name:<28} {s.rc:>4} {s.seconds:>8.1f}")
    failed_steps = [s.name for s in c.steps if s.rc != 0]
    lines += ["", f"failed steps: {', '.join(failed_steps) or 'none'}"]
    return "\n".join(lines) + "\n"


def write(path: Path, c: Collector, text_summary: str) -> list[str]:
    """The tarball: one folder, every member redacted. Returns the member names."""
    members = []
    for s in c.steps:
        if s.name != "preset.txt":
            members.append((s.name, s.text))
        if s.stderr:
            members.append((f"{s.name.removesuffix('.json')}.stderr.txt", s.stderr))
    commands = "\n".join(f"{s.name}\trc={s.rc}\t{s.seconds}s\t{s.command}" for s in c.steps)
    members += [("commands.txt", commands + "\n"), ("summary.txt", text_summary)]
    root = path.name.removesuffix(".tar.gz")
    path.parent.mkdir(parents=True, exist_ok=True)
    names = []
    with tarfile.open(path, "w:gz") as tar:
        for name, text in members:
            data = redact(text, c.secrets).encode()
            info = tarfile.TarInfo(f"{root}/{name}")
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
            tar.addfile(info, io.BytesIO(data))
            names.append(name)
    return names


@dataclass(frozen=True)
class Tarball:
    """A field report made: its path, the steps that made its files, its summary."""

    path: Path
    steps: list[Step]
    summary: str  # redacted


def make(asked: Asked, out: Path) -> Tarball:
    """The report ASKED into OUT (*.tar.gz, else a UsageError)."""
    from arcvllm.operate.settings import load

    settings = load(asked.env_file) if asked.env_file else {}
    if not out.name.endswith(".tar.gz"):
        raise UsageError(f"--out {out}: name the tarball *.tar.gz")
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    collector = collect(asked, settings)
    text = redact(summary(collector, started), collector.secrets)
    write(out, collector, text)
    return Tarball(out, collector.steps, text)
