"""Hostile batches of tool calls for the billing tools, as hypothesis strategies (shared by the tests that
throw them at the node: ``test_hostile.py`` and ``core/test_pipelined_equals_reference.py``)."""

from __future__ import annotations

import logging

import pytest
from hypothesis import strategies as st

from agentlab.domains.billing.tools import TOOLS

HOSTILE_TEXT = [
    "42", "1e3", "3.5", "-5", "7'", "12'", "' OR 1=1 --", "1; DROP TABLE customers; --", "$1", "%s", "%(x)s", "{}",
    "\x00", "nul\x00byte", "💸💸", "ʻOkina ñ 中文", "\u202eevil", "2026-02-30", "03/01/2026", "2026-03-01", "NaN",
    "Infinity", "RMA-1042", "a" * 300, "tenant_id", "customers_credit_nonnegative", "postgresql://u:secret@db:5432/x",
    "SELECT * FROM pg_shadow", "\\", "\"", "'", "true", "null", "lone \ud800 surrogate",
]
HOSTILE_KEYS = ["amout_cents", "tenant_id", "id", "customer", "customerId", "amount", "__proto__", "'; --",
                "credit_cents", "", "💸"]

scalars = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**63 - 1, 2**63, -(2**63), 10**30, 1_000_000_000, 1_000_000_001]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=24),
    st.sampled_from(HOSTILE_TEXT),
)
values = st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(st.text(max_size=6), scalars, max_size=2))


def plausible(customer_ids: list[int], *, hostile: bool = True):
    """Arguments for a real tool. Clean: every value well formed, so the batch reaches the SQL and meets
    the database's own refusals (CHECK when credit runs out, UNIQUE on a repeated key, FOREIGN KEY on an
    invented invoice, a customer that does not exist). Hostile: some fields wrong, keys dropped or added."""
    good = {
        "customer_id": st.sampled_from([*customer_ids, 1, 2, 999_999_999]),
        "amount_cents": st.one_of(st.integers(1, 20_000), st.sampled_from([1_000_000_000])),
        "billing_period": st.sampled_from(["2026-03-01", "2026-04-01", "2026-05-01"]),
        "reference": st.sampled_from(["RMA-1", "RMA-2", "TOPUP-1", "A.b_c:d-9"]),
        "reason": st.one_of(st.text(max_size=40), st.sampled_from(HOSTILE_TEXT)) if hostile else st.text(max_size=40),
        "invoice_id": st.one_of(st.none(), st.integers(1, 50), st.sampled_from([7_000_000_000])),
        "from_date": st.sampled_from(["2026-01-01", "2026-06-30"] if hostile else ["2026-01-01"]),
        "to_date": st.sampled_from(["2026-01-31", "2026-06-01"]),
    }
    specs = st.sampled_from(list(TOOLS.values()))
    missing, bad, extra = st.integers(0, 9), st.integers(0, 4), st.integers(0, 7)
    extra_key = st.one_of(st.sampled_from(HOSTILE_KEYS), st.text(max_size=10))

    @st.composite
    def build(draw):
        spec = draw(specs)
        args = {}
        for name in spec.arg_names:
            if hostile and draw(missing) == 0:
                continue  # a missing key
            args[name] = draw(values) if hostile and draw(bad) == 0 else draw(good[name])
        if hostile and draw(extra) == 0:
            args[draw(extra_key)] = draw(values)
        return spec.name, args

    return build()


def junk():
    name = st.one_of(st.sampled_from(["DropTable", "apply_credit", "ApplyCredit ", "", "SELECT 1", "💸"]),
                     st.text(max_size=12), st.none(), st.integers())
    args = st.one_of(st.dictionaries(st.one_of(st.sampled_from(HOSTILE_KEYS), st.text(max_size=8)), values,
                                     max_size=4), values)
    return st.tuples(name, args)


def batches(customer_ids: list[int]):
    """Half the batches clean (unique ids, well-formed calls: they run SQL), half hostile (odd, missing and
    duplicated ids, unknown tools, hostile arguments)."""
    # strategies are built once: hypothesis is slow to build them inside a draw
    call_id = st.one_of(st.sampled_from(["c1", "c2", "c3", "", None, "c1 ", "💸", "'", "c\x00", "c\ud800", 7]),
                        st.text(max_size=8))
    clean_call = plausible(customer_ids, hostile=False)
    hostile_call = st.one_of(plausible(customer_ids), plausible(customer_ids), junk())
    sizes, modes, coin = st.integers(1, 5), st.integers(0, 3), st.booleans()

    @st.composite
    def build(draw):
        clean = draw(coin)
        calls = []
        for i in range(draw(sizes)):
            name, args = draw(clean_call if clean else hostile_call)
            call = {"name": name, "args": args, "type": "tool_call", "id": f"call_{i}"}
            if not clean:
                mode = draw(modes)
                if mode == 0:
                    call["id"] = draw(call_id)  # duplicates, empty and odd ids
                elif mode == 1 and draw(coin):
                    del call["id"]  # no id at all
            calls.append(call)
        return calls

    return build()


@pytest.fixture(autouse=True)
def quiet_events():
    """Thousands of batches: keep their events out of the log capture (they still go to the events table)."""
    logger = logging.getLogger("agentlab.core.events")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)
