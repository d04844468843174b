"""The store at training scale: an extended database and deterministic task splits.

``extended_db()`` is the seed database (kept exactly) plus ``GENERATED_USERS`` users made
with build_db's helpers, each with 2-4 orders (pending, processed, delivered, cancelled),
some gift cards, PayPal-paid orders and existing returns/exchanges. ``split_tasks(split)``
are the tasks of one split: ``train``, ``calibration`` and ``eval`` (eval also holds the 42
hand-checked tasks). Each generated user belongs to one split (``split_user_ids``), so
splits share no user and no order. Both are built in code at first use and memoised.

Every task has two openings: the ticket one (``request``: identity, request and
confirmation; the multi_turn category leaves out one detail, listed in ``withheld``) and
the multi_turn one (``user_modes.multi_turn``: identity and order ids withheld too). A
withheld detail has the ``question`` the expert asks, the ``keywords`` an agent message
must contain to get the ``answer``, and ``after``: how many expert tool calls come first.

Wording: calibration and eval use greetings training never uses, and half of their
requests use body templates training never uses (the second list of each kind in
``BODIES``: one per kind, so 4-7 per category), so no masked request of theirs equals a
training one. Gift cards carry no balance: the tools treat them like a card.
"""

from __future__ import annotations

import collections
import functools
import pickle
import random
import re
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

from specagent.envs.store import train_wording
from specagent.envs.store.build_db import CITIES, PEOPLE, STREETS, _order, _user, build_db
from specagent.envs.store.build_tasks import GO_AHEAD, TaskWriter, address_text, call, money
from specagent.envs.store.env import (
    ALL_CATEGORIES,
    REQUIRED_KEYS,
    SPLITS,
    TASKS_PATH,
    BaseDB,
    asks_for,
    check_store_task,
)
from specagent.envs.tasks import load_jsonl_tasks

GEN_SEED = 20250602
GENERATED_USERS = 300
# generated user i belongs to SPLIT_CYCLE[i % 6]: 4/6 train, 1/6 calibration, 1/6 eval
SPLIT_CYCLE = ("train", "train", "train", "train", "calibration", "eval")

FIRST_NAMES = [
    "Aiden", "Aria", "Caleb", "Camila", "Dylan", "Elena", "Felix", "Freya", "Gabriel", "Hana",
    "Hugo", "Ines", "Isaac", "Jade", "Jonas", "Kai", "Lara", "Leila", "Marco", "Maya",
    "Nadia", "Nico", "Nora", "Oscar", "Priya", "Rafael", "Rosa", "Samir", "Sara", "Theo",
    "Una", "Victor", "Wren", "Yara", "Zane", "Adele", "Bruno", "Clara", "Diego", "Esme",
]
LAST_NAMES = [
    "Abbott", "Becker", "Castro", "Dubois", "Fischer", "Gomez", "Hughes", "Ito", "Jensen", "Khan",
    "Larsen", "Mendes", "Novak", "Olsen", "Reyes", "Sato", "Torres", "Usman", "Varga", "Weber",
    "Xu", "Zimmer", "Alvarez", "Bianchi", "Chen", "Dimitrov", "Ferreira", "Holm", "Iqbal", "Kowalski",
    "Lindqvist", "Murphy", "Nakamura", "Ortiz", "Petrov", "Quintero", "Romano", "Suzuki", "Vogel", "Wright",
]

# order statuses per generated user (shuffled): 2-4 orders, every status the tools care about
STATUS_PATTERNS = [
    ("pending", "delivered"),
    ("pending", "pending", "delivered"),
    ("delivered", "processed", "pending"),
    ("delivered", "delivered", "cancelled", "pending"),
    ("processed", "delivered"),
    ("pending", "cancelled", "delivered"),
    ("pending", "pending", "processed", "delivered"),
    ("delivered", "pending"),
]
RETURN_STATUSES = ("requested", "received", "refunded")
EXCHANGE_STATUSES = ("requested", "received", "shipped")


# ---------------------------------------------------------------- the extended database


def _name_pairs(rng: random.Random, count: int) -> list[tuple[str, str]]:
    """``count`` distinct (first, last) pairs, none a seed user's: emails and name+zip stay unique."""
    seed = set(PEOPLE)
    pairs = [(f, l) for f in FIRST_NAMES for l in LAST_NAMES if (f, l) not in seed]
    return rng.sample(pairs, count)


def _pay_with(order: dict[str, Any], method_id: str) -> None:
    """Re-point a freshly made order (and its payment history) at another payment method."""
    order["payment_method_id"] = method_id
    for entry in order["payment_history"]:
        entry["payment_method_id"] = method_id


def _add_user(rng: random.Random, db: dict[str, Any], first: str, last: str, index: int) -> None:
    number = len(PEOPLE) + index  # continues the seed's numbering, so user ids cannot collide
    user = _user(rng, first, last, number)
    if index % 4 == 1:  # a gift card, kept before store credit: _order pays "methods[-1]" = store credit
        user["payment_methods"].insert(-1, {"id": f"gift_card_{rng.randrange(1000, 9999)}", "kind": "gift_card"})
    db["users"][user["user_id"]] = user
    statuses = list(STATUS_PATTERNS[index % len(STATUS_PATTERNS)])
    rng.shuffle(statuses)
    for status in statuses:
        number = len(db["orders"])  # order ids W1041... follow the seed's W1001-W1040
        order = _order(rng, number, user, status, db["products"])
        other = [m["id"] for m in user["payment_methods"] if m["kind"] in ("paypal", "gift_card")]
        if number % 5 == 2 and other:
            _pay_with(order, other[0])
        db["orders"][order["order_id"]] = order
        user["orders"].append(order["order_id"])


def _exchange_variant(db: dict[str, Any], item: dict[str, Any], available: bool) -> dict[str, Any] | None:
    """The first other variant of the item's product with that availability, or None."""
    variants = db["products"][item["product_id"]]["variants"]
    return next((v for v in variants if v["item_id"] != item["item_id"] and v["available"] == available), None)


def _add_returns(db: dict[str, Any], order_ids: list[str]) -> None:
    """Existing returns and exchanges: on every 5th delivered order a return, and an exchange
    on the delivered order two after it (when its first item has another available variant)."""
    delivered = [db["orders"][o] for o in order_ids if db["orders"][o]["status"] == "delivered"]
    for k, order in enumerate(delivered):
        item = order["items"][0]
        target = _exchange_variant(db, item, available=True)
        if k % 5 not in (0, 2) or (k % 5 == 2 and target is None):
            continue
        return_id = f"R{len(db['returns']) + 1:03d}"  # the tools number new returns the same way
        record: dict[str, Any] = {"return_id": return_id, "order_id": order["order_id"], "item_ids": [item["item_id"]]}
        if k % 5 == 0:
            record.update(kind="return", refund=item["price"], payment_method_id=order["payment_method_id"],
                          status=RETURN_STATUSES[k % 3])
        else:
            record.update(kind="exchange", new_item_ids=[target["item_id"]],
                          price_difference=round(target["price"] - item["price"] + 0.0, 2),
                          payment_method_id=order["payment_method_id"], status=EXCHANGE_STATUSES[k % 3])
        db["returns"][return_id] = record
        order["return_id"] = return_id


