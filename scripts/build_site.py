"""Build the course as a static site: the notebooks with their stored outputs and the docs, with Jupyter Book.

    python scripts/build_site.py            # -> build/site/_build/html/index.html

Needs ``jupyter-book`` (``pip install -r requirements-site.txt``, best in a virtual environment of its own;
``JUPYTER_BOOK`` names its executable when it is not on PATH). Nothing is executed: the notebooks' stored
outputs are what the site shows. Broken links and cross-references fail the build (Sphinx's warnings are
errors). Exit code 0 when the site was built, 1 when the build failed, 2 when Jupyter Book is missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "site"
SRC = OUT / "src"
PAGES = ["index", "workshop", "failure-lab", "design", "performance", "tau2", "yardstick", "tenant-isolation",
         "beyond-one-transaction", "real-models", "another-postgresql"]
EXTRA = {"ATTENDEES.md": "attendees.md", "CHANGELOG.md": "changelog.md"}

CONFIG = """\
title: agentlab
author: the agentlab authors
only_build_toc_files: true
execute:
  execute_notebooks: "off"
parse:
  myst_heading_anchors: 3
sphinx:
  config:
    html_show_copyright: false
    suppress_warnings: ["myst.header"]
"""


def link_target(target: str) -> str:
    """A README or docs link as the site has it: docs pages side by side, other files of the repository kept
    out (their text is shown as code instead of a broken link)."""
    if target.startswith(("http://", "https://", "#", "mailto:")):
        return target
    path, _, anchor = target.partition("#")
    name = Path(path).name
    if path.startswith("docs/"):
        path = name
    if path in EXTRA:
        path = EXTRA[path]
    if path.endswith(".md") and (SRC / Path(path).name).exists():
        return Path(path).name + (f"#{anchor}" if anchor else "")
    if path.endswith(".ipynb") and (SRC / "notebooks" / name).exists():
        return f"notebooks/{name}"
    return ""


def rewrite_links(text: str) -> str:
    def repl(m: re.Match) -> str:
        label, target = m.group(1), m.group(2)
        new = link_target(target)
        return f"[{label}]({new})" if new else f"{label} (`{target}`)"
    return re.sub(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)", repl, text)


def assemble() -> None:
    shutil.rmtree(SRC, ignore_errors=True)
    (SRC / "notebooks").mkdir(parents=True)
    notebooks = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    for nb in notebooks:
        shutil.copy(nb, SRC / "notebooks" / nb.name)
    for page in PAGES:
        shutil.copy(ROOT / "docs" / f"{page}.md", SRC / f"{page}.md")
    for source, name in EXTRA.items():
        shutil.copy(ROOT / source, SRC / name)
    (SRC / "intro.md").write_text((ROOT / "README.md").read_text())
    for md in SRC.glob("*.md"):
        md.write_text(rewrite_links(md.read_text()))
    toc = {"format": "jb-book", "root": "intro", "parts": [
        {"caption": "The course", "chapters": [{"file": f"notebooks/{nb.stem}"} for nb in notebooks]},
        {"caption": "Documentation", "chapters": [{"file": p} for p in PAGES]},
        {"caption": "For the room", "chapters": [{"file": Path(n).stem} for n in EXTRA.values()]},
    ]}
    (SRC / "_toc.yml").write_text(json.dumps(toc, indent=1))  # JSON is YAML
    (SRC / "_config.yml").write_text(CONFIG)


def main() -> int:
    exe = os.environ.get("JUPYTER_BOOK") or shutil.which("jupyter-book")
    if exe is None:
        print("build_site: jupyter-book is not installed; pip install -r requirements-site.txt (in a virtual "
              "environment of its own), or set JUPYTER_BOOK to its executable", file=sys.stderr)
        return 2
    assemble()
    proc = subprocess.run([exe, "build", str(SRC), "--path-output", str(OUT), "--warningiserror", "--keep-going",
                           "--quiet"])
    if proc.returncode != 0:
        print("build_site: the build failed (warnings are errors: a broken link or cross-reference)", file=sys.stderr)
        return 1
    print(f"build_site: {OUT / '_build' / 'html' / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
