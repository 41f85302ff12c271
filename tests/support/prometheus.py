"""deploy/prometheus: its rules, consoles and dashboard expressions, and promtool."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import yaml

from support import ROOT

PROM = ROOT / "deploy" / "prometheus"


RULES = PROM / "rules" / "arcvllm.yml"
CONSOLE = PROM / "consoles" / "arcvllm.html"
DASHBOARD = ROOT / "docs" / "grafana-arcvllm.json"


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"no {name}: `make tools` fetches Debian's prometheus package (any user)")
    return path


def rules() -> list[dict]:
    return [
        rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    ]


def console_exprs() -> list[str]:
    """Every PromQL expression the console evaluates or graphs."""
    text = CONSOLE.read_text()
    exprs = re.findall(r'query "([^"]+)"', text)
    exprs += re.findall(r'\(args "(arcvllm:[a-z0-9_:]+)"', text)
    for graph in re.findall(r"expr: (\[[^\]]*\]|\"[^\"]*\")", text):
        exprs += json.loads(graph) if graph.startswith("[") else [json.loads(graph)]
    return [e.replace("'", '"') for e in exprs]


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p["targets"]]
