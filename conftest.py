"""Repository-wide pytest set-up: nbval's sanitize file is found whatever folder pytest runs from, and a
notebook that needs an optional install missing here is skipped with the line that installs it."""

from pathlib import Path

import pytest


def pytest_configure(config):
    option = getattr(config.option, "nbval_sanitize_with", None)
    if option and not Path(option).is_absolute() and not Path(option).exists():
        config.option.nbval_sanitize_with = str(config.rootpath / option)


def notebook_of(item) -> Path | None:
    """The notebook an item runs: nbval's cell of it, or a test parametrized by its path or its file name."""
    if item.path.suffix == ".ipynb":
        return item.path
    for value in getattr(getattr(item, "callspec", None), "params", {}).values():
        if isinstance(value, (str, Path)) and str(value).endswith(".ipynb"):
            path = Path(value)
            return path if path.is_absolute() else item.config.rootpath / "notebooks" / path.name
    return None


def pytest_collection_modifyitems(config, items):
    """Skip every item running a notebook whose optional install is missing here
    (:func:`agentlab.runtime.notebook.missing_install`), with the line that installs it."""
    from agentlab.runtime.notebook import missing_install

    reasons: dict[Path, str | None] = {}
    for item in items:
        path = notebook_of(item)
        if path is None or not path.is_file():
            continue
        if path not in reasons:
            reasons[path] = missing_install(path)
        if reasons[path]:
            item.add_marker(pytest.mark.skip(reason=reasons[path]))
