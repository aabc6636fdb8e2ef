"""The example saga: pay a customer's store credit back to their card, in four steps.

=====  ==================  =========================================  ========================================
 pos   step                effect                                     compensation
=====  ==================  =========================================  ========================================
 1     ``hold_credit``     deduct the amount from the store credit    give the credit back
                           (one transaction; the CHECK guards >= 0)
 2     ``write_notice``    a model writes the customer's notice:      nothing to undo (no side effect); the
                           expensive, outside any transaction, its    stored text is kept
                           result stored and never asked for again
 3     ``notify_customer`` queue the notice as an e-mail through the  external: cannot be unsent; queue a
                           outbox (``notify.email``)                  correction, the step is "sent but unwound"
 4     ``queue_refund``    the refund row and its payment intent      none: money paid out is the point of no
                           (the tools' own ``QueueRefund`` handler)   return (``pivot``): once it committed the
                                                                      run only goes forward, abort is refused
=====  ==================  =========================================  ========================================

Step 4 fails *permanently* when the reference was refunded already (the natural key
``refunds_one_per_reference``): backward recovery compensates steps 3, 2, 1. It fails *transiently*
while another session holds the customer's row (its foreign-key check waits past
``lock_timeout``): forward recovery retries step 4 alone. A second session holding that row
(:class:`RowLock`) is the kit's real fault for both this and a failing compensation.
:func:`forward_recovery`, :func:`backward_recovery` and :func:`escalation` play the three recoveries
on a harness.

Sources: PostgreSQL docs "Row-Level Locks" (``FOR UPDATE`` conflicts with the ``FOR KEY SHARE`` lock a
foreign-key check takes), "lock_timeout".
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from langchain_core.messages import HumanMessage, SystemMessage

from agentlab.core.errors import NotFound
from agentlab.core.outbox import INSERT_OUTBOX, NOTIFY_TOPIC
from agentlab.core.safeguards import preset
from agentlab.core.toolspec import ToolContext
from agentlab.domains.billing.tools import queue_refund
from agentlab.durable.saga import SagaDefinition, SagaReport, SagaRunner, Step, StepContext
from agentlab.lab.row_lock import RowLock
from agentlab.sim.model import ScriptedChatModel

SAGA_NAME = "store_credit_payout"

HOLD_CREDIT = "UPDATE customers SET credit_cents = credit_cents - %s WHERE id = %s RETURNING credit_cents"
RELEASE_CREDIT = "UPDATE customers SET credit_cents = credit_cents + %s WHERE id = %s RETURNING credit_cents"
LOCK_CUSTOMER = "SELECT id FROM customers WHERE id = %s FOR UPDATE"

NOTICE_SYSTEM = ("You write short, friendly customer notices for a billing team. Plain text, no more than "
                 "three sentences.")
NOTICE_PROMPT = ("Tell the customer that {amount} of their store credit is being paid back to their card "
                 "(reference {reference}).")
NOTICE_TEXT = ("Good news: we are paying your remaining store credit back to your card. You will see it on your "
               "statement within five business days. Thank you for shopping with us.")
NOTICE_SUBJECT = "Your store credit is on its way back to your card ({reference})"
CORRECTION_SUBJECT = "Correction: your store credit refund ({reference})"
CORRECTION_TEXT = ("Please disregard our earlier message: we could not pay your store credit back to your card, "
                   "and your store credit balance is unchanged. We are sorry for the confusion.")


def notice_model(seed: int = 0) -> ScriptedChatModel:
    """The scripted model that writes the notice (any LangChain chat model works in its place)."""
    return ScriptedChatModel(script=[], seed=seed, final_text=NOTICE_TEXT)


def _money(cents: int) -> str:
    return f"{cents // 100}.{cents % 100:02d}"


async def hold_credit(ctx: StepContext) -> dict:
    args = ctx.input
    row = await (await ctx.conn.execute(HOLD_CREDIT, (args["amount_cents"], args["customer_id"]))).fetchone()
    if row is None:
        raise NotFound("no customer has this id")
    return {"customer_id": args["customer_id"], "held_cents": args["amount_cents"], "remaining_credit_cents": row[0]}


async def release_credit(ctx: StepContext, args: dict) -> dict:
    row = await (await ctx.conn.execute(RELEASE_CREDIT, (args["held_cents"], args["customer_id"]))).fetchone()
    if row is None:
        raise NotFound("no customer has this id")
    return {"customer_id": args["customer_id"], "credit_cents": row[0]}


def write_notice(model):
    """The expensive step: one model call; its text and token counts are the step's stored result."""

    async def write_notice(ctx: StepContext) -> dict:
        prompt = NOTICE_PROMPT.format(amount=_money(ctx.input["amount_cents"]), reference=ctx.input["reference"])
        reply = await model.ainvoke([SystemMessage(NOTICE_SYSTEM), HumanMessage(prompt)])
        usage = getattr(reply, "usage_metadata", None) or {}
        return {"text": str(reply.content), "input_tokens": usage.get("input_tokens"),
                "output_tokens": usage.get("output_tokens")}

    return write_notice