def build_extended_db() -> dict[str, Any]:
    """The seed database plus ``GENERATED_USERS`` generated users, deterministically."""
    db = build_db()
    rng = random.Random(GEN_SEED)
    seed_orders = set(db["orders"])
    for index, (first, last) in enumerate(_name_pairs(rng, GENERATED_USERS)):
        _add_user(rng, db, first, last, index)
    _add_returns(db, [o for o in db["orders"] if o not in seed_orders])
    return db


@functools.lru_cache(maxsize=None)
def extended_db() -> dict[str, Any]:
    """The extended database, built once per process. Shared: do not modify it."""
    return build_extended_db()


@functools.lru_cache(maxsize=None)
def bases() -> dict[str, BaseDB]:
    """The start states of split episodes: the extended database, and the seed one for the
    hand-checked eval tasks."""
    return {"seed": BaseDB(build_db()), "extended": BaseDB(extended_db())}


def generated_user_ids(db: dict[str, Any]) -> list[str]:
    """The generated users, in the order they were made (they follow the seed's)."""
    return list(db["users"])[len(PEOPLE):]


def split_user_ids(db: dict[str, Any]) -> dict[str, list[str]]:
    """Which users each split owns: the seed users are eval's, generated ones cycle through the splits."""
    owners: dict[str, list[str]] = {split: [] for split in SPLITS}
    owners["eval"] = list(db["users"])[: len(PEOPLE)]
    for index, user_id in enumerate(generated_user_ids(db)):
        owners[SPLIT_CYCLE[index % len(SPLIT_CYCLE)]].append(user_id)
    return owners


# ---------------------------------------------------------------- wording

HELLOS = {  # (train forms, held-out forms) per identity kind; held-out ones only in calibration/eval
    "email": (
        ["Hello, my email is {email}.", "Hi there! This is {first} {last}, my account email is {email}.",
         "Hey, {first} {last} here ({email})."],
        ["Good afternoon, {first} {last} writing; my account is under {email}.", "Hi! You can find me as {email}."],
    ),
    "name": (
        ["Hi, my name is {first} {last} and my zip code is {zip}.", "{first} {last} here, zip {zip}."],
        ["Good morning. I'm {first} {last}, and I live in zip code {zip}."],
    ),
}
NEUTRAL_HELLOS = (["Hi.", "Hello."], ["Good afternoon.", "Hey there."])  # multi_turn openings: no identity
CLOSINGS = (GO_AHEAD, ["Consider this my confirmation.", "I'm sure about this, so please just do it."])
WHY = {
    "no longer needed": ["I don't need it anymore", "I no longer need it", "it isn't needed anymore"],
    "ordered by mistake": ["I ordered it by mistake", "I placed it by accident", "it was a mistake to order it"],
}

IDENTITY_KEYWORDS = ["email", "e-mail", "name", "zip", "identify", "verify"]
ORDER_KEYWORDS = ["order id", "order number", "which order"]
IDENTITY_QUESTIONS = ["Could you give me your email, or your name and zip code?",
                      "Before I look into this, what is your email, or your full name and zip code?"]
IDENTITY_ANSWERS = {"email": ["My email is {email}.", "It's {email}."],
                    "name": ["I'm {first} {last}, zip code {zip}.", "My name is {first} {last} and my zip is {zip}."]}
ORDER_QUESTIONS = (["Which order is this about? Please give me the order id.", "Could you tell me the order number?"],
                   ["Which orders do you mean? Please give me the order ids."])

