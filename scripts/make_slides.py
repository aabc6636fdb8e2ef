"""Write the workshop's slides: one slide per notebook holding the one number it is about, read from the
notebook's stored outputs (no kernel, no network, no database).

    python scripts/make_slides.py                  # writes instructor/slides.md
    python scripts/make_slides.py --out slides.md  # elsewhere

Each slide is found by a regular expression over the text outputs of its notebook's code cells (the
``text/plain`` of results and the printed text, as nbval compares them); its first group is the number.
A notebook whose outputs no longer hold the pattern stops the script with an error naming it, so a
changed lesson cannot leave a stale slide behind. The slides are Markdown separated by ``---`` lines
(Marp, reveal-md and most slide tools read that; any Markdown viewer shows it as one page).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
DEFAULT_OUT = ROOT / "instructor" / "slides.md"


@dataclass(frozen=True)
class Slide:
    """``notebook``: the file name's two-digit prefix; ``pattern``: a regex whose group 1 is the number
    (searched with re.MULTILINE); ``claim``: the slide's sentence, ``{n}`` standing for that number."""

    notebook: str
    pattern: str
    claim: str


SLIDES = [
    Slide("00", r"credit balance\s+customer \d+: 5000 -> (\d+) cents",
          "Under `full` the refund story leaves {n} of 5,000 cents of store credit: one deduction."),
    Slide("01", r"^naive\s+\d+\s+(\d+)\s+\d+\s+\d+\s*$",
          "Under `naive` the same story deducts {n} cents of credit where 2,500 was intended."),
    Slide("02", r"^constraints\s+-?\d+\s+\d+\s+(\d+)\s*$",
          "With every constraint in place, one invoice still sent {n} charges to the provider."),
    Slide("03", r"^stored\s+(\d+)\s+\d+\s*$",
          "Without validation {n} of 12 LLM-shaped values were stored (3.5 became 4 cents)."),
    Slide("04", r"raw messages with a leak: (\d+) of \d+; translated: \d+ of \d+",
          "{n} of 7 raw error texts leak SQL, identifiers or a DSN; translated, none does."),
    Slide("05", r"^transaction \(no savepoints\)\s+(\d+)\s+0\s*$",
          "Without savepoints {n} call was reported applied and 0 stored (the aborted-transaction trap)."),
    Slide("06", r"UNIQUE violation\s+LangGraph default retry_on\s+(\d+)",
          "LangGraph's default `retry_on` runs a UNIQUE violation {n} times; the kit's policy once."),
    Slide("07", r"crash after commit, resume with ledger\s+\d+\s+\d+\s+\d+\s+\d+\s*\n\s+without ledger\s+(\d+)",
          "A crash between commit and checkpoint, resumed without the ledger: {n} cents deducted for a 2,500 refund."),
    Slide("08", r"timeout after success\s+provider called inline\s+\d+\s+\d+\s+(\d+)",
          "A provider timeout after the work, provider called inline: {n} charges for one invoice (1 through the outbox)."),
    Slide("09", r"^ledger\s+(\d+)\s+\d+\s+\d+\s*$",
          "A provider timeout under `ledger` still charges {n} times; under `full` (the outbox) once."),
    Slide("10", r"^violations\s+(\d+)\s+\d+",
          "357 seeded episodes: `naive` breaks an invariant {n} times, `full` 0 times."),
    Slide("11", r"^script, retried from step 1\s+completed\s+\d+\s+(\d+)",
          "A four-step payout retried from step 1 holds {n} cents of credit for a 2,000-cent payout; the saga 2,000."),
    Slide("12", r"retry 3 days later\s+(\d+)",
          "An approved refund retried 3 days later, on the provider's key alone, pays {n} times; the kit once."),
    Slide("13", r"replay before agent \(model re-runs\)\s+partial(?:\s+\S+){5}\s+(-\d+)",
          "A replay where the model re-runs sends new tool call ids: {n} cents deducted again."),
    Slide("14", r"^run with a retry\s+(\d+)\s+\d+\s+\d+\s*$",
          "A hidden retry leaves the same final state but {n} node executions instead of 5."),
    Slide("15", r"cross-tenant effects: full without isolation: (\d+), full: \d+",
          "Another tenant's customer id: {n} kinds of cross-tenant effect without isolation, 0 with it."),
    Slide("16", r"^backend_killed\s+(\d+)\s+\d+\s+\d+\s+\d+\s*$",
          "A payout tool under `naive` with a killed backend: {n} violations in 2 episodes; `full` 0."),
    Slide("17", r"^\d+\s+naive\s+crash_mid_node\s+(\d+)/6",
          "tau2-bench retail with a crash mid-node: {n} of 6 tasks match tau2's end state under `naive`, 6 under `full`."),
    Slide("18", r"^\s*0\s+(\d+)\s+1500\s*$",
          "Two redemptions read one balance at READ COMMITTED: {n} cents left where 1,500 are due; a row lock 1,500."),
    Slide("19", r"^refund_story\s+(\d+)\s+\d+\s+0\s*$",
          "The refund story against LangGraph's prebuilt `ToolNode` agent: {n} violations; the kit under `full` 0."),
    Slide("20", r"^dbos:steps\s+(\d+)\s+\d+\s+\d+\s+\d+\s+SUCCESS\s*$",
          "A real process death inside a DBOS step: {n} cents of 5,000 left where 2,500 are due, and DBOS says SUCCESS."),
]