async def _queue_message(ctx: StepContext, key: str, subject: str, body: str, corrects: str | None = None) -> dict:
    payload = {"to": ctx.input["email"], "subject": subject, "body": body, "corrects": corrects, "saga_run": ctx.run_id}
    row = await (await ctx.conn.execute(INSERT_OUTBOX, (NOTIFY_TOPIC, json.dumps(payload), key,
                                                        f"saga:{ctx.run_id}"))).fetchone()
    return {"dedupe_key": key, "status": "queued" if row is not None else "already_queued"}


async def notify_customer(ctx: StepContext) -> dict:
    subject = NOTICE_SUBJECT.format(reference=ctx.input["reference"])
    return await _queue_message(ctx, ctx.key("notice"), subject, ctx.results["write_notice"]["text"])


async def send_correction(ctx: StepContext, args: dict) -> dict:
    subject = CORRECTION_SUBJECT.format(reference=ctx.input["reference"])
    return await _queue_message(ctx, ctx.key("correction"), subject, CORRECTION_TEXT, corrects=args["dedupe_key"])


async def refund_to_card(ctx: StepContext) -> dict:
    args = {k: ctx.input[k] for k in ("customer_id", "reference", "amount_cents")}
    tool_ctx = ToolContext(thread_id=f"saga:{ctx.run_id}", tool_call_id=ctx.key(), safeguards=preset("full"))
    return await queue_refund(ctx.conn, args, tool_ctx)


def store_credit_payout(model=None) -> SagaDefinition:
    """The four-step saga; ``model`` writes the notice (default: :func:`notice_model`).

    Its input: ``{"customer_id": int, "amount_cents": int, "reference": str, "email": str}``.
    """
    model = model or notice_model()
    return SagaDefinition(SAGA_NAME, (
        Step("hold_credit", hold_credit, release_credit),
        Step("write_notice", write_notice(model), None, in_transaction=False),
        Step("notify_customer", notify_customer, send_correction, external=True),
        Step("queue_refund", refund_to_card, None, pivot=True),
    ))


def payout_input(customer_id: int, amount_cents: int, reference: str, email: str | None = None) -> dict:
    """The saga's input for one customer."""
    return {"customer_id": customer_id, "amount_cents": amount_cents, "reference": reference,
            "email": email or f"customer-{customer_id}@example.com"}


def run_key(customer_id: int, reference: str) -> str:
    """The business key of one payout run: one run per customer and reference."""
    return f"payout:{customer_id}:{reference}"


# --------------------------------------------------------------------------- the three recoveries

def _runner(h, saga: SagaDefinition, runner_kwargs: dict) -> SagaRunner:
    """A runner on ``h``'s pool; behind a transaction-mode pooler (``h.behind_pooler``) it takes no session lock."""
    return SagaRunner(h.pool, saga, **{"behind_pooler": getattr(h, "behind_pooler", False), **runner_kwargs})


