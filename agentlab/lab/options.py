"""The ``chaos`` subcommand's options, and argparse helpers the command line shares.

Light on purpose: building the command line's parser imports this module, the preset names and the
fault catalog, never LangGraph, so ``python -m agentlab --help`` answers at once (case C39). The
experiment itself lives in :mod:`agentlab.lab.experiments`.
"""

from __future__ import annotations

import argparse

from agentlab.core.safeguards import PRESETS
from agentlab.lab.faults import CONCURRENCY_FAMILY, FAULTS, OPT_IN_FAULTS

DEFAULT_CONCURRENCY = 32
YARDSTICK_ONLY_FAULTS = ("refund_story", "crash_inside_step", "stuck_retry")  # faults of agentlab.lab.yardstick the catalog does not hold
DURABILITIES = ("sync", "async", "exit")  # LangGraph's durability modes


class Distinct(argparse.Action):
    """An argparse action for ``nargs="+"``: refuses a value given twice (``--faults x x``), with exit 2
    and one error line naming it, since a repeated value would only repeat (and double) its rows."""

    def __call__(self, parser, namespace, values, option_string=None):
        seen: set = set()
        for value in values:
            if value in seen:
                parser.error(f"argument {option_string}: {value!r} is given more than once; name each value once")
            seen.add(value)
        setattr(namespace, self.dest, list(values))


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (else exit 2 with a usage line)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def png_path(text: str) -> str:
    """An argparse type: a ``.png`` file whose folder exists and is writable, checked before the run
    (not after minutes of episodes)."""
    import os
    import tempfile
    from pathlib import Path

    path = Path(text).expanduser()
    if path.is_dir():
        raise argparse.ArgumentTypeError(
            f"{text!r} is a folder; give a file name such as {text.rstrip('/')}/heatmap.png")
    if path.suffix.lower() != ".png":
        raise argparse.ArgumentTypeError(f"{text!r} is not a .png file name")
    folder = path.parent.resolve()
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"folder {str(folder)!r} does not exist; create it first")
    try:  # a real write (os.access trusts the mode bits, which root ignores and /proc does not)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".agentlab-plot-"):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from exc
    if path.exists() and not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {str(path)!r}: permission denied")
    return str(path)


def add_arguments(parser) -> None:
    """The ``chaos`` subcommand's options."""
    parser.add_argument("--domain", default="billing", metavar="DOMAIN",
                        help="the domain to run: billing (default), retail (tau2-bench; the concurrency faults play retail's own "
                        "races there, write_skew does not apply), or package.module:NAME for your own")
    parser.add_argument("--episodes", type=positive_int, default=10, help="episodes per fault and preset (default 10)")
    parser.add_argument("--presets", nargs="+", choices=list(PRESETS), default=None, metavar="PRESET",
                        action=Distinct, help=f"presets to compare, each once (default: all: {' '.join(PRESETS)})")
    parser.add_argument("--agent", nargs="+", default=None, metavar="AGENT", action=Distinct,
                        help="run the yardstick instead: these agents side by side under the same faults: toolnode, "
                        "create_agent, kit (one column per --presets, default full) or package.module:factory")
    parser.add_argument("--model", default=None, metavar="PROVIDER:MODEL",
                        help="a real chat model instead of the scripted one, e.g. openai:gpt-4o-mini, or "
                        "openai:qwen2.5:7b with --base-url (needs its package; scripted hallucinations are then n/a)")
    parser.add_argument("--faults", nargs="+", choices=[*FAULTS, *YARDSTICK_ONLY_FAULTS, *OPT_IN_FAULTS, *CONCURRENCY_FAMILY],
                        default=None, metavar="FAULT", action=Distinct,
                        help=f"faults to inject, each once (default: all: {' '.join(FAULTS)}; only when named: "
                        f"{' '.join(OPT_IN_FAULTS)}; two conversations at once, by name: {' '.join(CONCURRENCY_FAMILY)})")
    parser.add_argument("--durability", choices=DURABILITIES, default=None,
                        help="LangGraph's durability for every episode (default: per fault: sync where it resumes the "
                        "thread); with --agent, crash_inside_step kills each agent's process for real")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--concurrency", type=positive_int, default=DEFAULT_CONCURRENCY,
                        help=f"episodes in flight at once (default {DEFAULT_CONCURRENCY})")
    parser.add_argument("--workers", type=positive_int, default=None,
                        help="processes running the episodes (default: one per core, at most one per 250 episodes)")
    parser.add_argument("--json", action="store_true", help="print one JSON object with the summary and every row")
    parser.add_argument("--plot", metavar="FILE.png", type=png_path,
                        help="write the fault x preset heatmap to this PNG")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