def notebook_path(prefix: str) -> Path:
    """The notebook whose file name starts with ``prefix`` + "_". Raises FileNotFoundError."""
    found = sorted(NOTEBOOKS.glob(f"{prefix}_*.ipynb"))
    if not found:
        raise FileNotFoundError(f"no notebook {prefix}_*.ipynb in {NOTEBOOKS}")
    return found[0]


def stored_text(path: Path) -> str:
    """The text outputs of ``path``'s code cells as stored (results' ``text/plain`` and printed text),
    one output after another."""
    parts = []
    for cell in json.loads(path.read_text())["cells"]:
        for output in cell.get("outputs", []):
            text = output.get("text") or output.get("data", {}).get("text/plain", "")
            parts.append(text if isinstance(text, str) else "".join(text))
    return "\n".join(parts)


def title(path: Path) -> str:
    """The first line of the notebook's first markdown cell, without the leading ``#``."""
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "markdown":
            return "".join(cell["source"]).splitlines()[0].lstrip("# ").strip()
    return path.stem


def build() -> list[dict]:
    """One dict per slide: notebook file, title, number (text as stored), sentence.
    Raises LookupError naming the notebook whose outputs lack the slide's pattern."""
    slides = []
    for spec in SLIDES:
        path = notebook_path(spec.notebook)
        match = re.search(spec.pattern, stored_text(path), re.MULTILINE)
        if match is None:
            raise LookupError(f"{path.name}: its stored outputs no longer hold /{spec.pattern}/; "
                              "re-read the notebook and update the slide in scripts/make_slides.py")
        number = match.group(1)
        slides.append({"notebook": path.name, "title": title(path), "number": number,
                       "sentence": spec.claim.format(n=f"{int(number):,}")})
    return slides


def render(slides: list[dict]) -> str:
    head = ("# agentlab: one number per notebook\n\n"
            "Each number below is read from the notebook's stored outputs by `scripts/make_slides.py`;\n"
            "run it again after re-executing a notebook.\n")
    body = [f"## {s['title']}\n\n# {int(s['number']):,}\n\n{s['sentence']}\n\n*`notebooks/{s['notebook']}`*\n"
            for s in slides]
    return "\n---\n\n".join([head, *body])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the Markdown file to write")
    args = parser.parse_args(argv)
    try:
        slides = build()
    except (LookupError, FileNotFoundError) as exc:
        print(f"make_slides: {exc}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(slides))
    print(f"{len(slides)} slides -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
