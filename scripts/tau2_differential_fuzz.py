#!/usr/bin/env python3
"""Differential check of the retail port against tau2's own code on random tool calls.

A maintainer script, outside the package (like ``tau2_expected_hashes.py``, whose stand-in loader it
uses to run tau2's reference code from ``--reference``). The golden actions exercise few of the
tools' refusals and corners; this draws seeded random sequences of 1 to 8 calls (mostly plausible:
orders in the status the tool wants, items of the order, sometimes twice, replacements of the same
product, the user's payment methods; sometimes not: unknown ids, another user's payment method,
another product's item, an invalid reason, empty lists), runs each call on tau2's in-memory
RetailDB and on the port (each call in its own savepoint, the sequence rolled back), and compares
every return value or error text and the state hash after each sequence.

    python scripts/tau2_differential_fuzz.py --sequences 300 --seed 3

Known and accepted difference: ``calculate`` words the refusal of a malformed expression its own
way (tau2 shows Python's error, such as "'int' object is not callable"); those are counted apart.
Exit status 1 when anything else differs.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import random
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's agentlab
sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg  # noqa: E402
from pydantic import BaseModel  # noqa: E402

import tau2_expected_hashes as gold  # noqa: E402
from agentlab import create_database, drop_database  # noqa: E402
from agentlab.domains.retail import tools  # noqa: E402
from agentlab.domains.retail.export import canonical_hash, export_state, round_floats  # noqa: E402
from agentlab.domains.retail.load import create_schema, load, read_db_json  # noqa: E402

WRITE_BIASED = [
    "cancel_pending_order", "exchange_delivered_order_items", "modify_pending_order_address",
    "modify_pending_order_items", "modify_pending_order_payment", "modify_user_address",
    "return_delivered_order_items", "get_order_details", "find_user_id_by_name_zip", "find_user_id_by_email",
    "get_item_details", "get_product_details", "calculate",
] + ["modify_pending_order_items", "exchange_delivered_order_items", "modify_pending_order_payment",
     "cancel_pending_order"] * 2
EXPRESSIONS = ["1+2*3", "10/4", "(2+3)*4.5", "1/0", "2**10", "abc", "7//2", "()", "(1)(2)", "-5--3", "", "1.5.2"]


class Draw:
    def __init__(self, raw: dict, rng: random.Random):
        self.raw, self.rng = raw, rng
        self.products = raw["products"]
        self.all_items = [i for p in self.products.values() for i in p["variants"]]
        self.order_ids, self.user_ids = list(raw["orders"]), list(raw["users"])
        self.focus: set[str] = set()

    def call(self, db) -> tuple[str, dict]:
        rng = self.rng
        name = rng.choice(WRITE_BIASED)
        want = "delivered" if name in ("exchange_delivered_order_items", "return_delivered_order_items") else "pending"
        pool = [k for k in self.focus if db.orders[k].status == want] or self.order_ids
        order_id = rng.choice(pool if rng.random() < 0.85 else self.order_ids) if rng.random() < 0.97 else "#W0000000"
        order = db.orders.get(order_id)
        user_id = order.user_id if order else rng.choice(self.user_ids)
        methods = list(db.users[user_id].payment_methods)
        pm = rng.choice(methods) if rng.random() < 0.9 else rng.choice(
            [m for u in self.user_ids[:20] for m in self.raw["users"][u]["payment_methods"]])
        items = [i.item_id for i in order.items] if order else ["123"]

        def pick_items():
            k = rng.randint(0, min(3, len(items)))
            ids = rng.sample(items, k) if k else []
            if rng.random() < 0.15 and items:
                ids.append(rng.choice(items))
            return ids

        def replacements(ids):
            out = []
            for item_id in ids:
                item = next((x for x in order.items if x.item_id == item_id), None) if order else None
                if item is not None and rng.random() < 0.93:
                    variants = self.products[item.product_id]["variants"]
                    available = [v for v in variants if variants[v]["available"] and v != item_id]
                    out.append(rng.choice(available if available and rng.random() < 0.85 else list(variants)))
                else:
                    out.append(rng.choice(self.all_items))
            if rng.random() < 0.05:
                out.append(rng.choice(self.all_items))
            return out

        address = dict(address1="1 A St", address2=rng.choice(["", "Apt 2"]), city="X", state="CA", country="USA",
                       zip=str(rng.randint(10000, 99999)))
        if name == "cancel_pending_order":
            return name, dict(order_id=order_id, reason=rng.choice(["no longer needed", "ordered by mistake", "other"]))
        if name in ("exchange_delivered_order_items", "modify_pending_order_items"):
            ids = pick_items()
            return name, dict(order_id=order_id, item_ids=ids, new_item_ids=replacements(ids), payment_method_id=pm)
        if name == "modify_pending_order_address":
            return name, dict(order_id=order_id, **address)
        if name == "modify_pending_order_payment":
            return name, dict(order_id=order_id, payment_method_id=pm)
        if name == "modify_user_address":
            return name, dict(user_id=user_id if rng.random() < 0.95 else "nobody", **address)
        if name == "return_delivered_order_items":
            return name, dict(order_id=order_id, item_ids=pick_items(), payment_method_id=pm)
        if name == "get_order_details":
            return name, dict(order_id=order_id)
        user = db.users[user_id]
        if name == "find_user_id_by_name_zip":
            return name, dict(first_name=user.name.first_name.upper(), last_name=user.name.last_name,
                              zip=user.address.zip if rng.random() < 0.8 else "00000")
        if name == "find_user_id_by_email":
            return name, dict(email=user.email.title() if rng.random() < 0.8 else "x@y.z")
        if name == "get_item_details":
            return name, dict(item_id=rng.choice(self.all_items + ["1"]))
        if name == "get_product_details":
            return name, dict(product_id=rng.choice(list(self.products) + ["1"]))
        return name, dict(expression=rng.choice(EXPRESSIONS))


def dumped(value) -> str:
    return json.dumps(round_floats(value.model_dump() if isinstance(value, BaseModel) else value), sort_keys=True)


async def run(sequences: int, seed: int, reference: Path) -> int:
    data_model, tools_mod = gold.load_tau2(reference, gold.DEFAULT_DATA)
    raw = read_db_json()
    draw = Draw(raw, random.Random(seed))
    url = create_database("retail_fuzz")
    calls = differences = calculate_wording = 0
    try:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            async with conn.transaction():
                await create_schema(conn)
            await load(conn, raw)
            for n in range(sequences):
                toolkit = tools_mod.RetailTools(data_model.RetailDB.model_validate(copy.deepcopy(raw)))
                draw.focus = set(draw.rng.sample(draw.order_ids, 40))  # calls of a sequence meet on these
                async with conn.transaction(force_rollback=True):
                    for _ in range(draw.rng.randint(1, 8)):
                        name, args = draw.call(toolkit.db)
                        try:
                            with warnings.catch_warnings():
                                warnings.simplefilter("ignore", SyntaxWarning)
                                want, want_error = dumped(toolkit.use_tool(name, **args)), None
                        except Exception as exc:  # noqa: BLE001
                            want, want_error = None, str(exc)
                        try:
                            async with conn.transaction():
                                got, got_error = dumped(await tools.call(conn, name, args)), None
                        except Exception as exc:  # noqa: BLE001
                            got, got_error = None, str(exc)
                        calls += 1
                        if (want, want_error) != (got, got_error):
                            if name == "calculate" and want_error and got_error:
                                calculate_wording += 1
                                continue
                            differences += 1
                            print(f"sequence {n}: {name}({args}): tau2 {want_error or want[:160]} | "
                                  f"port {got_error or got[:160]}")
                    if canonical_hash(await export_state(conn)) != canonical_hash(toolkit.db.model_dump()):
                        differences += 1
                        print(f"sequence {n}: the end states differ")
    finally:
        drop_database(url)
    print(f"{sequences} sequences, {calls} calls: {differences} differences "
          f"(and {calculate_wording} malformed calculate expressions refused in other words)")
    return 1 if differences else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reference", type=Path, default=gold.DEFAULT_REFERENCE)
    args = parser.parse_args()
    return asyncio.run(run(args.sequences, args.seed, args.reference))


if __name__ == "__main__":
    sys.exit(main())
