"""Exercises of notebook 07 (the idempotency ledger, a crash between commit and checkpoint)."""

from agentlab.course.exercises import Case, Exercise, reference

CRASHED_THREAD = "t-ex07"
LEDGER_REPORT_COLUMNS = ("tool", "applied", "replayed", "ledger_rows")


async def crashed_thread(h) -> None:
    """Exercise 7.2's setup: the refund batch crashed after its commit with the ledger on and resumed, on
    thread ``t-ex07`` (as section 2 plays it; played by the reference of 7.1)."""
    await reference("7.1")(h, ledger=True, crash_point="after_commit", thread_id=CRASHED_THREAD)


def rows_by_tool(frame) -> dict:
    """A ledger report (DataFrame) as ``{tool: {"applied": n, "replayed": n, "ledger_rows": n}}``."""
    missing = [c for c in LEDGER_REPORT_COLUMNS if c not in getattr(frame, "columns", ())]
    if missing:
        raise TypeError(f"ledger_report must return a DataFrame with the columns {', '.join(LEDGER_REPORT_COLUMNS)}"
                        f" (missing: {', '.join(missing)})")
    return {r["tool"]: {k: r[k] for k in LEDGER_REPORT_COLUMNS[1:]} for r in frame.to_dict("records")}


def _crash_case(crash_point: str, ledger: bool, deducted: int, ledger_rows: int) -> Case:
    return Case(kwargs={"ledger": ledger, "crash_point": crash_point}, expected={
        "credit_deducted_cents": deducted, "credit_memos": 1, "provider_refunds": 1, "ledger_rows": ledger_rows})


EXERCISES = (
    Exercise(
        id="7.1", title="A crash before the commit", function="crash_and_resume",
        solution="agentlab.course.solutions.ex07_ledger:crash_and_resume",
        cases=(
            _crash_case("before_commit", True, 2500, 3),
            _crash_case("before_commit", False, 2500, 0),
            _crash_case("after_commit", True, 2500, 3),
            _crash_case("after_commit", False, 5000, 0),
        ),
        hints={
            "credit_deducted_cents": "5000 minus the customer's credit_cents once the resumed run and the outbox "
                                     "are done; before_commit crashes in node.hooks.after_call on the last call "
                                     "(index 2), after_commit in node.hooks.after_commit",
            "credit_memos": "(await customer_rows(h, [customer])).iloc[0]['credit_memos']",
            "provider_refunds": "await h.worker.drain(), then the customer's provider payments of kind 'refund'",
            "ledger_rows": "SELECT count(*) FROM tool_executions WHERE thread_id = %s (0 with the ledger off)",
            "*": "catch SimulatedCrash around the first ainvoke (durability='sync'), then resume with "
                 "ainvoke(None, ...) on a graph built on a new Harness.open(h.url)",
        },
    ),
    Exercise(
        id="7.2", title="Applied or replayed?", function="ledger_report",
        solution="agentlab.course.solutions.ex07_ledger:ledger_report",
        cases=(Case(args=(CRASHED_THREAD,), setup=crashed_thread, read=rows_by_tool, expected={
            tool: {"applied": 1, "replayed": 1, "ledger_rows": 1}
            for tool in ("ApplyCredit", "CreateCreditMemo", "QueueRefund")}),),
        hints={
            "*": "one row per tool of the thread (columns tool, applied, replayed, ledger_rows): count the thread's "
                 "events per outcome 'applied' / 'replayed', and its tool_executions rows; await h.events.flush() "
                 "first",
        },
    ),
)
