"""The failure lab as a widget (ipywidgets): pick a scenario, a preset and a fault; Run; read the tables
and the charts.

``FailureLab(h)`` in a notebook cell shows dropdowns for the fault, the scenario (those the fault fits)
and the preset, a seed, a number of episodes, and a Run button. Run schedules
:meth:`agentlab.lab.session.LabSession.run` on the running event loop (the kernel's) and, when it
returns, shows the last episode's tables (tool messages, rollbacks, ledger, outbox, affected rows,
violations) in tabs and redraws the charts (:func:`agentlab.lab.session.lab_charts`). An error is
shown in the widget's output area with its traceback and kept in :attr:`FailureLab.error`;
:meth:`FailureLab.wait` raises it.

The widget adds nothing of its own: the same episodes run by hand, with the same arguments and in
the same order, leave the same database state::

    lab = FailureLab(h)                               # the widget            | the plain calls
    lab.choose(fault="crash_before_checkpoint",       # set the dropdowns     |
               preset="ledger", scenario="refund")    #                       |
    lab.run_button.click(); await lab.wait()          # Run                   | await session.run(fault=..., ...)
    lab.session.last.ledger                           # the Ledger tab        | session.last.ledger

Everything works without a front end (``button.click()`` calls the same handler as a click), which is
how the tests and a headless notebook run drive it.

A widget outlives the cell that made it, and often its notebook's database: after Run > Run All Cells
the notebook's last cell (``await h.close()``) has closed the harness and dropped the database while
the widget is still on screen (case C29). Run then opens a fresh database for the same purpose (a
:class:`agentlab.runtime.harness.Harness` of the widget's own, dropped when the kernel exits), says so
in the status line, and goes on; the session's earlier results stay in the charts.

Sources: ipywidgets docs "Asynchronous Widgets" and "Output widgets".
"""

from __future__ import annotations

import asyncio
import base64
import io
import re
import traceback
from typing import TYPE_CHECKING, Any

from agentlab.core.safeguards import PRESET_NOTES, PRESETS
from agentlab.lab.charts import violations_chart
from agentlab.lab.faults import fault_scenarios, faults_for, get_fault
from agentlab.lab.session import LabResult, LabSession, check_choice, lab_charts

if TYPE_CHECKING:
    from agentlab.runtime.harness import Harness

TAB_TITLES = ("tool messages", "rollbacks", "ledger", "outbox", "affected rows", "violations")
NO_LOOP = "Run needs a running event loop (a notebook's kernel, or an async test); call `await lab.run()` instead"
BUSY = "an episode is still running; wait for it to finish"


def _bundle(data: dict[str, Any]) -> dict:
    return {"output_type": "display_data", "data": data, "metadata": {}}


# Long cells (a tool message's JSON has no space to break at) wrap anywhere, so a table fits the widget's
# width instead of being cut at the right edge; overflow-wrap is inherited by the cells.
TABLE_STYLE = "overflow-wrap: anywhere; max-width: 100%"
LINE_BREAK = "\ue000"  # a private-use character pandas leaves alone: a cell's line break, made <br> after to_html


def frame_output(frame, *, empty: str = "(no rows)") -> dict:
    """A DataFrame as an Output widget's display item (text/plain, and text/html whose long cells wrap and whose
    line breaks show as line breaks: pandas writes a cell's newline as a literal ``\\n``, unreadable on a
    projector)."""
    if not len(frame):
        return _bundle({"text/plain": empty})
    shown = frame.map(lambda v: v.replace("\n", LINE_BREAK) if isinstance(v, str) else v)
    html = shown.to_html(index=False, escape=True).replace(LINE_BREAK, "<br>")
    return _bundle({"text/plain": frame.to_string(), "text/html": f'<div style="{TABLE_STYLE}">{html}</div>'})


