"""The workshop in a real browser: JupyterLab driven by headless Chromium through Playwright.

A JupyterLab server on 127.0.0.1 (a random port, a token) serves a copy of ``notebooks/`` (the committed
files are never saved over). For every notebook the test opens it with ``?reset`` (no earlier tabs
reopened), checks that opening it does not mark it modified, runs Run > Run All Cells, saves it and
asserts that every code cell ran and none shows an error or anything on stderr, in the page and in the
saved file. Notebook 09 is also clicked through (case C29): after Run All (whose last cell closes the
notebook's database) the failure lab widget's fault and preset are changed, Run is clicked, and the
tabs and charts must show the new episode, with the values the database holds.

A screenshot of each notebook goes to ``.ci/artifacts/screenshots/`` (git-ignored; CI keeps the folder),
and each notebook's Run All time to ``.ci/artifacts/run_all_seconds.json``.
The browser is the system's Chromium (``/usr/bin/chromium`` on Debian, or ``AGENTLAB_CHROMIUM``); nothing
is downloaded. Without it the tests skip with a line saying how to install it.

Sources: ../shared/BROWSER-NOTES.md (what worked on these machines); Playwright for Python docs
"BrowserType.launch" (``executable_path``); Jupyter Server docs "REST API" (sessions).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psycopg
import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
FAILURE_LAB = "09_failure_lab.ipynb"
SCREENSHOTS = ROOT / ".ci" / "artifacts" / "screenshots"
CHROMIUM = os.environ.get("AGENTLAB_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
SERVER_READY_S = 90
RUN_ALL_S = 420  # 10 runs 357 episodes, 20 starts DBOS processes (2 to 3 minutes); a loaded 2-core machine is slower
VIEWPORT = {"width": 1400, "height": 2000}
PROJECTOR = {"width": 1280, "height": 720}  # what a room's projector shows
STDERR = "application/vnd.jupyter.stderr"

if CHROMIUM is None:
    pytest.skip("no Chromium on this machine: install it (`apt-get install chromium`) to run the browser test",
                allow_module_level=True)
try:
    from playwright.sync_api import Page, sync_playwright
except ImportError:  # pragma: no cover - requirements.txt installs it
    pytest.skip("Playwright for Python is not installed: `pip install -r requirements.txt`", allow_module_level=True)

from agentlab.lab.widget import TAB_TITLES
from agentlab.runtime import db
from agentlab.sim.provider import customer_ref

# JupyterLab settings for the run: every cell in the page (no windowing), no news or update check.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                         "checkForUpdates": False},
}

# Finished: no cell running, the kernel idle, and the last code cell numbered (or an error shown, which
# stops Run All: the assertions then say which cell).
RUN_ALL_DONE = """() => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  if (!panel) return false;
  const prompts = [...panel.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(e => e.textContent.trim());
  if (!prompts.length || prompts.some(t => t.includes('*'))) return false;
  const status = panel.querySelector('.jp-Notebook-ExecutionIndicator');
  if (status && status.getAttribute('data-status') !== 'idle') return false;
  return /\\[\\d+\\]/.test(prompts[prompts.length - 1])
      || panel.querySelector('[data-mime-type="application/vnd.jupyter.stderr"]') !== null;
}"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JupyterLab:
    """A JupyterLab server on a copy of the notebooks."""

    def __init__(self, root: Path, port: int, token: str, proc: subprocess.Popen, log: Path):
        self.root, self.port, self.token, self.proc, self.log = root, port, token, proc, log
        self.base = f"http://127.0.0.1:{port}"

    def url(self, path: str) -> str:
        sep = "&" if "?" in path else "?"
        return f"{self.base}{path}{sep}token={self.token}"

    def api(self, path: str, method: str = "GET", body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url(path), method=method, data=data,
                                     headers={"Content-Type": "application/json"} if data else {})
        with urllib.request.urlopen(req, timeout=30) as resp:
            answer = resp.read()
        return json.loads(answer) if answer else None

    def start_kernel(self, notebook: str) -> None:
        """Start the notebook's session and kernel through the REST API, so the page attaches to a kernel
        already starting. (Left to the page, the first kernel of a fresh server was once shut down while
        it started and replaced, and the page waited on the first one for good.)"""
        self.api("/api/sessions", "POST", {"path": f"notebooks/{notebook}", "name": notebook, "type": "notebook",
                                           "kernel": {"name": "python3"}})

    def shutdown_kernel(self, notebook: str) -> None:
        """End the notebook's kernel (``DELETE /api/sessions/<id>``: a shutdown request, so exit hooks run)."""
        for s in self.api("/api/sessions"):
            if s.get("path", "").endswith(notebook):
                self.api(f"/api/sessions/{s['id']}", method="DELETE")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("jupyterlab")
    shutil.copytree(ROOT / "notebooks", root / "notebooks")
    for rel, values in LAB_SETTINGS.items():
        path = root / "settings" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)  # this checkout
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
               f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
               f"--LabApp.user_settings_dir={root / 'settings'}", f"--LabApp.workspaces_dir={root / 'workspaces'}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-root")  # without it JupyterLab exits at once as root
    log = root / "jupyterlab.log"
    with log.open("w") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = JupyterLab(root, port, token, proc, log)
    deadline = time.monotonic() + SERVER_READY_S
    while True:
        if proc.poll() is not None:
            pytest.fail(f"JupyterLab exited with {proc.returncode}:\n{server.tail()}")
        try:
            server.api("/api/status")
            break
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"JupyterLab did not answer within {SERVER_READY_S} s:\n{server.tail()}")
            time.sleep(0.5)
    yield server
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        # Playwright hides scrollbars in headless mode; a screenshot should show what a person sees
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, ignore_default_args=["--hide-scrollbars"])
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport=VIEWPORT)
    pg = context.new_page()
    yield pg
    context.close()


