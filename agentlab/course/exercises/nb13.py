"""Exercises of notebook 13 (checkpoints, replay, retention): replayable or not, a waiting thread survives."""

from __future__ import annotations

from agentlab.course.exercises import Case, Exercise

EXERCISES = (
    Exercise(
        id="13.1", title="Replayable or not?", function="history_after_retention",
        solution="agentlab.course.solutions.ex13_history:history_after_retention",
        cases=(
            Case(args=(3,), expected={"action": "kept", "checkpoints": [7, 7], "replay_points_before_tools": [2, 2],
                                      "ledger_rows": 3, "outbox_rows": 1}),
            Case(args=(10,), expected={"action": "pruned", "checkpoints": [7, 1], "replay_points_before_tools": [2, 0],
                                       "ledger_rows": 3, "outbox_rows": 1}),
        ),
        hints={
            "action": "report = await apply_retention(h.saver, h.pool, policy, now=later); the thread is in "
                      "report.pruned or report.deleted, else it was kept",
            "checkpoints": "[before, after]: len(await thread_history(graph, thread, tenant_id=...)) before and after "
                           "the job",
            "replay_points_before_tools": "[before, after]: the rows of thread_history(graph, thread, ...) whose "
                                          "next holds 'tools'",
            "*": "play the refund story with durability='sync', then the job with RetentionPolicy("
                 "replayable_for_s=7 * 86400, delete_after_s=90 * 86400) and now=dt.datetime.now(dt.timezone.utc) + "
                 "dt.timedelta(days=idle_days)",
        },
    ),
    Exercise(
        id="13.2", title="Someone still has to answer", function="waiting_thread_survives",
        solution="agentlab.course.solutions.ex13_history:waiting_thread_survives",
        cases=(Case(expected={"waiting_thread": "pruned", "finished_thread": "deleted", "checkpoints_left": 1,
                              "pending_requests": 1, "refunds_after_resume": 2}),),
        hints={
            "waiting_thread": "a thread with a pending interrupt is never deleted: the job prunes it to its latest "
                              "checkpoint",
            "pending_requests": "len(await pending_requests(graph, config)) after the job",
            "refunds_after_resume": "resume the waiting thread with resume_command('approve'), drain the worker, "
                                    "count the customer's refunds",
            "*": "start APPROVAL up to its interrupt on one thread, finish a refund episode on another, run "
                 "apply_retention(h.saver, h.pool, policy, now=later) as if idle_days had passed",
        },
    ),
)