def figure_output(fig, *, close: bool = True) -> dict:
    """A matplotlib figure as an Output widget's display item (a PNG); closes the figure unless told not to,
    so a figure drawn in a callback never shows up again under a later cell."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    if close:
        import matplotlib.pyplot as plt

        plt.close(fig)
    w, h = fig.get_size_inches() * 80
    return _bundle({"image/png": base64.b64encode(buf.getvalue()).decode("ascii"),
                    "text/plain": f"<lab charts {int(w)}x{int(h)}>"})


def text_output(text: str, name: str = "stdout") -> dict:
    return {"output_type": "stream", "name": name, "text": text if text.endswith("\n") else text + "\n"}


class FailureLab:
    """The failure lab widget on a harness (or a :class:`agentlab.lab.session.LabSession` to share).

    Attributes:
        session: the plain session the widget drives (its results, history and charts).
        fault, scenario, preset: Dropdowns; the scenario's options follow the fault.
        seed, episodes: IntTexts; after a run the seed moves past the seeds used, so Run again plays new
            episodes.
        run_button: the Run button.
        status: one line (HTML) on what ran and what the checker found.
        tables: a Tab of Output widgets, one per :data:`TAB_TITLES`.
        charts: an Output widget with the charts, redrawn after every run: the rollback rates and the last
            episode's ledger, then the violations by kind per fault and preset.
        errors: an Output widget where a failed run's traceback goes.
        view: the whole widget (a VBox); displaying a FailureLab displays it.
        error: the exception of the last run, or None.
    """

    def __init__(self, harness_or_session: Harness | LabSession, *, fault: str = "none", preset: str = "full",
                 seed: int = 0):
        import ipywidgets as w

        self.session = (harness_or_session if isinstance(harness_or_session, LabSession)
                        else LabSession(harness_or_session))
        self.domain = getattr(self.session.harness, "domain", None)  # None: billing (a widget built without a database)
        self.fault = w.Dropdown(options=list(faults_for(self.domain)), value=fault, description="fault")
        self.scenario = w.Dropdown(options=list(fault_scenarios(get_fault(fault, self.domain), self.domain)), description="scenario")
        self.preset = w.Dropdown(options=list(PRESETS), value=preset, description="preset")
        self.seed = w.IntText(value=seed, description="seed", layout=w.Layout(width="160px"))
        self.episodes = w.BoundedIntText(value=1, min=1, max=50, description="episodes", layout=w.Layout(width="170px"))
        self.run_button = w.Button(description="Run", button_style="primary", icon="play")
        self.about = w.HTML()
        self.status = w.HTML("<i>pick a fault, a scenario and a preset, then Run</i>")
        self._outputs = [w.Output() for _ in TAB_TITLES]
        self.tables = w.Tab(children=self._outputs)
        for i, title in enumerate(TAB_TITLES):
            self.tables.set_title(i, title)
        self.charts = w.Output()
        self.errors = w.Output()
        self.error: BaseException | None = None
        self.task: asyncio.Task | None = None
        self.reopened: Harness | None = None  # the harness Run opened after the notebook's was closed
        self.fault.observe(self._on_fault, names="value")
        self.preset.observe(self._describe, names="value")
        self.run_button.on_click(self._on_click)
        self._describe()
        self.view = w.VBox([
            w.HBox([self.fault, self.scenario, self.preset]),
            w.HBox([self.seed, self.episodes, self.run_button]),
            self.about, self.status, self.errors, self.tables, self.charts,
        ])

    # ------------------------------------------------------------------ display

    def _repr_mimebundle_(self, **kwargs) -> dict:
        """The widget's view, with a text form that holds nothing that changes between runs."""
        data = self.view._repr_mimebundle_(**kwargs)
        data["text/plain"] = f"FailureLab(faults={len(self.fault.options)}, presets={len(PRESETS)})"
        return data

    def __repr__(self) -> str:
        return (f"FailureLab(fault={self.fault.value!r}, scenario={self.scenario.value!r}, "
                f"preset={self.preset.value!r}, seed={self.seed.value}, episodes={len(self.session.results)} run)")

    def _on_fault(self, change=None) -> None:
        scenarios = list(fault_scenarios(get_fault(self.fault.value, self.domain), self.domain))
        current = self.scenario.value
        self.scenario.options = scenarios
        self.scenario.value = current if current in scenarios else scenarios[0]
        self._describe()

    def _describe(self, change=None) -> None:
        f = get_fault(self.fault.value, self.domain)
        self.about.value = (f"<b>{f.name}</b>: {_html(f.title)} (held by: {_html(f.guarded_by)})<br>"
                            f"<b>{self.preset.value}</b>: {_html(PRESET_NOTES.get(self.preset.value, ''))}")

    def choose(self, *, fault: str | None = None, scenario: str | None = None, preset: str | None = None,
               seed: int | None = None, episodes: int | None = None) -> FailureLab:
        """Set the controls as a person would (the fault first, so the scenario's options follow it).

        Raises:
            ValueError: a value the control does not offer (a scenario the fault does not fit, ...).
        """
        if fault is not None:
            get_fault(fault, self.domain)
            if fault not in self.fault.options:
                raise ValueError(f"fault {fault!r} does not fit domain {self.domain.name!r}; its faults: "
                                 f"{', '.join(self.fault.options)}")
            self.fault.value = fault
        if scenario is not None:
            check_choice(self.fault.value, scenario, self.domain)
            self.scenario.value = scenario
        if preset is not None:
            if preset not in PRESETS:
                raise ValueError(f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}")
            self.preset.value = preset
        if seed is not None:
            self.seed.value = seed
        if episodes is not None:
            self.episodes.value = episodes
        return self

    def choice(self) -> dict[str, Any]:
        """The arguments a Run would pass to :meth:`agentlab.lab.session.LabSession.run`."""
        return {"scenario": self.scenario.value, "preset": self.preset.value, "fault": self.fault.value,
                "seed": self.seed.value, "episodes": self.episodes.value}

    # ------------------------------------------------------------------ running

    def _on_click(self, button=None) -> None:
        """The Run button's handler: schedule a run on the running loop; show why it cannot when it cannot."""
        if self.task is not None and not self.task.done():
            self.status.value = f"<b>{BUSY}</b>"
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None:
            self.error = RuntimeError(NO_LOOP)
            self.errors.outputs = (text_output(NO_LOOP, "stderr"),)
            return
        self.run_button.disabled = True  # at once: a second click before the task starts is refused too
        self.task = loop.create_task(self.run(**self.choice()))

    async def run(self, **choice: Any) -> LabResult | None:
        """Run the chosen episodes (the controls' values unless given) and refresh the view; an error is
        shown and kept in :attr:`error`, never raised here (see :meth:`wait`)."""
        choice = {**self.choice(), **choice}
        self.error = None
        self.errors.outputs = ()
        self.run_button.disabled = True
        self.status.value = (f"running {choice['episodes']} episode(s) of <b>{choice['fault']}</b> under "
                             f"<b>{choice['preset']}</b> ({choice['scenario']}) ...")
        try:
            note = await self._reopen_if_closed()
            result = await self.session.run(**choice)
            self.seed.value = choice["seed"] + choice["episodes"]
            self.show(result)
            self.status.value += note
            return result
        except Exception as exc:  # shown in the widget and kept for wait(), never swallowed
            self.error = exc
            self.status.value = f"<b>error</b>: {_html(type(exc).__name__)}: {_html(str(exc))}"
            self.errors.outputs = (text_output("".join(traceback.format_exception(exc)), "stderr"),)
            return None
        finally:
            self.run_button.disabled = False

    async def _reopen_if_closed(self) -> str:
        """If the session's harness was closed (the notebook's last cell), open a fresh database for the
        same purpose and domain, dropped when the kernel exits; return the status line's note on it ("" if open)."""
        old = self.session.harness
        if not old.closed:
            return ""
        from agentlab.runtime.db import DB_PREFIX, dbname_of
        from agentlab.runtime.harness import Harness
        from agentlab.runtime.notebook import drop_at_exit

        purpose = re.sub(r"_[0-9a-f]+$", "", dbname_of(old.url).removeprefix(DB_PREFIX)) or "lab"
        h = await Harness.open(purpose=purpose, domain=old.domain)  # the same domain: its tools, scenarios, seed
        drop_at_exit(h.url)
        self.session.harness = self.reopened = h
        return (f"<br><i>the notebook's database was closed by its last cell (<code>await h.close()</code>); "
                f"this run opened a fresh one, {_html(dbname_of(h.url))}, dropped when the kernel exits</i>")

    async def wait(self) -> LabResult | None:
        """Wait for the run the last click started; return its result, or raise the error it showed."""
        if self.task is not None:
            result = await self.task
        else:
            result = self.session.last
        if self.error is not None:
            raise self.error
        return result

    def show(self, result: LabResult) -> None:
        """Fill the tabs with ``result``'s tables and redraw the charts from the whole session."""
        self.status.value = _html(result.headline())
        for out, (title, frame) in zip(self._outputs, result.tables().items()):
            out.outputs = (frame_output(frame, empty=f"(no {title})"),)
        self.charts.outputs = (figure_output(lab_charts(self.session)),
                               figure_output(violations_chart(self.session.violations_by_kind())))

    def table_text(self, title: str) -> str:
        """The text a tab shows (``title`` from :data:`TAB_TITLES`), for tests and headless runs."""
        out = self._outputs[TAB_TITLES.index(title)]
        return "".join(o.get("data", {}).get("text/plain", o.get("text", "")) for o in out.outputs)


def _html(text: str) -> str:
    import html

    return html.escape(str(text))