# body templates per kind: (train, held-out). Slots: order, order2, product, items, why, why2,
# why_cap, address, where, wish, method, return_id, what. Order ids appear as "order {order}"
# (or "my orders {order} and {order2}") so that withhold_orders can take them out.
BODIES: dict[str, tuple[list[str], list[str]]] = {
    # lookup
    "status": (["Can you tell me the current status of my order {order}?",
                "Has my order {order} shipped yet? What's its status?"],
               ["I'd like an update on order {order}: where does it stand?"]),
    "tracking": (["I need the tracking number for my order {order}, and its status please.",
                  "Could you look up the tracking id of my order {order} and tell me if it has shipped?"],
                 ["Please send me the tracking details for order {order}, plus its current status."]),
    "total": (["How much did my order {order} cost in total?", "What's the grand total of my order {order}?"],
              ["Remind me what I paid altogether for order {order}?"]),
    "credit": (["What's my current store credit balance?", "Could you check how much store credit is on my account?"],
               ["I'm curious how much store credit I still have available."]),
    "pending": (["Can you list my orders that haven't shipped yet (still pending)?",
                 "Which of my orders are pending right now?"],
                ["Do I have any pending orders? Please give me their ids."]),
    "item_price": (["What did I pay for the {product} in my order {order}?",
                    "How much did the {product} in my order {order} cost?"],
                   ["Looking at order {order}, what was the price of the {product}?"]),
    "return_status": (["What's the status of my {what} {return_id}?",
                       "Can you check on my {what} {return_id} and the amount involved?"],
                      ["Any news on {what} {return_id}? What status is it in and how much money is involved?"]),
    # single_write
    "cancel": (["Please cancel my order {order}; {why}.", "I want to cancel my order {order} because {why}."],
               ["Kindly call off order {order}, {why}."]),
    "address": (["Please change the shipping address of my order {order} to {address}.",
                 "Could you send my order {order} to {address} instead?"],
                ["I'd like order {order} delivered to {address} rather than the current address."]),
    "return": (["I'd like to return {items} from my order {order}, refunded {where}.",
                "Please process a return of {items} from my order {order}; refund it {where}."],
               ["Could I send back {items} from order {order}? Refund {where}, please."]),
    "exchange": (["Please exchange the {product} from my order {order} for the variant with {wish}, "
                  "using my credit card for any price difference.",
                  "I'd like to swap the {product} in my order {order} for the one with {wish}; "
                  "charge or refund the difference on my credit card."],
                 ["Could the {product} from order {order} be exchanged for the version with {wish}? "
                  "Any difference goes on my credit card."]),
    "payment": (["Please switch the payment of my order {order} to {method}.",
                 "I'd like to pay for my order {order} with {method} instead."],
                ["For order {order}, could you move the payment over to {method}?"]),
    # lookups_then_write
    "find_cancel": (["Please cancel my pending order that has the {product} in it; {why}.",
                     "I want to cancel the order with the {product}, {why}."],
                    ["Could you cancel whichever order of mine contains the {product}? {why_cap}."]),
    "find_return": (["I want to return the {product} I received, refunded {where}.",
                     "The {product} that was delivered to me isn't right; please return it with the refund {where}."],
                    ["Please take back the {product} I got, and send the refund {where}."]),
    "find_exchange": (["Please exchange the {product} I received for the variant with {wish}, "
                       "with my credit card covering any difference.",
                       "The {product} I got isn't what I wanted; I'd like the one with {wish} instead, "
                       "difference on my credit card."],
                      ["Swap the {product} that was delivered to me for the version with {wish} please; "
                       "use my credit card for any difference."]),
    "moved": (["I've moved to {address}. Please update my pending order to ship there.",
               "My new address is {address}; please send my pending order there."],
              ["Since I relocated to {address}, my order that hasn't shipped should go there now."]),
    "find_payment": (["Please pay for my pending order with {method} instead.",
                      "I'd like my pending order charged to {method} rather than the current payment method."],
                     ["Can my order that hasn't shipped yet be paid with {method}?"]),
    # policy_forbids
    "refuse_cancel": (["I need my order {order} cancelled, {why}.", "Cancel my order {order} please; {why}."],
                      ["Is it possible to cancel order {order}? {why_cap}."]),
    "refuse_address": (["Change the delivery address of my order {order} to {address}, please.",
                        "My order {order} should go to {address}; please update it."],
                       ["Could order {order} still be redirected to {address}?"]),
    "refuse_return": (["Please return {items} from my order {order} and refund my original payment method.",
                       "I want to send back {items} from my order {order} for a refund."],
                      ["Can I get a refund for {items} from order {order} by returning it?"]),
    "refuse_second_return": (["I also want to return {items} from my order {order}, refunded to my original "
                              "payment method.", "Please start another return for {items} from my order {order}."],
                             ["One more thing to send back from order {order}: {items}. Please refund it."]),
    "refuse_exchange": (["Please exchange the {product} from my order {order} for the variant with {wish}, "
                         "charged to my credit card.",
                         "I'd like the version with {wish} instead of the {product} in my order {order}; "
                         "use my credit card for the difference."],
                        ["Could you trade the {product} in order {order} for the one with {wish}? "
                         "My credit card can cover the difference."]),
    "refuse_credit": (["Please pay my order {order} with my store credit instead.",
                       "I want to use my store credit for my order {order}."],
                      ["Could my store credit cover order {order} instead of my current payment?"]),
    # multi_write
    "cancel_two": (["Please cancel order {order} ({why}) and order {order2} ({why2}).",
                    "I'd like two cancellations: order {order}, because {why}, and order {order2}, because {why2}."],
                   ["Cancel order {order} since {why}, and also order {order2} since {why2}."]),
    "return_and_address": (["Two requests: return {items} from order {order} with the refund {where}, "
                            "and ship order {order2} to {address}.",
                            "Please return {items} from order {order}, refund {where}; also change the address "
                            "of order {order2} to {address}."],
                           ["I need to send back {items} from order {order} (refund {where}) and to redirect "
                            "order {order2} to {address}."]),
    "cancel_and_exchange": (["Please cancel order {order} because {why}, and exchange the {product} in order "
                             "{order2} for the one with {wish}, with my credit card paying any difference.",
                             "Cancel order {order} ({why}) and swap the {product} from order {order2} for the "
                             "variant with {wish}; my credit card covers the difference."],
                            ["I have two requests: order {order} must be cancelled as {why}, and the {product} "
                             "from order {order2} should become the version with {wish}, difference on my "
                             "credit card."]),
    "address_two": (["Send my orders {order} and {order2} to {address}, please.",
                     "Update the delivery address of order {order} and order {order2} to {address}."],
                    ["I'd like order {order} as well as order {order2} redirected to {address}."]),
    # multi_turn: each leaves out one detail
    "ask_which_order": (["Please cancel one of my pending orders; {why}.",
                         "I need to cancel a pending order of mine because {why}."],
                        ["One of my orders that hasn't shipped should be cancelled, {why}."]),
    "ask_address": (["Please change the shipping address of my order {order}; I have a new address.",
                     "I've moved and need my order {order} sent to my new address."],
                    ["My order {order} should go to my new place instead."]),
    "ask_refund": (["I'd like to return {items} from my order {order}.",
                    "Please set up a return for {items} from my order {order}."],
                   ["I'm sending back {items} from order {order}."]),
    "ask_variant": (["I'd like to exchange the {product} from my order {order} for a different variant; "
                     "my credit card can cover any difference.",
                     "Please swap the {product} in my order {order} for another version, settling any "
                     "difference with my credit card."],
                    ["The {product} from order {order} isn't right; I want a different variant, difference "
                     "on my credit card."]),
    "ask_payment": (["Please change the payment method of my order {order}.",
                     "I'd like to pay for my order {order} differently."],
                    ["I would like order {order} to be paid another way."]),
}

_TWO_ORDERS = re.compile(r"\b(?:both )?(?:my )?orders? (W\d{4}) and (?:my )?(?:order )?(W\d{4})")
_MY_ORDER = re.compile(r"\b([Mm]y) ((?:pending |delivered )?)order (W\d{4})")
_ORDER = re.compile(r"\border (W\d{4})")


def withhold_orders(text: str) -> str:
    """``text`` without its order ids, phrased as a user who has not said them would."""
    text = _TWO_ORDERS.sub("two of my orders", text)
    text = _MY_ORDER.sub(r"\1 \2order", text)
    first = True

    def one_then_another(match: re.Match[str]) -> str:
        nonlocal first
        said, first = ("one of my orders" if first else "another order"), False
        return said

    text = _ORDER.sub(one_then_another, text)
    assert not re.search(r"\bW\d{4}\b", text), text
    return text


def _pick(options: list[str], text: str) -> str:
    """A variant chosen by the text it belongs to, so tasks with the same opening ask alike."""
    return options[zlib.crc32(text.encode("utf-8")) % len(options)]


def _detail(name: str, question: str, keywords: list[str], answer: str, after: int) -> dict[str, Any]:
    return {"name": name, "question": question, "keywords": keywords, "answer": answer, "after": after}


def identity_detail(opening: str, by: str, names: dict[str, str], rng: random.Random) -> dict[str, Any]:
    """Who the user is, asked for first (before any tool call)."""
    answer = rng.choice(IDENTITY_ANSWERS[by]).format(**names)
    return _detail("identity", _pick(IDENTITY_QUESTIONS, opening), IDENTITY_KEYWORDS, answer, 0)


def order_detail(opening: str, orders: list[str], rng: random.Random) -> dict[str, Any]:
    """The order ids the request named, asked for once the user is found (after one call)."""
    if len(orders) == 1:
        answer = rng.choice(["It's order {}.", "The order id is {}."]).format(orders[0])
    else:
        answer = f"They are orders {' and '.join(orders)}, in the order I mentioned them."
    return _detail("order", _pick(ORDER_QUESTIONS[len(orders) > 1], opening), ORDER_KEYWORDS, answer, 1)


# ---------------------------------------------------------------- what a task kind produces


@dataclass
class Draft:
    """One task before its wording: what the user wants, what the expert does and says."""

    slots: dict[str, str]  # body template values
    lookups: list[dict[str, Any]]  # read-only calls after identifying the user (and the profile)
    gold: list[dict[str, Any]]
    facts: list[str]
    reply: str
    orders: list[str] = field(default_factory=list)  # order ids the request names, in order
    profile: bool = False  # whether the expert reads the user's details (payment methods, orders)
    ask: dict[str, Any] | None = None  # multi_turn category: the missing detail (question, keywords, answer)
    forbidden: dict[str, Any] | None = None


Maker = Callable[[TaskWriter, str, random.Random], "Draft | None"]


def _orders(w: TaskWriter, user_id: str, *statuses: str) -> list[dict[str, Any]]:
    orders = [w.order(o) for o in w.user(user_id)["orders"]]
    return [o for o in orders if not statuses or o["status"] in statuses]


