"""The concurrency fault family on tau2 retail: two conversations at once on one order or gift card, each
race forced by a rendezvous between real transactions, caught by invariants read from the database, held
by ``full`` (row locks, the thread lease) and by repeatable read, shown by every weaker preset.
"""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage

from agentlab.core.domain import InvariantContext
from agentlab.core.safeguards import preset
from agentlab.domains.retail.concurrency import (
    BY_NAME,
    G1_OPENING_CENTS,
    G2_OPENING_CENTS,
    KINDS,
    NOT_APPLICABLE,
    RACES,
    check_entities,
    create_entities,
)
from agentlab.domains.retail.domain import paid_twice
from agentlab.lab.faults import CONCURRENCY_FAMILY, fault_scenarios, get_fault
from agentlab.lab.runner import Lab
from agentlab.runtime import db
from agentlab.runtime.domains import resolve_domain
from agentlab.runtime.harness import Harness
from conftest import fetch, scalar

RETAIL = resolve_domain("retail")
NO_LOCKS = preset("full").replace(row_locks=False, name="full-no-row-locks")
RR = NO_LOCKS.replace(isolation_level="repeatable read", name="repeatable-read")
NO_RUN_LOCK = preset("full").replace(run_lock=False, name="full-no-run-lock")

# race -> (fault, a weaker setting, the kinds it must show there)
BREAKS = {
    "cancel_twice_one_thread": ("same_thread_runs", NO_RUN_LOCK, {"forked_thread"}),
    "payment_change_twice": ("double_submit", NO_LOCKS, {"paid_twice", "gift_card_balance"}),
    "two_refunds_one_gift_card": ("lost_update", NO_LOCKS, {"gift_card_balance"}),
    "two_cancels": ("check_then_act", NO_LOCKS, {"paid_twice", "gift_card_balance", "order_payments"}),
    "exchange_and_cancel": ("check_then_act", NO_LOCKS, {"gift_card_balance", "order_status_transition",
                                                         "order_payments"}),
    "return_and_exchange": ("check_then_act", NO_LOCKS, {"order_status_transition"}),
}


@pytest.fixture
async def retail():
    url = db.create_database("test", RETAIL)
    h = await Harness.open(url, domain=RETAIL)
    try:
        yield h
    finally:
        await h.close()
        db.drop_database(url)


async def history(h, order_id: str) -> list[tuple]:
    return await fetch(h, "SELECT transaction_type, amount_cents, payment_method_id FROM retail.payment_history "
                          "WHERE order_id = %s ORDER BY seq", (order_id,))


async def balance(h, pm: str) -> int:
    return await scalar(h, "SELECT balance_cents FROM retail.payment_methods WHERE payment_method_id = %s", (pm,))


async def status(h, order_id: str) -> str:
    return await scalar(h, "SELECT status FROM retail.orders WHERE order_id = %s", (order_id,))


def test_every_fault_but_write_skew_has_retail_races_and_write_skew_says_why_not():
    assert set(RACES) | set(NOT_APPLICABLE) == set(CONCURRENCY_FAMILY)
    assert set(BY_NAME) == set(BREAKS)
    for name in RACES:
        assert fault_scenarios(get_fault(name), RETAIL) == tuple(r.name for r in RACES[name])
    with pytest.raises(ValueError, match="write_skew.*does not apply to domain 'retail'.*no refund cap"):
        fault_scenarios(get_fault("write_skew"), RETAIL)
    assert set(KINDS) == {"paid_twice", "gift_card_balance", "order_status_transition", "order_payments"}
    # the domain checks the same on every order the change log names
    assert set(KINDS) <= {inv.kind for inv in RETAIL.invariants}


def test_chaos_refuses_write_skew_on_retail_with_the_reason(capsys):
    from agentlab.cli.main import main

    assert main(["chaos", "--domain", "retail", "--faults", "write_skew", "--episodes", "1"]) == 2
    err = capsys.readouterr().err
    assert "fault 'write_skew' does not apply to domain 'retail'" in err and "no refund cap" in err