INSERT_EARLIER_REFUND = """
INSERT INTO refunds (tenant_id, customer_id, reference, amount_cents)
SELECT tenant_id, id, %s, %s FROM customers WHERE id = %s
"""


async def forward_recovery(h, saga: SagaDefinition, customer_id: int, amount_cents: int, reference: str,
                           **runner_kwargs) -> SagaReport:
    """Forward recovery: while step 4 first runs, another session holds the customer's row, so its
    foreign-key check waits past ``lock_timeout`` (transient); the lock ends after that failure and
    the retry of step 4 alone succeeds. Steps 1-3 run once."""
    runner = _runner(h, saga, runner_kwargs)
    held: list[RowLock] = []

    async def busy_before_refund(position: int, name: str) -> None:
        if position == 3:
            held.append(await RowLock.acquire(h.url, customer_id))

    async def free_after_failure(position: int, attempt: int, exc: BaseException) -> None:
        while held:
            await held.pop().release()

    runner.hooks.after_step.append(busy_before_refund)
    runner.hooks.after_failure.append(free_after_failure)
    try:
        return await runner.start(run_key(customer_id, reference), payout_input(customer_id, amount_cents, reference))
    finally:
        while held:
            await held.pop().release()


async def backward_recovery(h, saga: SagaDefinition, customer_id: int, amount_cents: int, reference: str,
                            **runner_kwargs) -> SagaReport:
    """Backward recovery: the reference was refunded already (by another channel), so step 4 breaks
    the natural key (permanent); steps 3, 2, 1 are compensated in that order, the notice corrected."""
    async with h.pool.connection() as conn:
        await conn.execute(INSERT_EARLIER_REFUND, (reference, amount_cents, customer_id))
    runner = _runner(h, saga, runner_kwargs)
    return await runner.start(run_key(customer_id, reference), payout_input(customer_id, amount_cents, reference))


async def escalation(h, saga: SagaDefinition, customer_id: int, amount_cents: int, reference: str,
                     **runner_kwargs) -> SagaReport:
    """Escalation: as :func:`backward_recovery`, but once step 4 has failed another session holds the
    customer's row, so giving the credit back (the compensation of step 1) fails past its attempts:
    the saga stops, parks the run and leaves one "compensation needed" row. The lock is released
    when the function returns; :meth:`SagaRunner.resume` then finishes the compensation."""
    async with h.pool.connection() as conn:
        await conn.execute(INSERT_EARLIER_REFUND, (reference, amount_cents, customer_id))
    runner = _runner(h, saga, runner_kwargs)
    held: list[RowLock] = []

    async def busy_after_failure(position: int, attempt: int, exc: BaseException) -> None:
        if position == 4 and not held:
            held.append(await RowLock.acquire(h.url, customer_id))

    runner.hooks.after_failure.append(busy_after_failure)
    try:
        return await runner.start(run_key(customer_id, reference), payout_input(customer_id, amount_cents, reference))
    finally:
        while held:
            await held.pop().release()


# --------------------------------------------------------------------------- the same steps without a saga

SCRIPT_FAULTS = ("busy_row", "already_refunded")
COUNT_PROVIDER_REFUNDS = """
SELECT count(*), coalesce(sum(amount_cents), 0) FROM provider.payments WHERE customer = %s AND kind = 'refund'
"""
COUNT_MESSAGES = """
SELECT count(*) FILTER (WHERE corrects IS NULL), count(*) FILTER (WHERE corrects IS NOT NULL)
FROM notify.messages WHERE recipient = %s
"""
CREDIT_OF = "SELECT credit_cents FROM customers WHERE id = %s"
SET_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', %s, true)"


@dataclass
class ScriptContext(StepContext):
    """A step's context inside :func:`payout_script`. A script has no run row (``run_id`` is 0), so
    its dedupe keys name the run key and the script's attempt: every attempt is a new execution."""

    def key(self, suffix: str = "") -> str:
        return f"script:{self.run_key}:{self.attempt}:{self.position}" + (f":{suffix}" if suffix else "")