def panel(page: Page):
    return page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")


def open_notebook(page: Page, lab: JupyterLab, name: str) -> None:
    """Open ``notebooks/name`` in a fresh workspace and wait for its kernel to be idle."""
    lab.start_kernel(name)
    page.goto(lab.url(f"/lab/tree/notebooks/{name}?reset"), wait_until="domcontentloaded")
    panel(page).locator(".jp-Cell").first.wait_for(timeout=60_000)
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook-ExecutionIndicator[data-status=idle]").wait_for(
        timeout=90_000)


def dirty_tabs(page: Page) -> list[str]:
    return page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.jp-mod-dirty").all_inner_texts()


def run_all(page: Page) -> float:
    """Run > Run All Cells; return the seconds until every cell finished."""
    t0 = time.monotonic()
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    page.wait_for_function(RUN_ALL_DONE, timeout=RUN_ALL_S * 1000, polling=250)
    return time.monotonic() - t0


def save(page: Page, lab: JupyterLab, name: str) -> dict:
    """Save the notebook (Ctrl+S) and return the file as JupyterLab wrote it."""
    path = lab.root / "notebooks" / name
    before = path.stat().st_mtime_ns
    panel(page).locator(".jp-Notebook").click(position={"x": 5, "y": 5})
    page.keyboard.press("Escape")
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + 30
    while path.stat().st_mtime_ns == before or dirty_tabs(page):
        assert time.monotonic() < deadline, f"{name} was not saved"
        time.sleep(0.2)
    return json.loads(path.read_text())


def errors_shown(page: Page) -> list[str]:
    """Text of every error or stderr output in the page."""
    return panel(page).locator(f'.jp-OutputArea-output[data-mime-type="{STDERR}"]').all_inner_texts()


def assert_ran_cleanly(page: Page, saved: dict, name: str) -> None:
    shown = errors_shown(page)
    assert shown == [], f"{name}: error output in the page:\n" + "\n---\n".join(t[-1500:] for t in shown)
    code = [c for c in saved["cells"] if c["cell_type"] == "code"]
    not_run = [i for i, c in enumerate(code) if c.get("execution_count") is None]
    assert not_run == [], f"{name}: code cells {not_run} did not run"
    bad = [(i, o.get("ename") or o.get("name"), o.get("evalue", "")) for i, c in enumerate(code)
           for o in c.get("outputs", []) if o["output_type"] == "error"
           or (o["output_type"] == "stream" and o.get("name") == "stderr")]
    assert bad == [], f"{name}: error or stderr outputs in the saved notebook: {bad}"
    assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1))  # in order, once each


