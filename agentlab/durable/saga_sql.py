"""The statements of the saga runner (:mod:`agentlab.durable.saga`): its runs, steps, compensation log and
advisory lock, and the texts of the errors it raises.
"""

from __future__ import annotations

INSERT_RUN = """
INSERT INTO saga_runs (saga, run_key, input) VALUES (%s, %s, %s)
ON CONFLICT (run_key) DO NOTHING RETURNING id
"""
FIND_RUN = "SELECT id, saga, input = %s FROM saga_runs WHERE run_key = %s"
INSERT_STEP = "INSERT INTO saga_steps (run_id, position, name, external) VALUES (%s, %s, %s, %s)"
LOAD_RUN = """
SELECT id, saga, run_key, status, direction, input, failed_step, parked_reason FROM saga_runs WHERE id = %s
"""
LOAD_STEPS = """
SELECT position, name, status, attempts, result, compensation FROM saga_steps WHERE run_id = %s ORDER BY position
"""
RUN_LOCK = "SELECT pg_try_advisory_lock(hashtextextended('saga:' || %s::text, 0))"
RUN_UNLOCK = "SELECT pg_advisory_unlock(hashtextextended('saga:' || %s::text, 0))"
CLAIM_RUN = "UPDATE saga_runs SET owner_token = %s WHERE id = %s"
LOCK_RUN = "SELECT status, direction, owner_token FROM saga_runs WHERE id = %s FOR NO KEY UPDATE"
SET_LOCAL_TIMEOUTS = "SELECT set_config('lock_timeout', %s, true), set_config('statement_timeout', %s, true)"
LOCK_STEP = "SELECT status, attempts FROM saga_steps WHERE run_id = %s AND position = %s FOR UPDATE"
MARK_RUNNING = """
UPDATE saga_steps SET status = 'running', attempts = attempts + 1, last_error = NULL
WHERE run_id = %s AND position = %s RETURNING attempts
"""
COMPLETE_STEP = """
UPDATE saga_steps SET status = 'completed', attempts = %s, result = %s, compensation = %s, last_error = NULL,
                      completed_at = now()
WHERE run_id = %s AND position = %s AND status IN ('pending', 'failed', 'running')
"""
FAIL_STEP = """
UPDATE saga_steps SET status = 'failed', attempts = attempts + %s, last_error = %s
WHERE run_id = %s AND position = %s AND status IN ('pending', 'failed', 'running') RETURNING attempts
"""
MARK_COMPENSATED = """
UPDATE saga_steps SET status = %s, compensated_at = now(), last_error = NULL
WHERE run_id = %s AND position = %s AND status IN ('completed', 'compensation_failed')
"""
MARK_COMPENSATION_FAILED = """
UPDATE saga_steps SET status = 'compensation_failed', last_error = %s WHERE run_id = %s AND position = %s
"""
INSERT_COMPENSATION_NEEDED = """
INSERT INTO compensation_needed (run_id, position, step, action, reason) VALUES (%s, %s, %s, %s, %s)
ON CONFLICT (run_id) WHERE status = 'open' DO NOTHING
"""
RESOLVE_COMPENSATION_NEEDED = """
UPDATE compensation_needed SET status = 'resolved', resolved_at = now()
WHERE run_id = %s AND position = %s AND status = 'open'
"""
SET_RUN = """
UPDATE saga_runs SET status = %s, direction = %s, failed_step = coalesce(%s, failed_step), parked_reason = %s,
                     updated_at = now()
WHERE id = %s
"""
INSERT_LOG = """
INSERT INTO saga_log (run_id, position, step, action, attempt, error_class, detail) VALUES (%s, %s, %s, %s, %s, %s, %s)
"""
COMPENSATION_ORDER = """
SELECT position FROM saga_log WHERE run_id = %s AND action IN ('compensated', 'sent_but_unwound') ORDER BY id
"""
OPEN_COMPENSATION_NEEDED = """
SELECT id, position, step, action, reason, created_at FROM compensation_needed
WHERE run_id = %s AND status = 'open' ORDER BY id
"""
RUN_KEY_REUSED = ("run key {key!r} names run {run_id}, which {what}; a run key binds to its saga and input: "
                  "start the new run with a new key")
ABORT_REFUSED = ("saga run {run_id} cannot be aborted: step {pos} ({step}) is its point of no return and has "
                 "committed, so nothing can undo it; the run can only go forward (resume finishes it)")
PAST_PIVOT_FAILURE = ("step {pos} ({step}) failed permanently after the point of no return, step {pivot} "
                      "({pivot_step}), had committed: the run can only go forward; fix the cause and resume")
FENCED_OWNER = "saga run {run_id} was claimed by another runner; this runner's transaction is rolled back"
FENCED_STATE = ("saga run {run_id} is {status} ({direction}), not {expected} ({expected_direction}); this runner's "
                "transaction is rolled back")