async def payout_script(h, saga: SagaDefinition, customer_id: int, amount_cents: int, reference: str, *,
                        fault: str | None = None, attempts: int = 2, lock_timeout_ms: int = 100) -> dict:
    """The saga's steps as a plain script, for contrast with :class:`agentlab.durable.saga.SagaRunner`.

    Each step runs as the saga would run it (a local step in a short transaction of its own, the model
    call outside any), but nothing is journaled and nothing is compensated: when a step raises, the
    whole script starts again from step 1, up to ``attempts`` times in all, as a task queue's
    automatic retry does; then it gives up and leaves whatever the earlier steps did.

    Args:
        fault: ``"busy_row"``: another session holds the customer's row while step 4 first runs and
            lets go after that failure (the fault of :func:`forward_recovery`); ``"already_refunded"``:
            the reference was refunded by another channel before (the fault of :func:`backward_recovery`);
            None: no fault.

    Returns:
        ``{"attempts": n, "outcome": "completed" | "gave up", "errors": [error class per failed
        attempt], "model_calls": n}``; the effects are in the database (:func:`payout_effects`).
    """
    if fault not in (None, *SCRIPT_FAULTS):
        raise ValueError(f"unknown fault {fault!r}; choose one of: {', '.join(SCRIPT_FAULTS)}")
    if fault == "already_refunded":
        async with h.pool.connection() as conn:
            await conn.execute(INSERT_EARLIER_REFUND, (reference, amount_cents, customer_id))
    data = payout_input(customer_id, amount_cents, reference)
    key = run_key(customer_id, reference)
    held: list[RowLock] = []
    errors: list[str] = []
    model_calls = 0
    try:
        for attempt in range(1, attempts + 1):
            results: dict[str, dict] = {}
            try:
                for pos, step in enumerate(saga.steps, 1):
                    if fault == "busy_row" and pos == 4 and attempt == 1:
                        held.append(await RowLock.acquire(h.url, customer_id))
                    ctx = ScriptContext(0, key, pos, step.name, attempt, data, results)
                    if step.in_transaction:
                        async with h.pool.connection() as conn, conn.transaction():
                            await conn.execute(SET_LOCK_TIMEOUT, (f"{lock_timeout_ms}ms",))
                            ctx.conn = conn
                            results[step.name] = await step.action(ctx)
                    else:
                        model_calls += 1
                        results[step.name] = await step.action(ctx)
            except Exception as exc:
                errors.append(type(exc).__name__)
                while held:
                    await held.pop().release()
                continue
            return {"attempts": attempt, "outcome": "completed", "errors": errors, "model_calls": model_calls}
        return {"attempts": attempts, "outcome": "gave up", "errors": errors, "model_calls": model_calls}
    finally:
        while held:
            await held.pop().release()


async def payout_effects(h, customer_id: int, opening_credit_cents: int, *, drain: bool = True) -> dict:
    """What one payout left behind, read from the database, the provider and the notifier (after the
    outbox worker sent what was queued, unless ``drain`` is False): ``credit_deducted_cents``,
    ``refunds_at_provider`` and ``refunded_cents`` (payments this customer received), ``notices_sent``
    and ``corrections_sent`` (e-mails delivered to the customer)."""
    from agentlab.sim.provider import customer_ref

    if drain:
        await h.worker.drain()
    async with h.pool.connection() as conn:
        credit = (await (await conn.execute(CREDIT_OF, (customer_id,))).fetchone())[0]
        refunds, refunded = await (await conn.execute(COUNT_PROVIDER_REFUNDS, (customer_ref(customer_id),))).fetchone()
        email = payout_input(customer_id, 0, "")["email"]
        notices, corrections = await (await conn.execute(COUNT_MESSAGES, (email,))).fetchone()
    return {"credit_deducted_cents": opening_credit_cents - credit, "refunds_at_provider": refunds,
            "refunded_cents": int(refunded), "notices_sent": notices, "corrections_sent": corrections}
