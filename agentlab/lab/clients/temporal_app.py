"""The refund story as a Temporal user writes it, run by the lab in a child process: one worker per process.

``python -m agentlab.lab.clients.temporal_app start SPEC.json`` runs a worker on the episode's task queue,
starts the agent's workflow and waits for its result; ``... recover SPEC.json`` runs a new worker on the same
queue after the first one died, and waits for the workflow the server hands it. The parent side, which owns
the dev server, arms the faults and reads Temporal's history, is :mod:`agentlab.lab.clients.temporal_agent`.

What a Temporal user writes (every default untouched, the default ``RetryPolicy`` included, which retries an
activity without limit, except one setting the SDK requires: each activity's ``start_to_close_timeout``,
here :data:`START_TO_CLOSE` (3 s), short so an activity whose worker died is retried within seconds):

- an activity per tool (``@activity.defn``, Temporal's docs' shape), each one database transaction of its
  own (``psycopg`` ``async with`` connection: commits at the block's end); the refund's activity calls the
  payment provider inside its transaction, so a refund the provider refused is not recorded; the model call is an activity (its AIMessage recorded as the activity's result);
- a tool's own error (its database's, ``psycopg.Error``, or a call it cannot make: ``TypeError``,
  ``ValueError``) is the tool's answer, as LangGraph's ``ToolNode`` writes it with ``handle_tool_errors=True``
  (``"Error: {repr(exc)}\\n Please fix your mistakes."``, status ``error``), returned by the activity so the
  model sees it; the payment provider's failure (an outside service's: a timeout, a 503) is left to Temporal's
  retry policy, which is what Temporal is for, so the activity raises it and Temporal runs it again (a request
  the provider refuses every time is then retried without end: ``stuck_retry``);
- the agent loop is a ``@workflow.defn`` class: the model's activity, then each tool call's activity in
  order, until the model answers without tool calls; it returns the messages (``messages_to_dict``).

The statements are the kit's own (billing's), so the yardstick compares agents, not queries; the model is
the kit's scripted one, playing the script it gets as the workflow's input.

The lab's one hook (:func:`crash_interceptor`, a worker interceptor, the nemesis, not the user's code): once
the deduction's activity (``apply_credit``) has returned, its transaction committed, the process claims
the episode's death flag (:mod:`agentlab.lab.nemesis.death`: once across processes) and dies with
``os._exit(99)`` before the worker reports the activity's completion to the server.

Sources: docs.temporal.io "Activity Definition", "Workflow Definition", "Activity timeouts", "Retry
Policies"; python.temporal.io ``temporalio.worker.Interceptor``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import timedelta

from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():
    from agentlab.lab.nemesis.death import EXIT_CODE, claim_now, die, flag_name

CRASH_EXIT_CODE = EXIT_CODE  # the nemesis's exit status (agentlab.lab.nemesis.death)
START_TO_CLOSE = timedelta(seconds=3)
MAX_MODEL_TURNS = 10  # the loop's recursion limit: model calls per run
CRASH_ACTIVITY = "apply_credit"  # billing's deduction


def tool_functions(conninfo: str, provider_conninfo: str) -> list:
    """The four tools as typed async functions (``lookup_customer``, ``create_credit_memo``, ``apply_credit``,
    ``refund_to_card``; each returns a dict, one committed transaction on ``conninfo``, the episode's database;
    the refund pays through the fake provider on ``provider_conninfo`` inside its transaction). They raise
    ``psycopg.Error`` (the database's), ``TypeError`` / ``ValueError`` (a call they cannot make) and the
    provider's errors (:mod:`agentlab.sim.provider`). Shared with Pydantic AI's agent on Temporal
    (:mod:`agentlab.lab.clients.pydantic_ai_temporal_app`), so both run the kit's SQL the same way."""
    import psycopg

    from agentlab.domains.billing.tools import APPLY_CREDIT, CREATE_CREDIT_MEMO, CREATE_REFUND, LOOKUP_CUSTOMER

    async def one(statement: str, params: tuple):
        async with await psycopg.AsyncConnection.connect(conninfo) as conn:  # commits at the block's end
            cur = await conn.execute(statement, params)
            return await cur.fetchone()

    async def lookup_customer(customer_id: int) -> dict:
        row = await one(LOOKUP_CUSTOMER, (customer_id,))
        return {"customer_id": row[0], "name": row[1], "available_credit_cents": row[2], "open_invoices": row[3]}

    async def create_credit_memo(customer_id: int, reference: str, amount_cents: int, reason: str = "") -> dict:
        row = await one(CREATE_CREDIT_MEMO, (reference, amount_cents, reason, customer_id))
        return {"credit_memo_id": row[0], "reference": reference, "amount_cents": amount_cents}

    async def apply_credit(customer_id: int, amount_cents: int) -> dict:
        row = await one(APPLY_CREDIT, (amount_cents, customer_id))
        return {"customer_id": customer_id, "applied_cents": amount_cents, "remaining_credit_cents": row[0]}

    async def refund_to_card(customer_id: int, reference: str, amount_cents: int) -> dict:
        from agentlab.sim.provider import FakePaymentProvider

        async with await psycopg.AsyncConnection.connect(conninfo) as conn:  # commits once the provider paid
            row = await (await conn.execute(CREATE_REFUND, (reference, amount_cents, customer_id))).fetchone()
            async with FakePaymentProvider(provider_conninfo) as provider:
                payment = await provider.create_refund(customer_id, amount_cents, reference=reference)
        return {"refund_id": row[0], "amount_cents": amount_cents, "payment_id": payment["id"]}

    return [lookup_customer, create_credit_memo, apply_credit, refund_to_card]


def tool_activities(conninfo: str, provider_conninfo: str) -> list:
    """The four tools (:func:`tool_functions`) as activities (each ``async (args: dict) -> dict``, the tool's
    answer as ``{"content": str, "status": "success" | "error"}``); the provider's errors are raised, for
    Temporal's retry policy."""
    import psycopg
    from langgraph.prebuilt.tool_node import TOOL_CALL_ERROR_TEMPLATE

    def answer(tool):
        async def run(args: dict) -> dict:
            try:
                return {"content": json.dumps(await tool(**args)), "status": "success"}
            except (psycopg.Error, TypeError, ValueError) as exc:  # the tool's own: the model is told
                return {"content": TOOL_CALL_ERROR_TEMPLATE.format(error=repr(exc)), "status": "error"}

        return activity.defn(name=tool.__name__)(run)

    return [answer(t) for t in tool_functions(conninfo, provider_conninfo)]


@activity.defn
async def call_model(script: list, seed: int, messages: list) -> dict:
    """The scripted model's next reply to ``messages`` (``messages_to_dict`` form), as one message dict."""
    from langchain_core.messages import messages_from_dict, messages_to_dict

    from agentlab.core.scenario import PlannedCall
    from agentlab.sim.model import ScriptedChatModel

    model = ScriptedChatModel(script=[[PlannedCall(**c) for c in step] for step in script], seed=seed)
    return messages_to_dict([await model.ainvoke(messages_from_dict(messages))])[0]


@workflow.defn
class RefundAgent:
    """The agent loop: ``run(prompt, script, seed) -> list[dict]`` (the messages, ``messages_to_dict`` form)."""

    @workflow.run
    async def run(self, prompt: str, script: list, seed: int) -> list:
        messages: list = [{"type": "human", "data": {"content": prompt, "type": "human"}}]
        for _ in range(MAX_MODEL_TURNS):
            reply = await workflow.execute_activity(call_model, args=[script, seed, messages],
                                                    start_to_close_timeout=START_TO_CLOSE)
            messages.append(reply)
            calls = reply["data"].get("tool_calls") or []
            if not calls:
                break
            for call in calls:
                out = await workflow.execute_activity(call["name"], call["args"], start_to_close_timeout=START_TO_CLOSE)
                messages.append({"type": "tool", "data": {"type": "tool", "content": out["content"],
                                 "status": out["status"], "tool_call_id": call["id"], "name": call["name"]}})
        return messages


def crash_interceptor(conninfo: str, workflow_id: str, committed=None):
    """The nemesis's hook (``crash_inside_step``) as a worker interceptor: once an activity returned and
    ``committed(input, out)`` says it was the deduction's, its transaction committed (default: the activity type
    is :data:`CRASH_ACTIVITY`), claim the episode's death flag on ``conninfo``
    (:func:`agentlab.lab.nemesis.death.claim_now`); the claimer exits at once with :data:`CRASH_EXIT_CODE`,
    before the worker reports the completion."""
    from temporalio.worker import ActivityInboundInterceptor, Interceptor

    flag = flag_name(workflow_id, "crash_inside_step")
    committed = committed or (lambda input, out: activity.info().activity_type == CRASH_ACTIVITY)

    class Inbound(ActivityInboundInterceptor):
        async def execute_activity(self, input):
            out = await super().execute_activity(input)
            if committed(input, out) and claim_now(conninfo, flag):
                print(f"agentlab: {flag}: the activity committed; the worker dies before Temporal records it",
                      file=sys.stderr, flush=True)
                die()
            return out

    class CrashAfterCommit(Interceptor):
        def intercept_activity(self, next):
            return Inbound(next)

    return CrashAfterCommit()


async def serve(mode: str, spec: dict) -> int:
    """One worker life (see the module's docstring); returns 0 once the workflow ended."""
    from temporalio.client import Client, WorkflowFailureError
    from temporalio.worker import Worker

    client = await Client.connect(spec["address"])
    interceptors = [crash_interceptor(spec["conninfo"], spec["workflow_id"])] if spec.get("crash") else []
    activities = [call_model, *tool_activities(spec["conninfo"], spec["provider_conninfo"])]
    async with Worker(client, task_queue=spec["task_queue"], workflows=[RefundAgent], activities=activities,
                      interceptors=interceptors):
        if mode == "start":
            handle = await client.start_workflow(RefundAgent.run, args=[spec["prompt"], spec["script"], spec["seed"]],
                                                 id=spec["workflow_id"], task_queue=spec["task_queue"])
        else:
            handle = client.get_workflow_handle(spec["workflow_id"])
        try:
            await handle.result()
        except WorkflowFailureError as exc:  # the workflow's FAILED is the engine's verdict, read by the parent
            print(f"agentlab: the workflow ended with {type(exc.cause).__name__}", file=sys.stderr, flush=True)
    return 0


def main(argv: list[str], serve_one=None) -> int:
    """``start SPEC`` or ``recover SPEC`` (SPEC: the JSON file :mod:`agentlab.lab.clients.temporal_agent`
    writes), served by ``serve_one(mode, spec)`` (default :func:`serve`). Returns 0 once the workflow ended; a
    crash fault ends the process earlier with :data:`CRASH_EXIT_CODE`."""
    mode, path = argv
    with open(path) as f:
        spec = json.load(f)
    return asyncio.run((serve_one or serve)(mode, spec))


def exit_after(code: int):
    """End a worker's process with ``code`` once its life is over, without interpreter finalization, during which
    the SDK's core threads can still call into Python and abort it ("Fatal Python error: PyGILState_Release",
    status -6, seen once in three lives here): the workflow's outcome is on the server already."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_after(main(sys.argv[1:]))
