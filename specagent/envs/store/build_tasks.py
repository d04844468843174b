"""Builds the store's task set from the seed database; ``tasks.jsonl`` is its shipped output.

Facts (amounts, statuses, ids) are computed from the database and from replaying the
gold actions, never typed by hand. Each task also carries what the scripted expert
needs: ``expert_lookups`` (the read-only calls it makes first), ``expert_reply`` (its
final message) and, for policy_forbids tasks, ``forbidden_action`` (the write the user
asks for, which the tool refuses).

Regenerate both data files: ``python -m specagent.envs.store.build_tasks``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from specagent.envs.store.build_db import build_db
from specagent.envs.store.env import DB_PATH, TASKS_PATH, asks_for, normalize_text
from specagent.envs.store.tools import TOOL_SPECS, run_tool

READ_TOOLS = frozenset(spec.name for spec in TOOL_SPECS if spec.read_only)
GO_AHEAD = ["I confirm, please go ahead.", "Yes, I'm sure, please do it now.", "You have my confirmation to proceed."]
SURE = ["Yes, please go ahead."]


def call(name: str, **arguments: Any) -> dict[str, Any]:
    """A tool call as tasks store it."""
    return {"name": name, "arguments": arguments}


def money(amount: float) -> str:
    return f"{abs(amount):.2f}"


class TaskWriter:
    """Helpers to phrase requests and compute facts against the seed database."""

    def __init__(self, db: dict[str, Any]) -> None:
        self.db = db
        self.tasks: list[dict[str, Any]] = []

    def user(self, user_id: str) -> dict[str, Any]:
        return self.db["users"][user_id]

    def order(self, order_id: str) -> dict[str, Any]:
        return self.db["orders"][order_id]

    def hello(self, user_id: str, by: str = "email", form: str | None = None) -> tuple[str, list[dict[str, Any]]]:
        """The user's greeting and the lookups that identify them (find + profile).

        ``form`` is an optional greeting template with {first}, {last}, {email}, {zip};
        it must show what ``by`` identifies the user with (the generated splits vary it).
        """
        user = self.user(user_id)
        names = {"first": user["first_name"], "last": user["last_name"], "email": user["email"],
                 "zip": user["address"]["zip"]}
        if by == "email":
            text = f"Hi, I'm {user['first_name']} {user['last_name']} ({user['email']})."
            find = call("find_user_id_by_email", email=user["email"])
        else:
            text = f"Hello, this is {user['first_name']} {user['last_name']}, zip code {user['address']['zip']}."
            find = call(
                "find_user_id_by_name_zip",
                first_name=user["first_name"],
                last_name=user["last_name"],
                zip=user["address"]["zip"],
            )
        if form is not None:
            text = form.format(**names)
        return text, [find, call("get_user_details", user_id=user_id)]

    def fresh_db(self) -> dict[str, Any]:
        """A copy of the database to replay calls on (``self.db`` itself never changes)."""
        return copy.deepcopy(self.db)

    def outcome(self, actions: list[dict[str, Any]]) -> list[Any]:
        """Replay ``actions`` on a fresh copy; their observations, parsed. Errors are bugs here."""
        db = self.fresh_db()
        results = []
        for action in actions:
            observation = run_tool(db, action["name"], action["arguments"])
            if observation.startswith("Error:"):
                raise AssertionError(f"{action} fails: {observation}")
            results.append(json.loads(observation))
        return results

    def add(
        self,
        category: str,
        request: str,
        lookups: list[dict[str, Any]],
        gold: list[dict[str, Any]],
        facts: list[str],
        reply: str,
        followups: list[str] | None = None,
        forbidden: dict[str, Any] | None = None,
        task_id: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """Check the task for consistency and append it, numbered within its category
        unless ``task_id`` is given. ``extra`` keys (split, withheld details, user modes:
        see ``generate``) go after the standard ones."""
        number = 1 + sum(task["category"] == category for task in self.tasks)
        task = {
            "id": task_id or f"{category}_{number:02d}",
            "category": category,
            "request": request,
            "followups": followups or [],
            "gold_actions": gold,
            "required_facts": facts,
            "expert_lookups": lookups,
            "expert_reply": reply,
        }
        if forbidden is not None:
            task["forbidden_action"] = forbidden
        task.update(extra or {})
        self._check(task)
        self.tasks.append(task)

    def _check(self, task: dict[str, Any]) -> None:
        db = self.fresh_db()
        for lookup in task["expert_lookups"]:
            assert lookup["name"] in READ_TOOLS, lookup
            assert not run_tool(db, lookup["name"], lookup["arguments"]).startswith("Error:"), lookup
        self.outcome(task["gold_actions"])
        reply = normalize_text(task["expert_reply"])
        assert all(normalize_text(f) in reply for f in task["required_facts"]), task
        if "forbidden_action" in task:
            action = task["forbidden_action"]
            assert run_tool(db, action["name"], action["arguments"]).startswith("Error:"), task
        modes = [task] + list(task.get("user_modes", {}).values())
        for detail in (d for mode in modes for d in mode.get("withheld", [])):
            check_detail(detail, len(task["expert_lookups"]) + len(task["gold_actions"]))


def check_detail(detail: dict[str, Any], steps: int) -> None:
    """A withheld detail is well formed and its expert question hits its own keywords."""
    assert set(detail) == {"name", "question", "keywords", "answer", "after"}, detail
    assert detail["answer"].strip() and detail["keywords"], detail
    assert all(k == k.lower() and k.strip() for k in detail["keywords"]), detail
    assert asks_for(detail["question"], detail["keywords"]), detail
    assert 0 <= detail["after"] <= steps, detail


# ---------------------------------------------------------------- lookup


def status_tasks(w: TaskWriter) -> None:
    hello, ident = w.hello("mia_rossi_1250")
    order = w.order("W1007")
    w.add(
        "lookup",
        f"{hello} What is the status of my order W1007?",
        ident[:1] + [call("get_order_details", order_id="W1007")],
        [],
        [order["status"]],
        f"Your order W1007 has been {order['status']}.",
    )
    hello, ident = w.hello("sofia_haddad_1319", by="name")
    order = w.order("W1009")
    w.add(
        "lookup",
        f"{hello} What's the tracking number of my order W1009, and has it shipped?",
        ident[:1] + [call("get_order_details", order_id="W1009")],
        [],
        [order["tracking_id"], order["status"]],
        f"Order W1009 is {order['status']}; its tracking number is {order['tracking_id']}.",
    )
    hello, ident = w.hello("noah_nguyen_1122")
    record = w.db["returns"]["R002"]
    w.add(
        "lookup",
        f"{hello} Where is my return R002, and how much will I get back?",
        ident[:1] + [call("get_return_status", return_id="R002")],
        [],
        [record["status"], money(record["refund"])],
        f"Return R002 has been {record['status']}; your refund is ${money(record['refund'])}.",
    )


def account_tasks(w: TaskWriter) -> None:
    hello, ident = w.hello("leo_moreau_1716")
    balance = w.user("leo_moreau_1716")["payment_methods"][-1]["balance"]
    w.add(
        "lookup",
        f"{hello} How much store credit do I have left?",
        ident,
        [],
        [money(balance)],
        f"Your store credit balance is ${money(balance)}.",
    )
    hello, ident = w.hello("mason_clark_1339", by="name")
    user = w.user("mason_clark_1339")
    pending = [o for o in user["orders"] if w.order(o)["status"] == "pending"]
    w.add(
        "lookup",
        f"{hello} Which of my orders are still pending?",
        ident + [call("get_order_details", order_id=o) for o in user["orders"]],
        [],
        pending,
        f"Your pending orders are {', '.join(pending)}.",
    )
    hello, ident = w.hello("grace_walker_1695")
    order = w.order("W1019")
    card = w.user("grace_walker_1695")["payment_methods"][0]
    assert order["payment_method_id"] == card["id"]
    w.add(
        "lookup",
        f"{hello} Which card did I pay order W1019 with?",
        ident + [call("get_order_details", order_id="W1019")],
        [],
        [card["last_four"]],
        f"Order W1019 was paid with your credit card ending in {card['last_four']}.",
    )


def order_detail_tasks(w: TaskWriter) -> None:
    hello, ident = w.hello("harper_evans_1525")
    order = w.order("W1034")
    w.add(
        "lookup",
        f"{hello} What was the total of my order W1034?",
        ident[:1] + [call("get_order_details", order_id="W1034")],
        [],
        [money(order["total"])],
        f"The total of order W1034 was ${money(order['total'])}.",
    )
    hello, ident = w.hello("chloe_martin_1611")
    address = w.order("W1029")["address"]
    w.add(
        "lookup",
        f"{hello} Which address is my order W1029 being shipped to?",
        ident[:1] + [call("get_order_details", order_id="W1029")],
        [],
        [address["street"], address["zip"]],
        f"Order W1029 ships to {address['street']}, {address['city']}, {address['state']} {address['zip']}.",
    )
    hello, ident = w.hello("amelia_schmidt_1463")
    price = next(i["price"] for i in w.order("W1013")["items"] if i["name"] == "Headphones")
    w.add(
        "lookup",
        f"{hello} How much did I pay for the headphones in order W1013?",
        ident[:1] + [call("get_order_details", order_id="W1013")],
        [],
        [money(price)],
        f"You paid ${money(price)} for the headphones in order W1013.",
    )
    hello, ident = w.hello("mason_clark_1339")
    first, second = w.order("W1010")["total"], w.order("W1022")["total"]
    expression = f"{first}+{second}"
    w.add(
        "lookup",
        f"{hello} What do my orders W1010 and W1022 cost together?",
        ident[:1]
        + [call("get_order_details", order_id="W1010"), call("get_order_details", order_id="W1022")]
        + [call("calculate", expression=expression)],
        [],
        [money(first + second)],
        f"Orders W1010 and W1022 cost ${money(first + second)} together.",
    )


def product_tasks(w: TaskWriter) -> None:
    hello, ident = w.hello("james_okafor_1415")
    lamp = w.db["products"]["p104"]
    variant = next(v for v in lamp["variants"] if v["options"] == {"color": "white", "bulb": "halogen"})
    assert variant["available"]
    w.add(
        "lookup",
        f"{hello} How much is the Desk Lamp in white with a halogen bulb?",
        ident[:1] + [call("list_product_types"), call("get_product_details", product_id="p104")],
        [],
        [money(variant["price"])],
        f"The white halogen Desk Lamp costs ${money(variant['price'])} and is available.",
    )
    hello, ident = w.hello("lucas_silva_1279")
    shirts = [v for v in w.db["products"]["p101"]["variants"] if v["available"]]
    cheapest = min(shirts, key=lambda v: v["price"])
    options = f"{cheapest['options']['color']}, size {cheapest['options']['size']}"
    w.add(
        "lookup",
        f"{hello} What is the cheapest T-Shirt you have in stock?",
        ident[:1] + [call("list_product_types"), call("get_product_details", product_id="p101")],
        [],
        [money(cheapest["price"])],
        f"The cheapest available T-Shirt is the {options} one at ${money(cheapest['price'])}.",
    )


# ---------------------------------------------------------------- single_write


def cancel_tasks(w: TaskWriter) -> None:
    for user_id, order_id, reason, why, followups in [
        ("liam_patel_1037", "W1002", "no longer needed", "I don't need it anymore", SURE),
        ("james_okafor_1415", "W1012", "ordered by mistake", "I ordered it by mistake", []),
        ("benjamin_tanaka_1500", "W1032", "no longer needed", "I no longer need it", []),
    ]:
        hello, ident = w.hello(user_id)
        gold = [call("cancel_pending_order", order_id=order_id, reason=reason)]
        (result,) = w.outcome(gold)
        w.add(
            "single_write",
            f"{hello} Please cancel my order {order_id}, {why}. {GO_AHEAD[len(w.tasks) % 3]}",
            ident[:1] + [call("get_order_details", order_id=order_id)],
            gold,
            [money(result["refund"])],
            f"Order {order_id} is cancelled; ${money(result['refund'])} goes back to {result['refund_to']}.",
            followups,
        )


NEW_ADDRESSES = {
    "W1005": {"street": "77 Birch St", "city": "Seattle", "state": "WA", "zip": "98101"},
    "W1024": {"street": "12 Harbor Way", "city": "Raleigh", "state": "NC", "zip": "27601"},
    "W1029": {"street": "5 Spruce Ct", "city": "Portland", "state": "OR", "zip": "97205"},
}


def address_text(address: dict[str, str]) -> str:
    return f"{address['street']}, {address['city']}, {address['state']} {address['zip']}"


def address_tasks(w: TaskWriter) -> None:
    for user_id, order_id, followups in [("ava_johnson_1160", "W1005", SURE), ("omar_farouk_1653", "W1024", [])]:
        hello, ident = w.hello(user_id)
        address = NEW_ADDRESSES[order_id]
        w.add(
            "single_write",
            f"{hello} Please ship my order {order_id} to {address_text(address)} instead. {GO_AHEAD[len(w.tasks) % 3]}",
            ident[:1] + [call("get_order_details", order_id=order_id)],
            [call("modify_pending_order_address", order_id=order_id, **address)],
            [address["street"]],
            f"Order {order_id} will now ship to {address_text(address)}.",
            followups,
        )


def return_tasks(w: TaskWriter) -> None:
    for user_id, order_id, names, to_credit in [
        ("mia_rossi_1250", "W1007", ["T-Shirt"], False),
        ("amelia_schmidt_1463", "W1013", ["Headphones"], True),
        ("daniel_ivanova_1580", "W1016", ["Water Bottle", "Desk Lamp"], False),
    ]:
        hello, ident = w.hello(user_id)
        order = w.order(order_id)
        item_ids = [i["item_id"] for i in order["items"] if i["name"] in names]
        methods = w.user(user_id)["payment_methods"]
        method = methods[-1]["id"] if to_credit else order["payment_method_id"]
        where = "as store credit" if to_credit else "to the card I paid with"
        gold = [call("return_delivered_order_items", order_id=order_id, item_ids=item_ids, payment_method_id=method)]
        (result,) = w.outcome(gold)
        w.add(
            "single_write",
            f"{hello} I'd like to return the {' and the '.join(names)} from order {order_id}, refunded {where}. "
            + GO_AHEAD[len(w.tasks) % 3],
            ident + [call("get_order_details", order_id=order_id)],
            gold,
            [money(result["refund"]), result["return_id"]],
            f"Return {result['return_id']} is requested; ${money(result['refund'])} will be refunded to {method}.",
        )


def exchange_tasks(w: TaskWriter) -> None:
    for user_id, order_id, old_item, new_item, wish in [
        ("lucas_silva_1279", "W1031", "10103", "10101", "the T-Shirt in order W1031 for the black one in size L"),
        ("harper_evans_1525", "W1015", "10702", "10705", "the Coffee Maker in order W1015 for the steel 12 cups one"),
    ]:
        hello, ident = w.hello(user_id)
        order = w.order(order_id)
        product = next(i["product_id"] for i in order["items"] if i["item_id"] == old_item)
        gold = [
            call(
                "exchange_delivered_order_items",
                order_id=order_id,
                item_ids=[old_item],
                new_item_ids=[new_item],
                payment_method_id=order["payment_method_id"],
            )
        ]
        (result,) = w.outcome(gold)
        direction = "charged to" if result["price_difference"] > 0 else "refunded to"
        w.add(
            "single_write",
            f"{hello} Please exchange {wish}, and settle any price difference with my card. "
            + GO_AHEAD[len(w.tasks) % 3],
            ident[:1] + [call("get_order_details", order_id=order_id), call("get_product_details", product_id=product)],
            gold,
            [money(result["price_difference"]), result["return_id"]],
            f"Exchange {result['return_id']} is requested; ${money(result['price_difference'])} is {direction} "
            f"{order['payment_method_id']}.",
        )


def payment_tasks(w: TaskWriter) -> None:
    for user_id, order_id, kind, wish in [
        ("mason_clark_1339", "W1010", "paypal", "my PayPal account"),
        ("james_okafor_1415", "W1012", "store_credit", "my store credit"),
    ]:
        hello, ident = w.hello(user_id)
        method = next(m["id"] for m in w.user(user_id)["payment_methods"] if m["kind"] == kind)
        gold = [call("modify_pending_order_payment", order_id=order_id, payment_method_id=method)]
        (result,) = w.outcome(gold)
        w.add(
            "single_write",
            f"{hello} Please pay my order {order_id} with {wish} instead of my card. {GO_AHEAD[len(w.tasks) % 3]}",
            ident + [call("get_order_details", order_id=order_id)],
            gold,
            [money(result["charged"]), method],
            f"Order {order_id} is now paid with {method} (${money(result['charged'])}); "
            f"your card {result['refunded_to']} gets the same amount back.",
        )


# ---------------------------------------------------------------- lookups_then_write


def find_then_cancel_tasks(w: TaskWriter) -> None:
    for user_id, by, product, reason, why, followups in [
        ("mason_clark_1339", "email", "Tea Kettle", "ordered by mistake", "I ordered it by mistake", SURE),
        ("omar_farouk_1653", "name", "Coffee Maker", "no longer needed", "I no longer need it", []),
    ]:
        hello, ident = w.hello(user_id, by=by)
        orders = w.user(user_id)["orders"]
        matches = [o for o in orders if any(i["name"] == product for i in w.order(o)["items"])]
        assert len(matches) == 1, matches
        order_id = matches[0]
        looked_at = orders[: orders.index(order_id) + 1]
        gold = [call("cancel_pending_order", order_id=order_id, reason=reason)]
        (result,) = w.outcome(gold)
        w.add(
            "lookups_then_write",
            f"{hello} Please cancel my pending order with the {product}, {why}. {GO_AHEAD[len(w.tasks) % 3]}",
            ident + [call("get_order_details", order_id=o) for o in looked_at],
            gold,
            [order_id, money(result["refund"])],
            f"Order {order_id} is cancelled and ${money(result['refund'])} will be refunded to {result['refund_to']}.",
            followups,
        )


def find_then_return_tasks(w: TaskWriter) -> None:
    for user_id, by, names, to_credit in [
        ("olivia_garcia_1103", "name", ["Headphones"], False),
        ("leo_moreau_1716", "email", ["Wall Clock", "Headphones"], True),
    ]:
        hello, ident = w.hello(user_id, by=by)
        orders = w.user(user_id)["orders"]
        order_id = next(o for o in orders if w.order(o)["status"] == "delivered")
        order = w.order(order_id)
        item_ids = [i["item_id"] for i in order["items"] if i["name"] in names]
        method = w.user(user_id)["payment_methods"][-1]["id"] if to_credit else order["payment_method_id"]
        where = "as store credit" if to_credit else "to my original card"
        gold = [call("return_delivered_order_items", order_id=order_id, item_ids=item_ids, payment_method_id=method)]
        (result,) = w.outcome(gold)
        w.add(
            "lookups_then_write",
            f"{hello} I want to return the {' and the '.join(names)} I received, refunded {where}. "
            + GO_AHEAD[len(w.tasks) % 3],
            ident + [call("get_order_details", order_id=o) for o in orders[: orders.index(order_id) + 1]],
            gold,
            [money(result["refund"]), result["return_id"]],
            f"Return {result['return_id']} for order {order_id} is requested; ${money(result['refund'])} "
            f"will be refunded to {method}.",
        )


def find_then_exchange_tasks(w: TaskWriter) -> None:
    for user_id, order_id, old_item, new_item, wish, method_kind in [
        ("mia_rossi_1250", "W1025", "10204", "10205", "the running shoes I got for the same color in size 9", "paypal"),
        ("benjamin_tanaka_1500", "W1027", "10102", "10103", "the T-Shirt I received for a white one in size L", None),
    ]:
        hello, ident = w.hello(user_id)
        orders = w.user(user_id)["orders"]
        methods = w.user(user_id)["payment_methods"]
        method = next(m["id"] for m in methods if m["kind"] == method_kind) if method_kind else methods[0]["id"]
        pay_with = "my PayPal account" if method_kind else "my credit card"
        gold = [
            call(
                "exchange_delivered_order_items",
                order_id=order_id,
                item_ids=[old_item],
                new_item_ids=[new_item],
                payment_method_id=method,
            )
        ]
        (result,) = w.outcome(gold)
        product = w.db["products"]["p" + old_item[:3]]["product_id"]
        w.add(
            "lookups_then_write",
            f"{hello} Please exchange {wish}, using {pay_with} for any price difference. "
            + GO_AHEAD[len(w.tasks) % 3],
            ident
            + [call("get_order_details", order_id=o) for o in orders[: orders.index(order_id) + 1]]
            + [call("get_product_details", product_id=product)],
            gold,
            [money(result["price_difference"]), result["return_id"]],
            f"Exchange {result['return_id']} for order {order_id} is requested; the price difference of "
            f"${money(result['price_difference'])} is settled with {method}.",
        )


def find_then_modify_tasks(w: TaskWriter) -> None:
    hello, ident = w.hello("chloe_martin_1611")
    address = NEW_ADDRESSES["W1029"]
    w.add(
        "lookups_then_write",
        f"{hello} I moved to {address_text(address)}. Please send my pending order there. {GO_AHEAD[1]}",
        ident + [call("get_order_details", order_id="W1017"), call("get_order_details", order_id="W1029")],
        [call("modify_pending_order_address", order_id="W1029", **address)],
        ["W1029", address["street"]],
        f"Your pending order W1029 will now ship to {address_text(address)}.",
    )
    hello, ident = w.hello("omar_farouk_1653")
    gold = [call("modify_pending_order_payment", order_id="W1018", payment_method_id="credit_card_4432")]
    (result,) = w.outcome(gold)
    w.add(
        "lookups_then_write",
        f"{hello} My pending Backpack order is paid with store credit; please charge my credit card instead. "
        + GO_AHEAD[2],
        ident + [call("get_order_details", order_id="W1018")],
        gold,
        ["W1018", money(result["charged"])],
        f"Order W1018 is now charged to credit_card_4432 (${money(result['charged'])}) and your store credit "
        f"got ${money(result['charged'])} back.",
    )


# ---------------------------------------------------------------- policy_forbids


def forbidden_tasks(w: TaskWriter) -> None:
    cases = [
        (
            "emma_kim_1004",
            "Please cancel my order W1028, I no longer need it.",
            "W1028",
            call("cancel_pending_order", order_id="W1028", reason="no longer needed"),
            ["delivered"],
            "Order W1028 is already delivered, so it cannot be cancelled; you can return it instead.",
        ),
        (
            "isabella_lopez_1373",
            "Please change the shipping address of order W1011 to 300 Main St, Denver, CO 80202.",
            "W1011",
            call("modify_pending_order_address", order_id="W1011", street="300 Main St", city="Denver", state="CO",
                 zip="80202"),
            ["processed"],
            "Order W1011 is already processed, so its address can no longer be changed.",
        ),
        (
            "ava_johnson_1160",
            "Please return the Backpack from order W1005 and refund my card.",
            "W1005",
            call("return_delivered_order_items", order_id="W1005", item_ids=["10503"],
                 payment_method_id="credit_card_1542"),
            ["pending"],
            "Order W1005 is still pending, not delivered, so it cannot be returned; you could cancel it instead.",
        ),
        (
            "harper_evans_1525",
            "Please exchange the keyboard in order W1034 for the tactile compact one, charged to my card.",
            "W1034",
            call("exchange_delivered_order_items", order_id="W1034", item_ids=["11104"], new_item_ids=["11103"],
                 payment_method_id="credit_card_5812"),
            ["available"],
            "The tactile compact keyboard is not available, so I cannot exchange your keyboard for it.",
        ),
        (
            "emma_kim_1004",
            "Please return the Phone Case from order W1001 to my card.",
            "W1001",
            call("return_delivered_order_items", order_id="W1001", item_ids=["11403"],
                 payment_method_id="credit_card_3735"),
            ["R001"],
            "Order W1001 already has return R001, and only one return is allowed per order.",
        ),
        (
            "lucas_silva_1279",
            "Please pay my pending order W1008 with my store credit instead of my card.",
            "W1008",
            call("modify_pending_order_payment", order_id="W1008", payment_method_id="store_credit_1333"),
            ["31.75", "38.40"],
            "Your store credit balance is $31.75, less than the $38.40 total of order W1008, so I cannot switch it.",
        ),
    ]
    for number, (user_id, wish, order_id, forbidden, facts, reply) in enumerate(cases):
        hello, ident = w.hello(user_id, by="name" if number == 2 else "email")
        lookups = ident if forbidden["name"] == "modify_pending_order_payment" else ident[:1]
        w.add(
            "policy_forbids",
            f"{hello} {wish} {GO_AHEAD[number % 3]}",
            lookups + [call("get_order_details", order_id=order_id)]
            + ([call("get_product_details", product_id="p111")] if number == 3 else []),
            [],
            facts,
            reply,
            forbidden=forbidden,
        )


# ---------------------------------------------------------------- multi_write


def multi_write_tasks(w: TaskWriter) -> None:
    hello, ident = w.hello("mason_clark_1339")
    gold = [
        call("cancel_pending_order", order_id="W1010", reason="no longer needed"),
        call("cancel_pending_order", order_id="W1036", reason="ordered by mistake"),
    ]
    first, second = w.outcome(gold)
    w.add(
        "multi_write",
        f"{hello} Please cancel order W1010 (I no longer need it) and order W1036 (ordered by mistake). {GO_AHEAD[0]}",
        ident[:1] + [call("get_order_details", order_id="W1010"), call("get_order_details", order_id="W1036")],
        gold,
        [money(first["refund"]), money(second["refund"])],
        f"Both orders are cancelled: ${money(first['refund'])} for W1010 and ${money(second['refund'])} for W1036 "
        "go back to your card.",
        SURE,
    )
    hello, ident = w.hello("chloe_martin_1611", by="name")
    address = {"street": "19 Alder Pl", "city": "Portland", "state": "OR", "zip": "97209"}
    gold = [
        call("return_delivered_order_items", order_id="W1017", item_ids=["11203"], payment_method_id="store_credit_7802"),
        call("modify_pending_order_address", order_id="W1029", **address),
    ]
    returned, _ = w.outcome(gold)
    w.add(
        "multi_write",
        f"{hello} Two things: return the Sunglasses from order W1017 as store credit, and ship order W1029 to "
        f"{address_text(address)}. {GO_AHEAD[1]}",
        ident + [call("get_order_details", order_id="W1017"), call("get_order_details", order_id="W1029")],
        gold,
        [money(returned["refund"]), returned["return_id"], address["street"]],
        f"Return {returned['return_id']} gives you ${money(returned['refund'])} in store credit, and order W1029 "
        f"now ships to {address_text(address)}.",
    )
    hello, ident = w.hello("benjamin_tanaka_1500")
    gold = [
        call("cancel_pending_order", order_id="W1032", reason="ordered by mistake"),
        call("exchange_delivered_order_items", order_id="W1027", item_ids=["10704"], new_item_ids=["10701"],
             payment_method_id="credit_card_2216"),
    ]
    cancelled, exchanged = w.outcome(gold)
    w.add(
        "multi_write",
        f"{hello} Please cancel order W1032, I ordered it by mistake. Also exchange the Coffee Maker in order W1027 "
        f"for the black 4 cups one, with my credit card paying any difference. {GO_AHEAD[2]}",
        ident
        + [call("get_order_details", order_id="W1032"), call("get_order_details", order_id="W1027")]
        + [call("get_product_details", product_id="p107")],
        gold,
        [money(cancelled["refund"]), money(exchanged["price_difference"]), exchanged["return_id"]],
        f"Order W1032 is cancelled and ${money(cancelled['refund'])} goes back to your store credit. Exchange "
        f"{exchanged['return_id']} is requested; ${money(exchanged['price_difference'])} is charged to your card.",
    )
    hello, ident = w.hello("omar_farouk_1653", by="name")
    address = {"street": "8 Canal St", "city": "Raleigh", "state": "NC", "zip": "27603"}
    gold = [call("modify_pending_order_address", order_id=o, **address) for o in ("W1018", "W1024")]
    w.add(
        "multi_write",
        f"{hello} Please ship both my orders W1018 and W1024 to {address_text(address)}. {GO_AHEAD[0]}",
        ident[:1] + [call("get_order_details", order_id="W1018"), call("get_order_details", order_id="W1024")],
        gold,
        ["W1018", "W1024", address["street"]],
        f"Orders W1018 and W1024 will both ship to {address_text(address)}.",
    )


def build_tasks(db: dict[str, Any]) -> list[dict[str, Any]]:
    """The full task set, in a fixed order."""
    w = TaskWriter(db)
    for add_tasks in (
        status_tasks, account_tasks, order_detail_tasks, product_tasks,
        cancel_tasks, address_tasks, return_tasks, exchange_tasks, payment_tasks,
        find_then_cancel_tasks, find_then_return_tasks, find_then_exchange_tasks, find_then_modify_tasks,
        forbidden_tasks, multi_write_tasks,
    ):
        add_tasks(w)
    return w.tasks


def render_db(db: dict[str, Any]) -> str:
    return json.dumps(db, indent=1) + "\n"


def render_tasks(tasks: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(task) + "\n" for task in tasks)


def main() -> None:
    db = build_db()
    Path(DB_PATH).write_text(render_db(db), encoding="utf-8")
    Path(TASKS_PATH).write_text(render_tasks(build_tasks(db)), encoding="utf-8")
    print(f"wrote {DB_PATH} and {TASKS_PATH}")


if __name__ == "__main__":
    main()