def record_time(notebook: str, seconds: float) -> None:
    """Keep each notebook's Run All time in ``.ci/artifacts/run_all_seconds.json`` (for the README's table)."""
    path = SCREENSHOTS.parent / "run_all_seconds.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    times = json.loads(path.read_text()) if path.exists() else {}
    times[Path(notebook).stem] = round(seconds, 1)
    path.write_text(json.dumps(dict(sorted(times.items())), indent=1) + "\n")


def screenshot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / name))


def open_and_run_all(page: Page, lab: JupyterLab, name: str) -> dict:
    open_notebook(page, lab, name)
    page.wait_for_timeout(3000)  # JupyterLab writes the kernel's metadata into the model 2 to 3 s after idle
    assert dirty_tabs(page) == [], f"{name} is marked modified on open (its metadata differs from JupyterLab's)"
    seconds = run_all(page)
    record_time(name, seconds)
    saved = save(page, lab, name)
    panel(page).locator(".jp-WindowedPanel-outer, .jp-Notebook").first.evaluate("e => e.scrollTo(0, 0)")
    screenshot(page, Path(name).stem + ".png")
    assert_ran_cleanly(page, saved, name)
    return saved


@pytest.mark.parametrize("name", [p.name for p in NOTEBOOKS if p.name != FAILURE_LAB],
                         ids=[p.stem for p in NOTEBOOKS if p.name != FAILURE_LAB])
def test_browser_each_notebook_opens_unmodified_and_runs_all_cells_without_an_error(lab, page, name):
    try:
        open_and_run_all(page, lab, name)
    finally:
        lab.shutdown_kernel(name)


# ---------------------------------------------------------------------- notebook 09: the widget (C29)

def add_cell(page: Page, code: str) -> str:
    """Append a code cell holding ``code`` at the end of the notebook, run it, return its text output."""
    cells = panel(page).locator(".jp-Cell")
    n = cells.count()
    cells.nth(n - 1).locator(".jp-InputPrompt, .jp-Cell-inputCollapser").first.click()
    page.keyboard.press("Escape")
    page.keyboard.press("b")  # a new cell below, in edit mode after Enter
    cells.nth(n).wait_for()
    page.keyboard.press("Enter")
    page.keyboard.insert_text(code)  # no key events: the editor adds no closing brackets
    page.keyboard.press("Shift+Enter")
    output = cells.nth(n).locator(".jp-OutputArea-output")
    output.first.wait_for(timeout=60_000)
    return output.first.inner_text()


def widget_tab(page: Page, title: str):
    """Click the widget's tab ``title`` and return its output area."""
    tabs = panel(page).locator(".widget-tab")
    tabs.locator(".lm-TabBar-tab", has_text=re.compile(f"^{re.escape(title)}$")).click()
    return tabs.locator(".widget-output").nth(TAB_TITLES.index(title))


def widget_table(page: Page, title: str) -> list[dict[str, str]]:
    """The rows of the widget tab ``title`` (its HTML table), as the page shows them."""
    table = widget_tab(page, title).locator("table")
    table.wait_for(timeout=10_000)
    heads = [h.strip() for h in table.locator("thead th").all_inner_texts()]
    rows = []
    for tr in table.locator("tbody tr").all():
        rows.append(dict(zip(heads, (t.strip() for t in tr.locator("td").all_inner_texts()))))
    return rows