@pytest.mark.parametrize("race", BREAKS)
async def test_each_race_breaks_under_a_weaker_setting_and_holds_under_full(retail, race):
    fault, weaker, kinds = BREAKS[race]
    async with Lab(retail) as lab:
        broken = await lab.run(fault, weaker, scenario=race, seed=3)
        held = await lab.run(fault, "full", scenario=race, seed=3)
    assert kinds <= {v.kind for v in broken.violations}, broken.violations
    assert broken.episode.error is None and held.episode.error is None, (broken.episode.error, held.episode.error)
    assert held.violations == [], held.violations
    assert any(e.endswith("at its act") for e in broken.notes["rendezvous"])  # the interleaving was forced
    # the checker reads the database: on full's rows every invariant holds, on the broken run's it does not
    async with retail.pool.connection() as conn:
        assert await check_entities(conn, [held.notes["user_id"]]) == []
        assert {k for k, _ in await check_entities(conn, [broken.notes["user_id"]])} == kinds - {"forked_thread"}
        # and the domain's own invariants, on every order the change log names, find the same
        ctx = InvariantContext(conn, "t", [], "retail", None, [])
        found = {inv.kind for inv in RETAIL.invariants if await inv.check(ctx)}
        assert bool(await paid_twice(ctx)) == ("paid_twice" in found)  # the domain's list holds paid_twice
    assert found == kinds - {"forked_thread"}


async def test_two_cancels_refund_twice_without_locks_once_with_them(retail):
    async with Lab(retail) as lab:
        runs = {sg.name: await lab.run("check_then_act", sg, scenario="two_cancels", seed=0)
                for sg in (NO_LOCKS, preset("full"), RR)}
    for name, run in runs.items():
        key = run.notes["user_id"].removeprefix("race_")
        p1, g1 = f"#R{key}p1", f"gift_card_g1{key}"
        (_, paid, _), *rest = await history(retail, p1)
        assert await status(retail, p1) == "cancelled"
        if name == NO_LOCKS.name:  # both checked 'pending', both refunded; the balance written last holds one
            assert rest == [("refund", paid, g1), ("refund", paid, g1)]
            assert await balance(retail, g1) == G1_OPENING_CENTS + paid
        else:  # the second waited on the order's lock (full) or failed with 40001 and retried (repeatable read)
            assert rest == [("refund", paid, g1)], name
            assert await balance(retail, g1) == G1_OPENING_CENTS + paid, name
    refused = [m for m in runs["full"].episode.messages if "Non-pending order cannot be cancelled" in str(m.content)]
    assert len(refused) == 1


async def test_two_refunds_to_one_gift_card_lose_one_without_locks(retail):
    async with Lab(retail) as lab:
        runs = {sg.name: await lab.run("lost_update", sg, seed=0) for sg in (NO_LOCKS, preset("full"), RR)}
    for name, run in runs.items():
        key = run.notes["user_id"].removeprefix("race_")
        g1 = f"gift_card_g1{key}"
        refunds = [a for p in ("p1", "p2") for k, a, _ in await history(retail, f"#R{key}{p}") if k == "refund"]
        assert len(refunds) == 2, name  # both orders cancelled and refunded
        if name == NO_LOCKS.name:  # each wrote opening + its own refund: one refund lost
            assert await balance(retail, g1) in (G1_OPENING_CENTS + refunds[0], G1_OPENING_CENTS + refunds[1])
        else:
            assert await balance(retail, g1) == G1_OPENING_CENTS + sum(refunds), name


async def test_a_double_submitted_payment_change_charges_the_history_twice_the_cards_once(retail):
    async with Lab(retail) as lab:
        broken = await lab.run("double_submit", NO_LOCKS, seed=0)
        held = await lab.run("double_submit", "full", seed=0)
    for run, changes in ((broken, 2), (held, 1)):
        key = run.notes["user_id"].removeprefix("race_")
        g1, g2 = f"gift_card_g1{key}", f"gift_card_g2{key}"
        (_, paid, _), *rest = await history(retail, f"#R{key}p1")
        assert rest == [("payment", paid, g2), ("refund", paid, g1)] * changes
        assert await balance(retail, g2) == G2_OPENING_CENTS - paid  # written once as an absolute value either way
        assert await balance(retail, g1) == G1_OPENING_CENTS + paid


