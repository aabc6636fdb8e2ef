"""The package's layering is a checked fact: import-linter's contracts in ``.importlinter`` hold.

Layers (lowest last): cli, bench, course, demos, lab, durable, runtime, sim, domains, core. A module imports
only from its own layer or those below it, function-level imports counted; no package holds an import
cycle between its modules; the domains are independent of one another.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_linter_contracts_hold():
    proc = subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())", "--config", str(ROOT / ".importlinter")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 and "No module named importlinter.cli" in proc.stderr:
        proc = subprocess.run(["lint-imports", "--config", str(ROOT / ".importlinter")], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout
