"""Builds the store's seed database, deterministically. ``db.json`` is its shipped output.

Regenerate both shipped data files with ``python -m specagent.envs.store.build_tasks``;
a test checks that the shipped files equal what these builders produce.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

SEED = 20250601

# name, option axes, base price
PRODUCTS: list[tuple[str, dict[str, list[str]], float]] = [
    ("T-Shirt", {"color": ["black", "white", "blue"], "size": ["S", "M", "L"]}, 19.99),
    ("Running Shoes", {"color": ["red", "black", "gray"], "size": ["8", "9", "10"]}, 89.0),
    ("Water Bottle", {"capacity": ["500ml", "1000ml"], "color": ["green", "blue", "silver"]}, 24.5),
    ("Desk Lamp", {"color": ["black", "white"], "bulb": ["LED", "halogen"]}, 45.0),
    ("Backpack", {"color": ["navy", "olive", "black"], "size": ["20L", "30L"]}, 64.99),
    ("Headphones", {"color": ["black", "white"], "type": ["wired", "wireless"]}, 79.0),
    ("Coffee Maker", {"capacity": ["4 cups", "8 cups", "12 cups"], "color": ["black", "steel"]}, 59.9),
    ("Yoga Mat", {"thickness": ["4mm", "6mm"], "color": ["purple", "teal", "gray"]}, 32.0),
    ("Wall Clock", {"style": ["modern", "classic"], "diameter": ["25cm", "35cm"]}, 27.75),
    ("Notebook", {"paper": ["lined", "dotted", "blank"], "size": ["A5", "A4"]}, 9.5),
    ("Mechanical Keyboard", {"switch": ["linear", "tactile", "clicky"], "layout": ["full", "compact"]}, 119.0),
    ("Sunglasses", {"frame": ["black", "tortoise"], "lens": ["polarized", "standard"]}, 54.2),
    ("Umbrella", {"color": ["black", "red", "yellow"], "size": ["compact", "large"]}, 22.0),
    ("Phone Case", {"model": ["X10", "X11", "X12"], "color": ["clear", "black"]}, 15.99),
    ("Tea Kettle", {"capacity": ["1L", "1.7L"], "finish": ["steel", "copper"]}, 38.4),
]

PEOPLE = [
    ("Emma", "Kim"), ("Liam", "Patel"), ("Olivia", "Garcia"), ("Noah", "Nguyen"),
    ("Ava", "Johnson"), ("Ethan", "Brown"), ("Mia", "Rossi"), ("Lucas", "Silva"),
    ("Sofia", "Haddad"), ("Mason", "Clark"), ("Isabella", "Lopez"), ("James", "Okafor"),
    ("Amelia", "Schmidt"), ("Benjamin", "Tanaka"), ("Harper", "Evans"), ("Daniel", "Ivanova"),
    ("Chloe", "Martin"), ("Omar", "Farouk"), ("Grace", "Walker"), ("Leo", "Moreau"),
]

CITIES = [
    ("Austin", "TX"), ("Denver", "CO"), ("Seattle", "WA"), ("Boston", "MA"), ("Phoenix", "AZ"),
    ("Chicago", "IL"), ("Portland", "OR"), ("Atlanta", "GA"), ("Madison", "WI"), ("Raleigh", "NC"),
]

STREETS = ["Oak St", "Maple Ave", "Cedar Ln", "Pine Rd", "Elm St", "Lake Dr", "Hill Ct", "River Rd"]

# 40 orders: the status mix the tasks need
STATUSES = ["pending"] * 13 + ["processed"] * 8 + ["delivered"] * 15 + ["cancelled"] * 4

# (order index among delivered orders, status) of returns already in the seed data
SEED_RETURNS = [(0, "refunded"), (1, "received"), (2, "requested")]


def _products(rng: random.Random) -> dict[str, dict[str, Any]]:
    products = {}
    for index, (name, axes, base) in enumerate(PRODUCTS):
        product_id = f"p{101 + index}"
        combos = list(itertools.product(*axes.values()))
        chosen = sorted(rng.sample(range(len(combos)), min(len(combos), 5)))
        variants = []
        for rank, combo_index in enumerate(chosen):
            price = round(base + rng.choice([0, 0, 2.5, 5, -1.5, 10]), 2)
            variants.append(
                {
                    "item_id": f"{product_id[1:]}{rank + 1:02d}",
                    "options": dict(zip(axes, combos[combo_index])),
                    "price": price,
                    # the first two variants stay available so every product can be exchanged
                    "available": rank < 2 or rng.random() < 0.6,
                }
            )
        products[product_id] = {"product_id": product_id, "name": name, "variants": variants}
    return products


def _user(rng: random.Random, first: str, last: str, number: int) -> dict[str, Any]:
    city, state = rng.choice(CITIES)
    suffix = 1000 + number * 37 + rng.randrange(30)
    card = rng.randrange(1000, 9999)
    methods: list[dict[str, Any]] = [{"id": f"credit_card_{card}", "kind": "credit_card", "last_four": str(card)}]
    if number % 3 == 0:
        methods.append({"id": f"paypal_{rng.randrange(1000, 9999)}", "kind": "paypal"})
    credit = round(rng.choice([0, 10, 25, 40]) + rng.randrange(0, 100) / 4, 2)
    methods.append({"id": f"store_credit_{rng.randrange(1000, 9999)}", "kind": "store_credit", "balance": credit})
    return {
        "user_id": f"{first.lower()}_{last.lower()}_{suffix}",
        "first_name": first,
        "last_name": last,
        "email": f"{first.lower()}.{last.lower()}{suffix % 100}@example.com",
        "address": {
            "street": f"{rng.randrange(10, 999)} {rng.choice(STREETS)}",
            "city": city,
            "state": state,
            "zip": f"{rng.randrange(10000, 99999)}",
        },
        "payment_methods": methods,
        "orders": [],
    }


def _order(rng: random.Random, number: int, user: dict, status: str, products: dict) -> dict[str, Any]:
    chosen = rng.sample(sorted(products), rng.choice([1, 1, 2, 2, 3]))
    items = []
    for product_id in chosen:
        product = products[product_id]
        variant = rng.choice(product["variants"])
        items.append(
            {
                "item_id": variant["item_id"],
                "product_id": product_id,
                "name": product["name"],
                "options": variant["options"],
                "price": variant["price"],
            }
        )
    methods = user["payment_methods"]
    method = methods[-1] if number % 7 == 3 else methods[0]  # a few orders paid with store credit
    total = round(sum(item["price"] for item in items), 2)
    history = [{"type": "payment", "amount": total, "payment_method_id": method["id"]}]
    order: dict[str, Any] = {
        "order_id": f"W{1001 + number}",
        "user_id": user["user_id"],
        "status": status,
        "address": dict(user["address"]),
        "items": items,
        "total": total,
        "payment_method_id": method["id"],
        "payment_history": history,
        "tracking_id": f"TRK{rng.randrange(10**7, 10**8)}" if status in ("processed", "delivered") else None,
        "return_id": None,
    }
    if status == "cancelled":
        order["cancel_reason"] = "no longer needed"
        history.append({"type": "refund", "amount": total, "payment_method_id": method["id"]})
    return order


def _seed_returns(orders: dict[str, dict]) -> dict[str, dict]:
    delivered = [o for o in orders.values() if o["status"] == "delivered"]
    returns = {}
    for number, (index, status) in enumerate(SEED_RETURNS):
        order = delivered[index]
        item = order["items"][0]
        return_id = f"R{number + 1:03d}"
        returns[return_id] = {
            "return_id": return_id,
            "order_id": order["order_id"],
            "kind": "return",
            "item_ids": [item["item_id"]],
            "refund": item["price"],
            "payment_method_id": order["payment_method_id"],
            "status": status,
        }
        order["return_id"] = return_id
    return returns


def build_db() -> dict[str, Any]:
    """The seed database: 20 users, 40 orders, 15 products, 3 returns."""
    rng = random.Random(SEED)
    products = _products(rng)
    users = [_user(rng, first, last, n) for n, (first, last) in enumerate(PEOPLE)]
    statuses = list(STATUSES)
    rng.shuffle(statuses)
    orders = {}
    for number, status in enumerate(statuses):
        user = users[number] if number < len(users) else rng.choice(users)
        order = _order(rng, number, user, status, products)
        orders[order["order_id"]] = order
        user["orders"].append(order["order_id"])
    return {
        "users": {u["user_id"]: u for u in users},
        "orders": orders,
        "products": products,
        "returns": _seed_returns(orders),
    }