def _returnable(w: TaskWriter, user_id: str) -> list[dict[str, Any]]:
    return [o for o in _orders(w, user_id, "delivered") if o["return_id"] is None]


def _method(w: TaskWriter, user_id: str, kind: str) -> dict[str, Any] | None:
    return next((m for m in w.user(user_id)["payment_methods"] if m["kind"] == kind), None)


def _items_text(items: list[dict[str, Any]]) -> str:
    return " and ".join(f"the {i['name']}" for i in items)


def _wish(options: dict[str, str]) -> str:
    return " and ".join(f"{axis} {value}" for axis, value in options.items())


def _method_text(method: dict[str, Any]) -> str:
    return {"credit_card": f"my credit card ending in {method.get('last_four')}", "paypal": "my PayPal account",
            "gift_card": "my gift card", "store_credit": "my store credit"}[method["kind"]]


def _where(w: TaskWriter, order: dict[str, Any], to_credit: bool) -> str:
    """How the user says where a refund goes."""
    kind = next(m["kind"] for m in w.user(order["user_id"])["payment_methods"] if m["id"] == order["payment_method_id"])
    if to_credit or kind == "store_credit":
        return "as store credit"
    return {"credit_card": "to the card I paid with", "paypal": "to my PayPal account",
            "gift_card": "to my gift card"}[kind]


def _reason(rng: random.Random) -> tuple[str, str]:
    reason = rng.choice(sorted(WHY))
    return reason, rng.choice(WHY[reason])


def _new_address(rng: random.Random, current: dict[str, str]) -> dict[str, str]:
    while True:
        city, state = rng.choice(CITIES)
        address = {"street": f"{rng.randrange(10, 999)} {rng.choice(STREETS)}", "city": city, "state": state,
                   "zip": f"{rng.randrange(10000, 99999)}"}
        if address["street"] != current["street"]:
            return address


def _payment_targets(w: TaskWriter, order: dict[str, Any]) -> list[dict[str, Any]]:
    """Methods the order could switch to: another one, store credit only if it covers the total."""
    return [m for m in w.user(order["user_id"])["payment_methods"] if m["id"] != order["payment_method_id"]
            and (m["kind"] != "store_credit" or m["balance"] >= order["total"])]


def _exchangeable(w: TaskWriter, order: dict[str, Any], available: bool = True) -> list[tuple[dict, dict]]:
    """(item, other variant of its product with that availability) pairs of an order."""
    pairs = [(i, _exchange_variant(w.db, i, available)) for i in order["items"]]
    return [(i, v) for i, v in pairs if v is not None]


def _only_order_with(
    w: TaskWriter, user_id: str, rng: random.Random, test: Callable[[dict], bool]
) -> tuple[dict[str, Any], dict[str, Any], list[str]] | None:
    """(order, item) where the item's product is in exactly one of the user's orders and that
    order passes ``test``; plus the orders the expert reads to find it. None if there is none."""
    orders = _orders(w, user_id)
    counts: dict[str, int] = {}
    for order in orders:
        for item in order["items"]:
            counts[item["name"]] = counts.get(item["name"], 0) + 1
    choices = [(o, i) for o in orders if test(o) for i in o["items"] if counts[i["name"]] == 1]
    if not choices:
        return None
    order, item = rng.choice(choices)
    return order, item, [o["order_id"] for o in orders[: orders.index(order) + 1]]


def _get(order_id: str) -> dict[str, Any]:
    return call("get_order_details", order_id=order_id)


# ---------------------------------------------------------------- lookup