def test_c29_browser_the_failure_lab_widget_runs_after_run_all_with_what_the_database_holds(lab, page):
    try:
        open_and_run_all(page, lab, FAILURE_LAB)
        widget = panel(page).locator(".widget-vbox").filter(has=page.locator("button.jupyter-button")).first
        widget.wait_for(timeout=10_000)  # the widget rendered (not its text form, not "Error displaying widget")
        assert "Error displaying widget" not in panel(page).inner_text()
        titles = widget.locator(".widget-tab .lm-TabBar-tab").all_inner_texts()
        assert [t.strip() for t in titles] == list(TAB_TITLES)
        chart = widget.locator(".widget-output img").first
        chart.wait_for()
        chart_before = chart.get_attribute("src")
        status = widget.locator(".widget-html").nth(1)
        assert "backend_killed under transaction (invoice" in status.inner_text()  # the notebook's last click

        # a person changes the fault and the preset, then clicks Run (after Run All closed the database)
        selects = widget.locator(".widget-dropdown select")
        selects.nth(0).select_option(label="provider_timeout")
        selects.nth(1).select_option(label="invoice")
        selects.nth(2).select_option(label="ledger")
        widget.locator("button.jupyter-button", has_text="Run").click()
        page.wait_for_function(
            "s => s.innerText.includes('provider_timeout under ledger') || s.innerText.includes('error')",
            arg=status.element_handle(), timeout=120_000, polling=250)
        assert "provider_timeout under ledger (invoice" in status.inner_text(), status.inner_text()
        deadline = time.monotonic() + 30  # the charts come last in the same update
        while widget.locator(".widget-output img").first.get_attribute("src") == chart_before:
            assert time.monotonic() < deadline, "the charts were not redrawn after Run"
            time.sleep(0.25)
        # beside the rollback rate, the violations by kind: provider_timeout under ledger rolls nothing back
        # while the card is charged twice, and only this chart shows it
        assert widget.locator(".widget-output img").count() >= 2
        widget.scroll_into_view_if_needed()
        widget.screenshot(path=str(SCREENSHOTS / "09_failure_lab_widget.png"))

        rows = widget_table(page, "affected rows")
        ledger = widget_table(page, "ledger")
        outbox_text = widget_tab(page, "outbox").inner_text()
        # the database the widget ran on, named by the kernel itself
        name = add_cell(page, "from agentlab.runtime import db\nprint(db.dbname_of(lab.session.harness.url))").strip()
        assert name.startswith("agentlab_nb09_"), name
        assert errors_shown(page) == []
        with psycopg.connect(db.with_dbname(db.server_url(), name)) as conn:
            for row in rows:
                cid = int(row["customer_id"])
                credit, invoices = conn.execute(
                    "SELECT credit_cents, (SELECT count(*) FROM invoices i WHERE i.customer_id = c.id) "
                    "FROM customers c WHERE c.id = %s", (cid,)).fetchone()
                (charges,) = conn.execute("SELECT count(*) FROM provider.payments WHERE customer = %s AND kind = "
                                          "'charge'", (customer_ref(cid),)).fetchone()
                assert (int(row["credit_cents"]), int(row["invoices"]), int(row["provider_charges"])) == (
                    credit, invoices, charges)
                assert charges == 2  # the lesson: the ledger's inline provider call charges twice on a timeout
            stored = conn.execute("SELECT tool_call_id, tool_name, attempt FROM tool_executions WHERE "
                                  "tool_call_id = ANY(%s) ORDER BY tool_call_id",
                                  ([r["tool_call_id"] for r in ledger],)).fetchall()
        assert [(r["tool_call_id"], r["tool"], int(r["attempt"])) for r in ledger] == stored and stored
        assert outbox_text.strip() == "(no outbox)"  # ledger calls the provider inline

        # on a projector (1280 x 720): every tab's table fits the width, its long cells wrapped, not cut off
        page.set_viewport_size(PROJECTOR)
        for title in TAB_TITLES:
            area = widget_tab(page, title)
            area.scroll_into_view_if_needed()
            for table in area.locator("table").all():
                box = table.bounding_box()
                assert box is not None and box["x"] + box["width"] <= PROJECTOR["width"], (title, box)
            page.screenshot(path=str(SCREENSHOTS / f"09_failure_lab_{title.replace(' ', '_')}_1280x720.png"))
        page.set_viewport_size(VIEWPORT)
    finally:
        lab.shutdown_kernel(FAILURE_LAB)
