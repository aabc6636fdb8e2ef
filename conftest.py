"""Repository-wide pytest set-up: nbval's sanitize file is found whatever folder pytest runs from."""

from pathlib import Path


def pytest_configure(config):
    option = getattr(config.option, "nbval_sanitize_with", None)
    if option and not Path(option).is_absolute() and not Path(option).exists():
        config.option.nbval_sanitize_with = str(config.rootpath / option)
