"""The refund story as a DBOS user writes it, run by the lab in a child process: one life per process.

``python -m agentlab.lab.clients.dbos_app start SPEC.json`` launches DBOS and starts the agent's workflow;
``python -m agentlab.lab.clients.dbos_app recover SPEC.json`` launches DBOS again, whose ``DBOS.launch()``
recovers the workflow a dead process left PENDING, and waits for it. The parent side, which creates the
system database, arms the faults and reads DBOS's verdict, is :mod:`agentlab.lab.clients.dbos_agent`.

What a DBOS user writes (:func:`build_app`), every DBOS default untouched:

- ``DBOS(config={"name": ..., "system_database_url": ...})``, then ``DBOS.launch()`` (the docs' quickstart);
- shape ``"transactions"`` (the docs' "Transactions & Datasources"): each tool's database write is a
  ``@ds.transaction()`` of a ``SQLAlchemyDatasource`` (its default isolation, SERIALIZABLE), run through
  ``ds.sql_session()``; the payment provider's call is a ``@DBOS.step()``;
- shape ``"steps"`` (the shape agent integrations use): every tool is one ``@DBOS.step()`` that opens its
  own SQLAlchemy connection (``with engine.begin()``) and, for the refund, calls the provider too;
- the agent loop is a ``@DBOS.workflow()``: the model call is a step (its AIMessage recorded), each tool
  call runs in order, and a tool's exception becomes the ToolMessage LangGraph's ``ToolNode`` writes with
  ``handle_tool_errors=True`` (``"Error: {repr(exc)}\\n Please fix your mistakes."``, status ``error``);
  after each batch the messages so far are published with ``DBOS.set_event`` (:data:`MESSAGES_EVENT`).

The statements are the kit's own (billing's, run with SQLAlchemy's ``exec_driver_sql``), so the yardstick
compares agents, not queries. The model is the kit's scripted one, playing the script it gets as the
workflow's input (so the recovered life plays the same script from DBOS's record).

The lab's one hook (:func:`watch_for_crash`, the nemesis, not the user's code): SQLAlchemy events on
both engines note a connection that ran the armed statement; when that connection goes back to its pool
after a commit, the process claims the episode's death flag (:mod:`agentlab.lab.nemesis.death`: once across
processes) and dies with ``os._exit(99)`` before DBOS records the step's result.

Sources: docs.dbos.dev "Transactions & Datasources", "Workflows", "Steps", "Workflow Communication"
(``set_event``); SQLAlchemy "Core Events" (``after_cursor_execute``, ``rollback``, ``checkin``).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from agentlab.lab.nemesis.death import EXIT_CODE, claim_now, die, flag_name

CRASH_EXIT_CODE = EXIT_CODE  # the nemesis's exit status (agentlab.lab.nemesis.death)
MESSAGES_EVENT = "messages"
MAX_MODEL_TURNS = 10  # the loop's recursion limit: model calls per run
APP_NAME = "agentlab-refund"


def crash_flag(workflow_id: str) -> str:
    """The death flag (:mod:`agentlab.lab.nemesis.death`) that arms ``crash_inside_step`` for the workflow
    ``workflow_id`` (the episode's thread)."""
    return flag_name(workflow_id, "crash_inside_step")


def build_app(app_url: str, system_url: str, provider_conninfo: str) -> dict[str, Any]:
    """Register the agent with DBOS as its user writes it (see the module's docstring).

    Args:
        app_url: the episode's database as a SQLAlchemy URL (``postgresql+psycopg://...``).
        system_url: DBOS's system database, a SQLAlchemy URL on the same server.
        provider_conninfo: the payment provider's database (a psycopg conninfo; the fake provider's schema).

    Returns:
        ``{"workflow": refund_agent, "engines": [ds.engine, engine]}``: the workflow function
        ``refund_agent(prompt: str, script: list, seed: int, shape: str) -> list[dict]`` (the messages as
        ``messages_to_dict``) and the two SQLAlchemy engines the tools write through.
    """
    import sqlalchemy as sa
    from dbos import DBOS, DBOSConfig, SQLAlchemyDatasource

    config: DBOSConfig = {"name": APP_NAME, "system_database_url": system_url}
    DBOS(config=config)
    ds = SQLAlchemyDatasource.create(app_url)
    engine = sa.create_engine(app_url)  # the steps shape's own engine, as a user opens one

    refund_at_provider = provider_refunder(provider_conninfo)
    tools = {"transactions": transaction_tools(ds, refund_at_provider), "steps": step_tools(engine, refund_at_provider)}
    return {"workflow": agent_workflow(tools), "engines": [ds.engine, engine]}


def provider_refunder(provider_conninfo: str):
    """The payment provider's refund call as a tool's code makes it: ``refund_at_provider(customer_id,
    amount_cents, reference) -> payment dict`` (the fake provider's row: ``{"id": ..., ...}``; amounts in
    cents) on the provider's database ``provider_conninfo``. Raises what the provider raises (``psycopg.Error``)."""

    def refund_at_provider(customer_id: int, amount_cents: int, reference: str) -> dict:
        from agentlab.sim.provider import FakePaymentProvider

        async def call() -> dict:
            async with FakePaymentProvider(provider_conninfo) as provider:
                return await provider.create_refund(customer_id, amount_cents, reference=reference)

        return asyncio.run(call())

    return refund_at_provider


def transaction_tools(ds, refund_at_provider) -> dict[str, Any]:
    """Shape ``"transactions"``: each write a ``@ds.transaction()`` on the datasource ``ds``, the provider's
    call (``refund_at_provider(customer_id, amount_cents, reference) -> payment dict``) a ``@DBOS.step()``.
    Returns the tools by the agent's tool names."""
    from dbos import DBOS

    from agentlab.domains.billing.tools import APPLY_CREDIT, CREATE_CREDIT_MEMO, CREATE_REFUND, LOOKUP_CUSTOMER

    def one(statement: str, params: tuple) -> Any:
        return ds.sql_session().connection().exec_driver_sql(statement, params).fetchone()

    @ds.transaction()
    def lookup_customer(customer_id: int) -> dict:
        """Read a customer's name, available credit (in cents) and number of open invoices."""
        row = one(LOOKUP_CUSTOMER, (customer_id,))
        return {"customer_id": row[0], "name": row[1], "available_credit_cents": row[2], "open_invoices": row[3]}

    @ds.transaction()
    def create_credit_memo(customer_id: int, reference: str, amount_cents: int, reason: str = "") -> dict:
        """Record a credit memo for a customer under a business reference."""
        row = one(CREATE_CREDIT_MEMO, (reference, amount_cents, reason, customer_id))
        return {"credit_memo_id": row[0], "reference": reference, "amount_cents": amount_cents}

    @ds.transaction()
    def apply_credit(customer_id: int, amount_cents: int) -> dict:
        """Deduct amount_cents from the customer's available credit balance."""
        row = one(APPLY_CREDIT, (amount_cents, customer_id))
        return {"customer_id": customer_id, "applied_cents": amount_cents, "remaining_credit_cents": row[0]}

    @ds.transaction()
    def record_refund(customer_id: int, reference: str, amount_cents: int) -> int:
        return one(CREATE_REFUND, (reference, amount_cents, customer_id))[0]

    @DBOS.step()
    def send_refund(customer_id: int, amount_cents: int, reference: str) -> str:
        return refund_at_provider(customer_id, amount_cents, reference)["id"]

    def refund_to_card(customer_id: int, reference: str, amount_cents: int) -> dict:
        """Refund money to the customer's card under a business reference."""
        refund_id = record_refund(customer_id, reference, amount_cents)
        payment_id = send_refund(customer_id, amount_cents, reference)
        return {"refund_id": refund_id, "amount_cents": amount_cents, "payment_id": payment_id}

    return {"lookup_customer": lookup_customer, "create_credit_memo": create_credit_memo,
            "apply_credit": apply_credit, "refund_to_card": refund_to_card}


def step_tools(engine, refund_at_provider) -> dict[str, Any]:
    """Shape ``"steps"``: every tool one ``@DBOS.step()`` on its own connection of ``engine`` (a SQLAlchemy
    engine; ``with engine.begin()`` commits at the block's end), the refund calling the provider in the same
    step. Returns the tools by the agent's tool names."""
    from dbos import DBOS

    from agentlab.domains.billing.tools import APPLY_CREDIT, CREATE_CREDIT_MEMO, CREATE_REFUND, LOOKUP_CUSTOMER

    def one(statement: str, params: tuple) -> Any:
        with engine.begin() as conn:
            return conn.exec_driver_sql(statement, params).fetchone()

    @DBOS.step()
    def lookup_customer(customer_id: int) -> dict:
        """Read a customer's name, available credit (in cents) and number of open invoices."""
        row = one(LOOKUP_CUSTOMER, (customer_id,))
        return {"customer_id": row[0], "name": row[1], "available_credit_cents": row[2], "open_invoices": row[3]}

    @DBOS.step()
    def create_credit_memo(customer_id: int, reference: str, amount_cents: int, reason: str = "") -> dict:
        """Record a credit memo for a customer under a business reference."""
        row = one(CREATE_CREDIT_MEMO, (reference, amount_cents, reason, customer_id))
        return {"credit_memo_id": row[0], "reference": reference, "amount_cents": amount_cents}

    @DBOS.step()
    def apply_credit(customer_id: int, amount_cents: int) -> dict:
        """Deduct amount_cents from the customer's available credit balance."""
        row = one(APPLY_CREDIT, (amount_cents, customer_id))
        return {"customer_id": customer_id, "applied_cents": amount_cents, "remaining_credit_cents": row[0]}

    @DBOS.step()
    def refund_to_card(customer_id: int, reference: str, amount_cents: int) -> dict:
        """Refund money to the customer's card under a business reference."""
        row = one(CREATE_REFUND, (reference, amount_cents, customer_id))
        payment = refund_at_provider(customer_id, amount_cents, reference)
        return {"refund_id": row[0], "amount_cents": amount_cents, "payment_id": payment["id"]}

    return {"lookup_customer": lookup_customer, "create_credit_memo": create_credit_memo,
            "apply_credit": apply_credit, "refund_to_card": refund_to_card}


def agent_workflow(tools: dict[str, dict[str, Any]]):
    """The agent loop as a ``@DBOS.workflow()`` over ``tools`` (shape -> tool name -> function): returns
    ``refund_agent(prompt, script, seed, shape) -> list[dict]`` (see :func:`build_app`)."""
    from dbos import DBOS
    from dbos import error as dbos_error
    from langchain_core.messages import HumanMessage, ToolMessage, messages_to_dict
    from langgraph.prebuilt.tool_node import TOOL_CALL_ERROR_TEMPLATE

    from agentlab.sim.model import ScriptedChatModel

    @DBOS.step()
    def call_model(script: list, seed: int, shape: str, messages: list) -> Any:
        model = ScriptedChatModel(script=script, seed=seed).bind_tools(list(tools[shape].values()))
        return model.invoke(messages)

    def run_tool(shape: str, call: dict) -> ToolMessage:
        try:
            out = tools[shape][call["name"]](**call["args"])
        except dbos_error.DBOSException:
            raise  # the engine's own (a cancelled or conflicting workflow): not the tool's answer
        except Exception as exc:  # noqa: BLE001 (the agent hands every tool error to the model)
            return ToolMessage(TOOL_CALL_ERROR_TEMPLATE.format(error=repr(exc)), tool_call_id=call["id"],
                               name=call["name"], status="error")
        return ToolMessage(json.dumps(out), tool_call_id=call["id"], name=call["name"])

    @DBOS.workflow()
    def refund_agent(prompt: str, script: list, seed: int, shape: str) -> list[dict]:
        messages: list = [HumanMessage(prompt)]
        for _ in range(MAX_MODEL_TURNS):
            reply = call_model(script, seed, shape, messages)
            messages.append(reply)
            if not reply.tool_calls:
                break
            messages.extend(run_tool(shape, call) for call in reply.tool_calls)
            DBOS.set_event(MESSAGES_EVENT, messages_to_dict(messages))
        DBOS.set_event(MESSAGES_EVENT, messages_to_dict(messages))
        return messages_to_dict(messages)

    return refund_agent


def watch_for_crash(engines: list, statement_prefix: str, flags_conninfo: str) -> None:
    """The nemesis's hook (``crash_inside_step``): once a connection of ``engines`` that ran a statement
    starting with ``statement_prefix`` goes back to its pool after a commit (the tool's effect is
    durable), claim this workflow's death flag on ``flags_conninfo`` (:func:`agentlab.lab.nemesis.death.claim_now`);
    the claimer exits at once with :data:`CRASH_EXIT_CODE` (``os._exit``: no handler, no flush, no record)."""
    from dbos import DBOS
    from sqlalchemy import event

    def noted(conn, cursor, statement, parameters, context, executemany) -> None:
        if statement.lstrip().startswith(statement_prefix) and DBOS.workflow_id:
            conn.info["agentlab_crash_flag"] = crash_flag(DBOS.workflow_id)

    def rolled_back(conn) -> None:
        conn.info.pop("agentlab_crash_flag", None)

    def returned(dbapi_connection, record) -> None:
        flag = record.info.pop("agentlab_crash_flag", None)
        if flag is None:
            return
        if claim_now(flags_conninfo, flag):
            print(f"agentlab: {flag}: the effect committed; the process dies before DBOS records it",
                  file=sys.stderr, flush=True)
            die()

    for engine in engines:
        event.listen(engine, "after_cursor_execute", noted)
        event.listen(engine, "rollback", rolled_back)
        event.listen(engine, "checkin", returned)


def serve_life(argv: list[str], build, run) -> int:
    """One life of a DBOS application (this module's, or :mod:`agentlab.lab.clients.pydantic_ai_app`): ``argv`` is
    ``[mode, SPEC]`` (``"start"`` or ``"recover"``; SPEC: the JSON file :mod:`agentlab.lab.clients.dbos_agent`
    writes); ``build(app_url, system_url, provider_conninfo) -> {"workflow": ..., "engines": [...]}`` registers
    the application with DBOS; after the crash hook is armed (when SPEC asks) and ``DBOS.launch()`` (which
    recovers a dead life's PENDING workflow), ``run(mode, spec, workflow)`` starts or awaits the workflow.
    Returns 0 once it ended; a crash fault ends the process earlier with :data:`CRASH_EXIT_CODE`."""
    from dbos import DBOS

    mode, path = argv
    with open(path) as f:
        spec = json.load(f)
    app = build(spec["app_url"], spec["system_url"], spec["provider_conninfo"])
    if spec.get("crash_after_statement"):
        watch_for_crash(app["engines"], spec["crash_after_statement"], spec["provider_conninfo"])
    DBOS.launch()  # recovers this executor's PENDING workflows (a dead life's) in the background
    try:
        run(mode, spec, app["workflow"])
    finally:
        DBOS.destroy()
    return 0


def play(mode: str, spec: dict, workflow) -> None:
    """Start the workflow (``mode`` ``"start"``) or wait for the one ``DBOS.launch()`` recovered
    (``"recover"``); its ERROR is the engine's verdict, read by the parent, so it is only noted here."""
    from dbos import DBOS, SetWorkflowID

    if mode == "start":
        from agentlab.core.scenario import PlannedCall

        script = [[PlannedCall(**call) for call in step] for step in spec["script"]]
        with SetWorkflowID(spec["workflow_id"]):
            handle = DBOS.start_workflow(workflow, spec["prompt"], script, spec["seed"], spec["shape"])
    else:
        handle = DBOS.retrieve_workflow(spec["workflow_id"])
    try:
        handle.get_result()
    except Exception as exc:  # noqa: BLE001 (the workflow's ERROR is the engine's verdict, read by the parent)
        print(f"agentlab: the workflow ended with {type(exc).__name__}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    """``start SPEC`` or ``recover SPEC``: one life of the refund agent (:func:`serve_life`)."""
    return serve_life(argv, build_app, play)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