def make_status(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    order = rng.choice(_orders(w, user_id))
    oid = order["order_id"]
    return Draft({"order": oid}, [_get(oid)], [], [order["status"]], f"Order {oid} is currently {order['status']}.",
                 [oid])


def make_tracking(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    orders = _orders(w, user_id, "processed", "delivered")
    if not orders:
        return None
    order = rng.choice(orders)
    oid, track = order["order_id"], order["tracking_id"]
    return Draft({"order": oid}, [_get(oid)], [], [track, order["status"]],
                 f"Order {oid} is {order['status']}; its tracking number is {track}.", [oid])


def make_total(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    order = rng.choice(_orders(w, user_id))
    oid, total = order["order_id"], money(order["total"])
    return Draft({"order": oid}, [_get(oid)], [], [total], f"Order {oid} came to ${total} in total.", [oid])


def make_credit(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    balance = money(_method(w, user_id, "store_credit")["balance"])
    return Draft({}, [], [], [balance], f"You have ${balance} in store credit.", profile=True)


def make_pending(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    pending = [o["order_id"] for o in _orders(w, user_id, "pending")]
    if not pending:
        return None
    lookups = [_get(o) for o in w.user(user_id)["orders"]]
    return Draft({}, lookups, [], pending, f"Your pending orders are: {', '.join(pending)}.", profile=True)


def make_item_price(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    order = rng.choice(_orders(w, user_id))
    item = rng.choice(order["items"])
    oid, price = order["order_id"], money(item["price"])
    return Draft({"order": oid, "product": item["name"]}, [_get(oid)], [], [price],
                 f"The {item['name']} in order {oid} cost ${price}.", [oid])


def make_return_status(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    records = [w.db["returns"][o["return_id"]] for o in _orders(w, user_id) if o["return_id"]]
    if not records:
        return None
    record = rng.choice(records)
    rid, what = record["return_id"], record["kind"]
    amount = money(record["refund"] if what == "return" else record["price_difference"])
    label = "refund" if what == "return" else "price difference"
    return Draft({"return_id": rid, "what": what}, [call("get_return_status", return_id=rid)], [],
                 [record["status"], amount],
                 f"{what.capitalize()} {rid} is {record['status']}; the {label} is ${amount}.")


# ---------------------------------------------------------------- single_write


def _cancel(w: TaskWriter, order: dict[str, Any], reason: str) -> tuple[list[dict], dict]:
    gold = [call("cancel_pending_order", order_id=order["order_id"], reason=reason)]
    return gold, w.outcome(gold)[0]


def make_cancel(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    pending = _orders(w, user_id, "pending")
    if not pending:
        return None
    order = rng.choice(pending)
    (reason, why), oid = _reason(rng), order["order_id"]
    gold, result = _cancel(w, order, reason)
    refund = money(result["refund"])
    return Draft({"order": oid, "why": why}, [_get(oid)], gold, [refund],
                 f"Order {oid} is cancelled; ${refund} goes back to {result['refund_to']}.", [oid])


def _address_gold(order_id: str, address: dict[str, str]) -> list[dict[str, Any]]:
    return [call("modify_pending_order_address", order_id=order_id, **address)]


def make_address(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    pending = _orders(w, user_id, "pending")
    if not pending:
        return None
    order = rng.choice(pending)
    oid, address = order["order_id"], _new_address(rng, order["address"])
    w.outcome(_address_gold(oid, address))
    return Draft({"order": oid, "address": address_text(address)}, [_get(oid)], _address_gold(oid, address),
                 [address["street"]], f"Order {oid} will now ship to {address_text(address)}.", [oid])


def _return(w: TaskWriter, order: dict[str, Any], items: list[dict], to_credit: bool) -> tuple[list, dict, str]:
    credit = _method(w, order["user_id"], "store_credit")["id"]
    method = credit if to_credit else order["payment_method_id"]
    gold = [call("return_delivered_order_items", order_id=order["order_id"], item_ids=[i["item_id"] for i in items],
                 payment_method_id=method)]
    return gold, w.outcome(gold)[0], method


def make_return(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    orders = _returnable(w, user_id)
    if not orders:
        return None
    order = rng.choice(orders)
    items = rng.sample(order["items"], rng.randint(1, min(2, len(order["items"]))))
    to_credit, oid = rng.random() < 0.5, order["order_id"]
    gold, result, method = _return(w, order, items, to_credit)
    refund, rid = money(result["refund"]), result["return_id"]
    return Draft({"order": oid, "items": _items_text(items), "where": _where(w, order, to_credit)}, [_get(oid)], gold,
                 [refund, rid], f"Return {rid} is requested; ${refund} will be refunded to {method}.", [oid],
                 profile=True)


def _exchange(w: TaskWriter, order: dict[str, Any], item: dict, target: dict) -> tuple[list, dict, str]:
    card = w.user(order["user_id"])["payment_methods"][0]["id"]  # every user's first method is a credit card
    gold = [call("exchange_delivered_order_items", order_id=order["order_id"], item_ids=[item["item_id"]],
                 new_item_ids=[target["item_id"]], payment_method_id=card)]
    return gold, w.outcome(gold)[0], card


def _difference_text(result: dict[str, Any], card: str) -> str:
    if result["price_difference"] == 0:
        return "the new variant costs the same ($0.00 difference)"
    direction = "charged to" if result["price_difference"] > 0 else "refunded to"
    return f"${money(result['price_difference'])} is {direction} {card}"


def make_exchange(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    choices = [(o, i, v) for o in _returnable(w, user_id) for i, v in _exchangeable(w, o)]
    if not choices:
        return None
    order, item, target = rng.choice(choices)
    gold, result, card = _exchange(w, order, item, target)
    oid, rid = order["order_id"], result["return_id"]
    return Draft({"order": oid, "product": item["name"], "wish": _wish(target["options"])},
                 [_get(oid), call("get_product_details", product_id=item["product_id"])], gold,
                 [money(result["price_difference"]), rid],
                 f"Exchange {rid} is requested; {_difference_text(result, card)}.", [oid], profile=True)


def _switch(w: TaskWriter, order: dict[str, Any], method: dict[str, Any]) -> tuple[list, dict]:
    gold = [call("modify_pending_order_payment", order_id=order["order_id"], payment_method_id=method["id"])]
    return gold, w.outcome(gold)[0]


def make_payment(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    choices = [(o, m) for o in _orders(w, user_id, "pending") for m in _payment_targets(w, o)]
    if not choices:
        return None
    order, method = rng.choice(choices)
    gold, result = _switch(w, order, method)
    oid, charged = order["order_id"], money(result["charged"])
    return Draft({"order": oid, "method": _method_text(method)}, [_get(oid)], gold, [charged, method["id"]],
                 f"Order {oid} is now paid with {method['id']} (${charged}); {result['refunded_to']} gets "
                 f"${charged} back.", [oid], profile=True)


# ---------------------------------------------------------------- lookups_then_write


def make_find_cancel(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    found = _only_order_with(w, user_id, rng, lambda o: o["status"] == "pending")
    if found is None:
        return None
    (order, item, looked), (reason, why) = found, _reason(rng)
    gold, result = _cancel(w, order, reason)
    oid, refund = order["order_id"], money(result["refund"])
    return Draft({"product": item["name"], "why": why, "why_cap": why[0].upper() + why[1:]},
                 [_get(o) for o in looked], gold, [oid, refund],
                 f"Order {oid} is cancelled and ${refund} will be refunded to {result['refund_to']}.", profile=True)


def make_find_return(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    found = _only_order_with(w, user_id, rng, lambda o: o["status"] == "delivered" and o["return_id"] is None)
    if found is None:
        return None
    (order, item, looked), to_credit = found, rng.random() < 0.5
    gold, result, method = _return(w, order, [item], to_credit)
    oid, refund, rid = order["order_id"], money(result["refund"]), result["return_id"]
    return Draft({"product": item["name"], "where": _where(w, order, to_credit)}, [_get(o) for o in looked], gold,
                 [refund, rid], f"Return {rid} for order {oid} is requested; ${refund} will be refunded to {method}.",
                 profile=True)


def make_find_exchange(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    def test(order: dict) -> bool:
        return order["status"] == "delivered" and order["return_id"] is None

    found = _only_order_with(w, user_id, rng, test)
    if found is None or _exchange_variant(w.db, found[1], True) is None:
        return None
    order, item, looked = found
    target = _exchange_variant(w.db, item, True)
    gold, result, card = _exchange(w, order, item, target)
    oid, rid = order["order_id"], result["return_id"]
    return Draft({"product": item["name"], "wish": _wish(target["options"])},
                 [_get(o) for o in looked] + [call("get_product_details", product_id=item["product_id"])], gold,
                 [money(result["price_difference"]), rid],
                 f"Exchange {rid} for order {oid} is requested; {_difference_text(result, card)}.", profile=True)


def _only_pending(w: TaskWriter, user_id: str) -> tuple[dict, list[str]] | None:
    """The user's one pending order and the orders read to find it, or None."""
    pending = _orders(w, user_id, "pending")
    if len(pending) != 1:
        return None
    ids = w.user(user_id)["orders"]
    return pending[0], ids[: ids.index(pending[0]["order_id"]) + 1]


def make_moved(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    found = _only_pending(w, user_id)
    if found is None:
        return None
    order, looked = found
    oid, address = order["order_id"], _new_address(rng, order["address"])
    w.outcome(_address_gold(oid, address))
    return Draft({"address": address_text(address)}, [_get(o) for o in looked], _address_gold(oid, address),
                 [oid, address["street"]], f"Your pending order {oid} will now ship to {address_text(address)}.",
                 profile=True)


def make_find_payment(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    found = _only_pending(w, user_id)
    if found is None or not _payment_targets(w, found[0]):
        return None
    order, looked = found
    method = rng.choice(_payment_targets(w, order))
    gold, result = _switch(w, order, method)
    oid, charged = order["order_id"], money(result["charged"])
    return Draft({"method": _method_text(method)}, [_get(o) for o in looked], gold, [oid, charged],
                 f"Order {oid} is now charged to {method['id']} (${charged}); {result['refunded_to']} gets it back.",
                 profile=True)


# ---------------------------------------------------------------- policy_forbids


def make_refuse_cancel(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    orders = _orders(w, user_id, "processed", "delivered", "cancelled")
    if not orders:
        return None
    order, (reason, why) = rng.choice(orders), _reason(rng)
    oid, status = order["order_id"], order["status"]
    return Draft({"order": oid, "why": why, "why_cap": why[0].upper() + why[1:]}, [_get(oid)], [], [status],
                 f"Order {oid} is {status}, so I cannot cancel it; only pending orders can be cancelled.", [oid],
                 forbidden=call("cancel_pending_order", order_id=oid, reason=reason))


def make_refuse_address(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    orders = _orders(w, user_id, "processed", "delivered")
    if not orders:
        return None
    order = rng.choice(orders)
    oid, address = order["order_id"], _new_address(rng, order["address"])
    return Draft({"order": oid, "address": address_text(address)}, [_get(oid)], [], [order["status"]],
                 f"Order {oid} is already {order['status']}, so its address can no longer be changed.", [oid],
                 forbidden=_address_gold(oid, address)[0])


def _return_call(order: dict[str, Any], items: list[dict]) -> dict[str, Any]:
    return call("return_delivered_order_items", order_id=order["order_id"], item_ids=[i["item_id"] for i in items],
                payment_method_id=order["payment_method_id"])


def make_refuse_return(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    orders = _orders(w, user_id, "pending", "processed")
    if not orders:
        return None
    order = rng.choice(orders)
    items = rng.sample(order["items"], 1)
    oid = order["order_id"]
    return Draft({"order": oid, "items": _items_text(items)}, [_get(oid)], [], [order["status"]],
                 f"Order {oid} is still {order['status']}, not delivered, so it cannot be returned yet.", [oid],
                 forbidden=_return_call(order, items))


def make_refuse_second_return(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    orders = [o for o in _orders(w, user_id, "delivered") if o["return_id"] is not None]
    if not orders:
        return None
    order = rng.choice(orders)
    items = rng.sample(order["items"], 1)
    oid, rid = order["order_id"], order["return_id"]
    return Draft({"order": oid, "items": _items_text(items)}, [_get(oid)], [], [rid],
                 f"Order {oid} already has {w.db['returns'][rid]['kind']} {rid}, and only one return or exchange "
                 "is allowed per order.", [oid], forbidden=_return_call(order, items))


def make_refuse_exchange(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    choices = [(o, i, v) for o in _returnable(w, user_id) for i, v in _exchangeable(w, o, available=False)]
    if not choices:
        return None
    order, item, target = rng.choice(choices)
    oid, card = order["order_id"], w.user(user_id)["payment_methods"][0]["id"]
    forbidden = call("exchange_delivered_order_items", order_id=oid, item_ids=[item["item_id"]],
                     new_item_ids=[target["item_id"]], payment_method_id=card)
    return Draft({"order": oid, "product": item["name"], "wish": _wish(target["options"])},
                 [_get(oid), call("get_product_details", product_id=item["product_id"])], [], ["not available"],
                 f"The {item['name']} with {_wish(target['options'])} is not available, so I cannot exchange "
                 "yours for it.", [oid], profile=True, forbidden=forbidden)


def make_refuse_credit(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    credit = _method(w, user_id, "store_credit")
    orders = [o for o in _orders(w, user_id, "pending")
              if o["payment_method_id"] != credit["id"] and o["total"] > credit["balance"]]
    if not orders:
        return None
    order = rng.choice(orders)
    oid, balance, total = order["order_id"], money(credit["balance"]), money(order["total"])
    return Draft({"order": oid}, [_get(oid)], [], [balance, total],
                 f"Your store credit balance is ${balance}, less than the ${total} total of order {oid}, so I "
                 "cannot switch it.", [oid], profile=True,
                 forbidden=call("modify_pending_order_payment", order_id=oid, payment_method_id=credit["id"]))


# ---------------------------------------------------------------- multi_write


def make_cancel_two(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    pending = _orders(w, user_id, "pending")
    if len(pending) < 2:
        return None
    first, second = pending[:2]
    (r1, why1), (r2, why2) = _reason(rng), _reason(rng)
    gold = [call("cancel_pending_order", order_id=first["order_id"], reason=r1),
            call("cancel_pending_order", order_id=second["order_id"], reason=r2)]
    a, b = w.outcome(gold)
    ids = [first["order_id"], second["order_id"]]
    return Draft({"order": ids[0], "order2": ids[1], "why": why1, "why2": why2}, [_get(o) for o in ids], gold,
                 [money(a["refund"]), money(b["refund"])],
                 f"Both orders are cancelled: ${money(a['refund'])} for {ids[0]} goes back to {a['refund_to']} and "
                 f"${money(b['refund'])} for {ids[1]} to {b['refund_to']}.", ids)


def make_return_and_address(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    returnable, pending = _returnable(w, user_id), _orders(w, user_id, "pending")
    if not returnable or not pending:
        return None
    order, other, to_credit = rng.choice(returnable), rng.choice(pending), rng.random() < 0.5
    item = rng.choice(order["items"])
    address = _new_address(rng, other["address"])
    returned, _, method = _return(w, order, [item], to_credit)
    gold = returned + _address_gold(other["order_id"], address)
    result = w.outcome(gold)[0]
    ids = [order["order_id"], other["order_id"]]
    return Draft({"order": ids[0], "order2": ids[1], "items": _items_text([item]), "address": address_text(address),
                  "where": _where(w, order, to_credit)}, [_get(o) for o in ids], gold,
                 [money(result["refund"]), result["return_id"], address["street"]],
                 f"Return {result['return_id']} refunds ${money(result['refund'])} to {method}, and order {ids[1]} "
                 f"now ships to {address_text(address)}.", ids, profile=True)


def make_cancel_and_exchange(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    pending = _orders(w, user_id, "pending")
    choices = [(o, i, v) for o in _returnable(w, user_id) for i, v in _exchangeable(w, o)]
    if not pending or not choices:
        return None
    cancelled, (order, item, target), (reason, why) = rng.choice(pending), rng.choice(choices), _reason(rng)
    card = w.user(user_id)["payment_methods"][0]["id"]
    gold = [call("cancel_pending_order", order_id=cancelled["order_id"], reason=reason),
            call("exchange_delivered_order_items", order_id=order["order_id"], item_ids=[item["item_id"]],
                 new_item_ids=[target["item_id"]], payment_method_id=card)]
    first, second = w.outcome(gold)
    ids = [cancelled["order_id"], order["order_id"]]
    return Draft({"order": ids[0], "order2": ids[1], "why": why, "product": item["name"],
                  "wish": _wish(target["options"])},
                 [_get(o) for o in ids] + [call("get_product_details", product_id=item["product_id"])], gold,
                 [money(first["refund"]), money(second["price_difference"]), second["return_id"]],
                 f"Order {ids[0]} is cancelled and ${money(first['refund'])} goes back to {first['refund_to']}. "
                 f"Exchange {second['return_id']} is requested; {_difference_text(second, card)}.", ids, profile=True)


def make_address_two(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    pending = _orders(w, user_id, "pending")
    if len(pending) < 2:
        return None
    ids = [o["order_id"] for o in pending[:2]]
    address = _new_address(rng, pending[0]["address"])
    gold = _address_gold(ids[0], address) + _address_gold(ids[1], address)
    w.outcome(gold)
    return Draft({"order": ids[0], "order2": ids[1], "address": address_text(address)}, [_get(o) for o in ids], gold,
                 [ids[0], ids[1], address["street"]],
                 f"Orders {ids[0]} and {ids[1]} will both ship to {address_text(address)}.", ids)


# ---------------------------------------------------------------- multi_turn


def make_ask_which_order(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    pending = _orders(w, user_id, "pending")
    if len(pending) < 2:
        return None
    order, (reason, why) = rng.choice(pending), _reason(rng)
    gold, result = _cancel(w, order, reason)
    oid, refund = order["order_id"], money(result["refund"])
    listed = ", ".join(f"{o['order_id']} ({', '.join(i['name'] for i in o['items'])})" for o in pending)
    ask = {"name": "which_order", "keywords": ["which one", "which order", "which of"],
           "question": f"You have {len(pending)} pending orders: {listed}. Which one should I cancel?",
           "answer": f"The one with the {order['items'][0]['name']}: order {oid}."}
    return Draft({"why": why}, [_get(o) for o in w.user(user_id)["orders"]], gold, [oid, refund],
                 f"Order {oid} is cancelled; ${refund} goes back to {result['refund_to']}.", profile=True, ask=ask)


def make_ask_address(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    draft = make_address(w, user_id, rng)
    if draft is None:
        return None
    address = draft.slots.pop("address")
    draft.ask = {"name": "address", "keywords": ["address", "where"], "question": "What is the new shipping address?",
                 "answer": rng.choice(["The new address is {}.", "Please send it to {}."]).format(address)}
    return draft


def make_ask_refund(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    draft = make_return(w, user_id, rng)
    if draft is None:
        return None
    where = draft.slots.pop("where")
    answer = "As store credit, please." if where == "as store credit" else "Back to my original payment method, please."
    draft.ask = {"name": "refund_to", "keywords": ["refund", "store credit", "original payment"],
                 "question": "Should the refund go to your original payment method or to store credit?",
                 "answer": answer}
    return draft


def make_ask_variant(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    draft = make_exchange(w, user_id, rng)
    if draft is None:
        return None
    wish, product = draft.slots.pop("wish"), draft.slots["product"]
    draft.ask = {"name": "variant", "keywords": ["variant", "which one", "which option", "which version"],
                 "question": f"Which variant of the {product} would you like instead?",
                 "answer": f"The one with {wish}, please."}
    return draft


def make_ask_payment(w: TaskWriter, user_id: str, rng: random.Random) -> Draft | None:
    draft = make_payment(w, user_id, rng)
    if draft is None:
        return None
    method = draft.slots.pop("method")
    draft.ask = {"name": "payment_method", "keywords": ["payment method", "which card", "pay with", "which method"],
                 "question": "Which payment method would you like to use instead?", "answer": f"Please use {method}."}
    return draft


KINDS: dict[str, list[tuple[str, Maker]]] = {
    "lookup": [("status", make_status), ("tracking", make_tracking), ("total", make_total),
               ("credit", make_credit), ("pending", make_pending), ("item_price", make_item_price),
               ("return_status", make_return_status)],
    "single_write": [("cancel", make_cancel), ("address", make_address), ("return", make_return),
                     ("exchange", make_exchange), ("payment", make_payment)],
    "lookups_then_write": [("find_cancel", make_find_cancel), ("find_return", make_find_return),
                           ("find_exchange", make_find_exchange), ("moved", make_moved),
                           ("find_payment", make_find_payment)],
    "policy_forbids": [("refuse_cancel", make_refuse_cancel), ("refuse_address", make_refuse_address),
                       ("refuse_return", make_refuse_return), ("refuse_second_return", make_refuse_second_return),
                       ("refuse_exchange", make_refuse_exchange), ("refuse_credit", make_refuse_credit)],
    "multi_write": [("cancel_two", make_cancel_two), ("return_and_address", make_return_and_address),
                    ("cancel_and_exchange", make_cancel_and_exchange), ("address_two", make_address_two)],
    "multi_turn": [("ask_which_order", make_ask_which_order), ("ask_address", make_ask_address),
                   ("ask_refund", make_ask_refund), ("ask_variant", make_ask_variant),
                   ("ask_payment", make_ask_payment)],
}
# tasks per kind and split (calibration and eval: >= 60 each). Training: 48 of each of the 32
# kinds (1,536 tasks), each (user, kind) once: S is made an expert by many distinct tasks (ids,
# names, orders to copy), not by epochs over few (an S trained on 508 tasks looped on ids).
PER_KIND = {"train": dict.fromkeys(ALL_CATEGORIES, 48),
            "calibration": dict.fromkeys(ALL_CATEGORIES, 2), "eval": dict.fromkeys(ALL_CATEGORIES, 2)}


# ---------------------------------------------------------------- wording a draft


@dataclass
class Wording:
    """How one task is phrased: chosen per split so held-out wording stays out of training."""

    by: str
    greeting: str
    greeting_key: str
    body: str
    body_key: str
    neutral: str
    closing: str


def _choose(rng: random.Random, pools: tuple[list[str], list[str]], held_out: bool, key: str,
            train_only: list[str] = ()) -> tuple[str, str]:
    """A form of ``pools`` (train, held-out) and its key; ``train_only`` forms widen the training
    pool (the train split passes them; a held-out split's draws stay as they were)."""
    pool = pools[1] if held_out else pools[0] + list(train_only)
    index = rng.randrange(len(pool))
    return pool[index], f"{key}.{'h' if held_out else 't'}{index}"


def wording(rng: random.Random, split: str, kind: str, number: int, confirm: bool) -> Wording:
    """Training uses only training forms (``train_wording``'s too); calibration and eval always a
    held-out greeting, a held-out body for odd ``number`` (a first training one otherwise) and
    either kind of closing."""
    unseen = split != "train"
    more = (lambda forms: []) if unseen else (lambda forms: forms)
    by = "email" if rng.random() < 0.6 else "name"
    greeting, greeting_key = _choose(rng, HELLOS[by], unseen, by, more(train_wording.HELLOS[by]))
    body, body_key = _choose(rng, BODIES[kind], unseen and number % 2 == 1, kind, more(train_wording.BODIES[kind]))
    neutral, _ = _choose(rng, NEUTRAL_HELLOS, unseen, "neutral", more(train_wording.NEUTRAL_HELLOS))
    closings = CLOSINGS[0] + CLOSINGS[1] if unseen else CLOSINGS[0] + train_wording.CLOSINGS
    return Wording(by, greeting, greeting_key, body, body_key, neutral, rng.choice(closings) if confirm else "")


def _join(*parts: str) -> str:
    return " ".join(p for p in parts if p)


def add_task(w: TaskWriter, user_id: str, split: str, category: str, kind: str, number: int, draft: Draft,
             rng: random.Random) -> None:
    """Phrase ``draft`` for both user modes and add it to ``w`` (which checks it)."""
    words = wording(rng, split, kind, number, confirm=category != "lookup")
    hello, ident = w.hello(user_id, by=words.by, form=words.greeting)
    lookups = ident[: 2 if draft.profile else 1] + draft.lookups
    body = words.body.format(**draft.slots)
    ticket_withheld = [{**draft.ask, "after": len(lookups)}] if draft.ask else []
    opening = _join(words.neutral, withhold_orders(body), words.closing)
    user = w.user(user_id)
    names = {"first": user["first_name"], "last": user["last_name"], "email": user["email"],
             "zip": user["address"]["zip"]}
    withheld = [identity_detail(opening, words.by, names, rng)]
    withheld += [order_detail(opening, draft.orders, rng)] if draft.orders else []
    details = [_detail(**d) for d in withheld + ticket_withheld]
    extra = {"split": split, "kind": kind, "template": words.body_key, "greeting": words.greeting_key,
             "withheld": [_detail(**d) for d in ticket_withheld],
             "user_modes": {"multi_turn": {"request": opening, "withheld": details}}}
    w.add(category, _join(hello, body, words.closing), lookups, draft.gold, draft.facts, draft.reply,
          forbidden=draft.forbidden, task_id=f"{split}-{kind}-{number:04d}", extra=extra)
    check_generated(w.tasks[-1], names)


def check_generated(task: dict[str, Any], names: dict[str, str]) -> None:
    """The generator's own promises: the multi_turn opening hides who and which order, and each
    expert question gets exactly the detail it is for (the others still pending stay silent)."""
    mode = task["user_modes"]["multi_turn"]
    assert names["email"] not in mode["request"] and names["zip"] not in mode["request"], mode["request"]
    assert names["last"] not in mode["request"] and not re.search(r"\bW\d{4}\b", mode["request"]), mode["request"]
    for details in (task["withheld"], mode["withheld"]):
        for index, detail in enumerate(details):
            others = details[index + 1:]
            assert not any(asks_for(detail["question"], d["keywords"]) for d in others), (task["id"], detail)


# ---------------------------------------------------------------- splits


class SliceWriter(TaskWriter):
    """A TaskWriter on what a task about one user can touch: that user, their orders, the
    catalogue and the returns (whose count numbers new returns). Replaying a task on it is as
    on the whole database, and far cheaper to copy; copies come from one pickle."""

    def __init__(self, db: dict[str, Any], user_id: str) -> None:
        user = db["users"][user_id]
        super().__init__({"users": {user_id: user}, "orders": {o: db["orders"][o] for o in user["orders"]},
                          "products": db["products"], "returns": db["returns"]})
        self._blob: bytes | None = None

    def fresh_db(self) -> dict[str, Any]:
        if self._blob is None:
            self._blob = pickle.dumps(self.db, protocol=pickle.HIGHEST_PROTOCOL)
        return pickle.loads(self._blob)


def _next_task(db: dict[str, Any], split: str, category: str, kind: str, number: int, users: list[str],
               used: set[tuple[str, str]], cursor: int) -> tuple[dict[str, Any], int]:
    """Task ``number`` of ``kind``, about the first user from ``cursor`` on who can have it
    (and has no task of that kind yet); and where the next search starts."""
    maker = dict(KINDS[category])[kind]
    for step in range(len(users)):
        user_id = users[(cursor + step) % len(users)]
        if (user_id, kind) in used:
            continue
        rng = random.Random(f"{GEN_SEED}:{split}:{kind}:{number}:{user_id}")
        w = SliceWriter(db, user_id)
        draft = maker(w, user_id, rng)
        if draft is not None:
            add_task(w, user_id, split, category, kind, number, draft, rng)
            used.add((user_id, kind))
            return w.tasks[-1], (cursor + step + 1) % len(users)
    raise LookupError(f"{split}: no user of the split left for task {number} of kind {kind!r} (it has "
                      f"{number - 1} such tasks at most)")


def build_split_tasks(split: str, db: dict[str, Any], per_kind: int | None = None) -> list[dict[str, Any]]:
    """The generated tasks of ``split`` over ``db`` (the extended database), in a fixed order.

    Each kind gets PER_KIND[split][category] tasks; users are taken round robin from the
    split's own, each (user, kind) at most once, so tasks spread over the users.
    ``per_kind``: that many tasks of every kind instead. Fewer: each kind's first ones. More:
    the split's own tasks first, unchanged, then each kind's extra ones, drawn for that kind
    alone (from the user after its last one on), so they do not depend on other kinds.
    A kind with too few users in the split for ``per_kind`` raises LookupError.
    """
    generated = set(generated_user_ids(db))
    users = [u for u in split_user_ids(db)[split] if u in generated]  # the seed users have the hand tasks
    tasks: list[dict[str, Any]] = []
    used: set[tuple[str, str]] = set()
    cursor = 0
    after: dict[str, int] = {}  # kind -> where its next user search starts
    for category, kinds in KINDS.items():
        for kind, _ in kinds:
            for number in range(1, PER_KIND[split][category] + 1):
                task, cursor = _next_task(db, split, category, kind, number, users, used, cursor)
                tasks.append(task)
            after[kind] = cursor
    if per_kind is None:
        return tasks
    if per_kind < 1:
        raise ValueError(f"per_kind must be at least 1, not {per_kind}")
    taken: collections.Counter[str] = collections.Counter()
    kept = []
    for task in tasks:
        taken[task["kind"]] += 1
        if taken[task["kind"]] <= per_kind:
            kept.append(task)
    for category, kinds in KINDS.items():
        for kind, _ in kinds:
            cursor = after[kind]
            for number in range(PER_KIND[split][category] + 1, per_kind + 1):
                task, cursor = _next_task(db, split, category, kind, number, users, used, cursor)
                kept.append(task)
    return kept


# ---------------------------------------------------------------- the hand-checked tasks in user modes

_HAND_HELLO = re.compile(r"^(?:Hi, I'm (?P<first>\S+) (?P<last>\S+) \((?P<email>[^)\s]+)\)\."
                         r"|Hello, this is (?P<first2>\S+) (?P<last2>\S+), zip code (?P<zip>\d{5})\.) ")


def with_user_modes(task: dict[str, Any]) -> dict[str, Any]:
    """A hand-checked task (build_tasks' greeting) with its multi_turn opening added: the greeting
    becomes a neutral one and its order ids are taken out; both are given when asked."""
    found = _HAND_HELLO.match(task["request"])
    if found is None:
        raise ValueError(f"task {task['id']}: cannot tell the identity in its request, so it has no multi_turn mode")
    by = "email" if found["email"] else "name"
    names = {"first": found["first"] or found["first2"], "last": found["last"] or found["last2"],
             "email": found["email"] or "", "zip": found["zip"] or ""}
    rest = task["request"][found.end():]
    opening = _join(NEUTRAL_HELLOS[1][0], withhold_orders(rest))  # a held-out greeting: these are eval tasks
    rng = random.Random(f"{GEN_SEED}:hand:{task['id']}")
    orders = list(dict.fromkeys(re.findall(r"\bW\d{4}\b", rest)))
    details = [identity_detail(opening, by, names, rng)] + ([order_detail(opening, orders, rng)] if orders else [])
    return {**task, "user_modes": {"multi_turn": {"request": opening, "withheld": details}}}


@functools.lru_cache(maxsize=None)
def hand_tasks() -> tuple[dict[str, Any], ...]:
    """The 42 hand-checked tasks of tasks.jsonl, with their multi_turn mode."""
    return tuple(with_user_modes(t) for t in load_jsonl_tasks(TASKS_PATH, REQUIRED_KEYS, check_store_task))


@functools.lru_cache(maxsize=None)
def split_tasks(split: str, per_kind: int | None = None) -> tuple[dict[str, Any], ...]:
    """The tasks of one split (eval: the generated ones, then the hand-checked ones); with
    ``per_kind``, that many generated tasks of every kind (build_split_tasks). Shared: do not
    modify them."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, not {split!r}")
    generated = build_split_tasks(split, extended_db(), per_kind)
    problems = [f"{t['id']}: {p}" for t in generated if (p := check_store_task(t))]
    assert not problems, problems
    return tuple(generated) + (hand_tasks() if split == "eval" else ())