async def test_a_return_and_an_exchange_of_one_delivered_order(retail):
    async with Lab(retail) as lab:
        broken = await lab.run("check_then_act", NO_LOCKS, scenario="return_and_exchange", seed=0)
        held = await lab.run("check_then_act", "full", scenario="return_and_exchange", seed=0)
    query = "SELECT status, return_items IS NOT NULL, exchange_items IS NOT NULL FROM retail.orders WHERE order_id = %s"
    key = broken.notes["user_id"].removeprefix("race_")
    assert await fetch(retail, query, (f"#R{key}d",)) == [("exchange requested", True, True)]
    key = held.notes["user_id"].removeprefix("race_")
    # under the row lock whichever locks the order first moves it; the other sees it moved and is refused
    assert await fetch(retail, query, (f"#R{key}d",)) in ([("return requested", True, False)],
                                                          [("exchange requested", False, True)])
    refused = [m for m in held.episode.messages if "Non-delivered order cannot be" in str(m.content)]
    assert len(refused) == 1


async def test_two_runs_on_one_thread_the_second_refused_under_the_lease(retail):
    async with Lab(retail) as lab:
        held = await lab.run("same_thread_runs", "full", seed=0)
        forked = await lab.run("same_thread_runs", NO_RUN_LOCK, seed=0)
    assert held.notes["refused"] == ["B"] and held.violations == []  # B asks for the lease once A holds it
    thread = held.notes["threads"][0]
    roots = await scalar(retail, "SELECT count(*) FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = '' "
                                 "AND parent_checkpoint_id IS NULL", (thread,))
    assert roots == 1
    assert forked.notes["refused"] == [] and "forked_thread" in {v.kind for v in forked.violations}
    roots = await scalar(retail, "SELECT count(*) FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = '' "
                                 "AND parent_checkpoint_id IS NULL", (forked.notes["threads"][0],))
    assert roots == 2


async def test_episode_rows_are_their_own_and_part_of_the_opening_state(retail):
    async with retail.pool.connection() as conn:
        a, b = await create_entities(conn), await create_entities(conn)
        assert a.user_id != b.user_id and a.p1 != b.p1
        assert await check_entities(conn, [a.user_id, b.user_id]) == []
        opening = await (await conn.execute("SELECT count(*) FROM retail.opening_orders WHERE order_id = ANY(%s)",
                                            ([a.p1, a.p2, a.delivered],))).fetchone()
    assert opening == (3,)
    for inv in RETAIL.invariants:  # the domain's own invariants see the new rows as opening state
        async with retail.pool.connection() as conn:
            assert await inv.check(InvariantContext(conn, "t", [], "retail", None, [])) == [], inv.kind


@pytest.mark.slow
async def test_the_chaos_table_full_holds_every_fault_breaks_under_naive_same_seed_same_table():
    from agentlab.lab.experiments import run_experiment

    faults = list(RACES)
    tables = [await run_experiment(2, ["naive", "full"], faults, seed=5, domain=RETAIL, progress=False)
              for _ in range(2)]
    cells = [t.rows.groupby(["fault", "preset"])["violations"].sum().to_dict() for t in tables]
    assert cells[0] == cells[1]
    for fault in faults:
        assert cells[0][(fault, "full")] == 0, cells[0]
        assert cells[0][(fault, "naive")] > 0, cells[0]


async def test_with_a_bounded_wait_the_second_run_follows_the_first_and_is_refused_by_the_order(retail):
    waits = preset("full").replace(run_lock_wait_ms=20_000, name="full-waits")
    async with Lab(retail) as lab:
        run = await lab.run("same_thread_runs", waits, seed=0)
    assert run.notes["refused"] == [] and run.violations == [] and run.episode.error is None
    key = run.notes["user_id"].removeprefix("race_")
    (_, paid, _), *rest = await history(retail, f"#R{key}p1")
    assert rest == [("refund", paid, f"gift_card_g1{key}")]  # cancelled once: the second run came after the first
    assert sum(isinstance(m, HumanMessage) for m in run.episode.messages) == 2  # both ran, one after the other
    # the one waiting for the lease is not waited for at the act: no rendezvous ran into its bound
    log = run.notes["rendezvous"]
    assert any(e.endswith("goes on (all arrived)") for e in log) and not any("timeout" in e for e in log), log
    roots = await scalar(retail, "SELECT count(*) FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = '' "
                                 "AND parent_checkpoint_id IS NULL", (run.notes["threads"][0],))
    assert roots == 1
