"""The store domain's tools: their schemas (what the agent sees) and their effects on the DB.

Every tool is a plain function ``tool(db, **arguments) -> observation``. A tool that
cannot do what was asked raises ``ToolError``; ``run_tool`` turns that into an
observation starting with "Error:". Write tools check everything before they change
anything, so a failed call leaves the database untouched.
"""

from __future__ import annotations

import ast
import copy
import json
import operator
from typing import Any, Callable

from jsonschema import Draft202012Validator

from specagent.core.types import ToolSpec

CANCEL_REASONS = ("no longer needed", "ordered by mistake")


class ToolError(Exception):
    """A tool call that the domain refuses: unknown id, wrong status, policy violation."""


# ---------------------------------------------------------------- schemas


def _params(required: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A strict JSON schema object: every listed property is required, nothing else allowed."""
    return {
        "type": "object",
        "properties": copy.deepcopy(required),  # no nested dict shared between tools
        "required": list(required),
        "additionalProperties": False,
    }


_STR = {"type": "string"}
_IDS = {"type": "array", "items": _STR}
_ADDRESS = {"street": _STR, "city": _STR, "state": _STR, "zip": _STR}

TOOL_SPECS: list[ToolSpec] = [
    ToolSpec("find_user_id_by_email", "Find a user id by email.", _params({"email": _STR}), True),
    ToolSpec(
        "find_user_id_by_name_zip",
        "Find a user id by name and zip.",
        _params({"first_name": _STR, "last_name": _STR, "zip": _STR}),
        True,
    ),
    ToolSpec("get_user_details", "Get a user's address, payment methods, orders.", _params({"user_id": _STR}), True),
    ToolSpec("get_order_details", "Get an order's status, items, payment.", _params({"order_id": _STR}), True),
    ToolSpec("get_product_details", "Get a product's variants.", _params({"product_id": _STR}), True),
    ToolSpec("list_product_types", "List product names and ids.", _params({}), True),
    ToolSpec("get_return_status", "Get a return or exchange.", _params({"return_id": _STR}), True),
    ToolSpec("calculate", "Compute e.g. 19.99+5*2.", _params({"expression": _STR}), True),
    ToolSpec(
        "cancel_pending_order",
        "Cancel a pending order.",
        _params({"order_id": _STR, "reason": {"type": "string", "enum": list(CANCEL_REASONS)}}),
        False,
    ),
    ToolSpec(
        "modify_pending_order_address",
        "Change a pending order's address.",
        _params({"order_id": _STR, **_ADDRESS}),
        False,
    ),
    ToolSpec(
        "return_delivered_order_items",
        "Return delivered items, refunded to payment_method_id.",
        _params({"order_id": _STR, "item_ids": _IDS, "payment_method_id": _STR}),
        False,
    ),
    ToolSpec(
        "exchange_delivered_order_items",
        "Exchange delivered items for other variants.",
        _params({"order_id": _STR, "item_ids": _IDS, "new_item_ids": _IDS, "payment_method_id": _STR}),
        False,
    ),
    ToolSpec(
        "modify_pending_order_payment",
        "Change a pending order's payment method.",
        _params({"order_id": _STR, "payment_method_id": _STR}),
        False,
    ),
    ToolSpec("transfer_to_human_agents", "Hand over to a human agent.", _params({"summary": _STR}), False),
]

TERMINAL_TOOLS = frozenset({"transfer_to_human_agents"})


# ---------------------------------------------------------------- helpers


def _dump(value: Any) -> str:
    """Compact JSON: observations go into a small model's context."""
    return json.dumps(value, separators=(",", ":"))


def _money(value: float) -> float:
    return round(value + 0.0, 2)  # + 0.0 turns -0.0 into 0.0


def _user(db: dict, user_id: str) -> dict:
    if user_id not in db["users"]:
        raise ToolError(f"user '{user_id}' not found")
    return db["users"][user_id]


def _order(db: dict, order_id: str) -> dict:
    if order_id not in db["orders"]:
        raise ToolError(f"order '{order_id}' not found")
    return db["orders"][order_id]


def _require_status(order: dict, status: str, action: str) -> None:
    if order["status"] != status:
        raise ToolError(f"order {order['order_id']} is {order['status']}; only {status} orders can {action}")


def _payment_method(db: dict, user_id: str, method_id: str) -> dict:
    for method in db["users"][user_id]["payment_methods"]:
        if method["id"] == method_id:
            return method
    raise ToolError(f"payment method '{method_id}' does not belong to user {user_id}")


def _store_credit_id(db: dict, user_id: str) -> str:
    return next(m["id"] for m in db["users"][user_id]["payment_methods"] if m["kind"] == "store_credit")


def _order_items(order: dict, item_ids: list[str]) -> list[dict]:
    """The order's items named by ``item_ids``, each at most once."""
    if not item_ids:
        raise ToolError("item_ids is empty")
    if len(set(item_ids)) != len(item_ids):
        raise ToolError("item_ids contains duplicates")
    by_id = {item["item_id"]: item for item in order["items"]}
    missing = [i for i in item_ids if i not in by_id]
    if missing:
        raise ToolError(f"items {missing} are not in order {order['order_id']}")
    return [by_id[i] for i in item_ids]


def _variant(db: dict, item_id: str) -> tuple[dict, dict]:
    """The (product, variant) that sells ``item_id``."""
    for product in db["products"].values():
        for variant in product["variants"]:
            if variant["item_id"] == item_id:
                return product, variant
    raise ToolError(f"item '{item_id}' not found")


def _check_returnable(order: dict) -> None:
    _require_status(order, "delivered", "be returned or exchanged")
    if order["return_id"] is not None:
        raise ToolError(f"order {order['order_id']} already has return {order['return_id']}; only one per order")


def _move_money(db: dict, order: dict, method: dict, amount: float) -> None:
    """Record a payment (amount > 0) or refund (amount < 0); store credit moves at once."""
    if amount == 0:
        return
    if method["kind"] == "store_credit":
        if amount > method["balance"]:
            raise ToolError(f"store credit balance {method['balance']:.2f} is less than {amount:.2f}")
        method["balance"] = _money(method["balance"] - amount)
    kind = "payment" if amount > 0 else "refund"
    order["payment_history"].append({"type": kind, "amount": _money(abs(amount)), "payment_method_id": method["id"]})


def _new_return_id(db: dict) -> str:
    return f"R{len(db['returns']) + 1:03d}"


def _address(street: str, city: str, state: str, zip: str) -> dict:
    return {"street": street, "city": city, "state": state, "zip": zip}


# ---------------------------------------------------------------- read-only tools


def find_user_id_by_email(db: dict, email: str) -> str:
    for user in db["users"].values():
        if user["email"].lower() == email.strip().lower():
            return user["user_id"]
    raise ToolError(f"no user with email '{email}'")


def find_user_id_by_name_zip(db: dict, first_name: str, last_name: str, zip: str) -> str:
    wanted = (first_name.strip().lower(), last_name.strip().lower(), zip.strip())
    for user in db["users"].values():
        if (user["first_name"].lower(), user["last_name"].lower(), user["address"]["zip"]) == wanted:
            return user["user_id"]
    raise ToolError(f"no user named {first_name} {last_name} with zip {zip}")


def get_user_details(db: dict, user_id: str) -> str:
    return _dump(_user(db, user_id))


def get_order_details(db: dict, order_id: str) -> str:
    return _dump(_order(db, order_id))


def get_product_details(db: dict, product_id: str) -> str:
    if product_id not in db["products"]:
        raise ToolError(f"product '{product_id}' not found")
    return _dump(db["products"][product_id])


def list_product_types(db: dict) -> str:
    return _dump({p["name"]: p["product_id"] for p in db["products"].values()})


def get_return_status(db: dict, return_id: str) -> str:
    if return_id not in db["returns"]:
        raise ToolError(f"return '{return_id}' not found")
    return _dump(db["returns"][return_id])


_OPERATORS: dict[type, Callable[..., float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _evaluate(node: ast.AST) -> float:
    """Arithmetic only: numbers, + - * /, parentheses. No names, calls or powers."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))
    raise ToolError("only numbers, + - * / and parentheses are allowed")


def calculate(db: dict, expression: str) -> str:
    if len(expression) > 200:
        raise ToolError("expression is too long")
    try:
        value = _evaluate(ast.parse(expression.strip(), mode="eval").body)
    except SyntaxError:
        raise ToolError(f"cannot parse expression '{expression}'") from None
    except ZeroDivisionError:
        raise ToolError("division by zero") from None
    try:
        return f"{value:.2f}"
    except OverflowError:
        raise ToolError("result is too large") from None


# ---------------------------------------------------------------- state-changing tools


def cancel_pending_order(db: dict, order_id: str, reason: str) -> str:
    order = _order(db, order_id)
    _require_status(order, "pending", "be cancelled")
    method = _payment_method(db, order["user_id"], order["payment_method_id"])
    _move_money(db, order, method, -order["total"])
    order["status"] = "cancelled"
    order["cancel_reason"] = reason
    return _dump({"order_id": order_id, "status": "cancelled", "refund": order["total"], "refund_to": method["id"]})


def modify_pending_order_address(db: dict, order_id: str, street: str, city: str, state: str, zip: str) -> str:
    order = _order(db, order_id)
    _require_status(order, "pending", "change address")
    order["address"] = _address(street, city, state, zip)
    return _dump({"order_id": order_id, "address": order["address"]})


def return_delivered_order_items(db: dict, order_id: str, item_ids: list[str], payment_method_id: str) -> str:
    order = _order(db, order_id)
    _check_returnable(order)
    items = _order_items(order, item_ids)
    allowed = (order["payment_method_id"], _store_credit_id(db, order["user_id"]))
    if payment_method_id not in allowed:
        raise ToolError(f"refunds go to the original payment method {allowed[0]} or store credit {allowed[1]}")
    method = _payment_method(db, order["user_id"], payment_method_id)
    refund = _money(sum(item["price"] for item in items))
    _move_money(db, order, method, -refund)
    return_id = _new_return_id(db)
    db["returns"][return_id] = {
        "return_id": return_id,
        "order_id": order_id,
        "kind": "return",
        "item_ids": list(item_ids),
        "refund": refund,
        "payment_method_id": payment_method_id,
        "status": "requested",
    }
    order["return_id"] = return_id
    return _dump({"return_id": return_id, "refund": refund, "refund_to": payment_method_id})


def _exchange_variants(db: dict, items: list[dict], new_item_ids: list[str]) -> list[dict]:
    """The new variants, checked: same product as the old item, different and available."""
    if len(new_item_ids) != len(items):
        raise ToolError("item_ids and new_item_ids must have the same length")
    variants = []
    for item, new_id in zip(items, new_item_ids):
        product, variant = _variant(db, new_id)
        if product["product_id"] != item["product_id"]:
            raise ToolError(f"item {new_id} is a {product['name']}, not a {item['name']}; exchanges keep the product")
        if new_id == item["item_id"]:
            raise ToolError(f"item {new_id} is the same variant as the one ordered")
        if not variant["available"]:
            raise ToolError(f"item {new_id} is not available")
        variants.append(variant)
    return variants


def exchange_delivered_order_items(
    db: dict, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
) -> str:
    order = _order(db, order_id)
    _check_returnable(order)
    items = _order_items(order, item_ids)
    variants = _exchange_variants(db, items, new_item_ids)
    method = _payment_method(db, order["user_id"], payment_method_id)
    difference = _money(sum(v["price"] for v in variants) - sum(i["price"] for i in items))
    _move_money(db, order, method, difference)
    return_id = _new_return_id(db)
    db["returns"][return_id] = {
        "return_id": return_id,
        "order_id": order_id,
        "kind": "exchange",
        "item_ids": list(item_ids),
        "new_item_ids": list(new_item_ids),
        "price_difference": difference,
        "payment_method_id": payment_method_id,
        "status": "requested",
    }
    order["return_id"] = return_id
    return _dump({"return_id": return_id, "price_difference": difference, "payment_method_id": payment_method_id})


def modify_pending_order_payment(db: dict, order_id: str, payment_method_id: str) -> str:
    order = _order(db, order_id)
    _require_status(order, "pending", "change payment")
    old = _payment_method(db, order["user_id"], order["payment_method_id"])
    new = _payment_method(db, order["user_id"], payment_method_id)
    if new is old:
        raise ToolError(f"order {order_id} is already paid with {payment_method_id}")
    _move_money(db, order, new, order["total"])  # raises first if store credit cannot cover it
    _move_money(db, order, old, -order["total"])
    order["payment_method_id"] = payment_method_id
    return _dump({"order_id": order_id, "charged": order["total"], "charged_to": new["id"], "refunded_to": old["id"]})


def transfer_to_human_agents(db: dict, summary: str) -> str:
    # Ends the episode; the database is unchanged so that grading stays a pure DB comparison.
    return "Transfer successful. A human agent will take over."


TOOL_FUNCTIONS: dict[str, Callable[..., str]] = {
    "find_user_id_by_email": find_user_id_by_email,
    "find_user_id_by_name_zip": find_user_id_by_name_zip,
    "get_user_details": get_user_details,
    "get_order_details": get_order_details,
    "get_product_details": get_product_details,
    "list_product_types": list_product_types,
    "get_return_status": get_return_status,
    "calculate": calculate,
    "cancel_pending_order": cancel_pending_order,
    "modify_pending_order_address": modify_pending_order_address,
    "return_delivered_order_items": return_delivered_order_items,
    "exchange_delivered_order_items": exchange_delivered_order_items,
    "modify_pending_order_payment": modify_pending_order_payment,
    "transfer_to_human_agents": transfer_to_human_agents,
}

_VALIDATORS = {spec.name: Draft202012Validator(spec.parameters) for spec in TOOL_SPECS}


def argument_problem(name: str, arguments: Any) -> str | None:
    """Why ``arguments`` do not fit the tool's schema, or None when they do."""
    error = next(iter(_VALIDATORS[name].iter_errors(arguments)), None)
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{where}: {error.message}" if where else error.message


def run_tool(db: dict, name: str, arguments: Any) -> str:
    """Execute one call against ``db``. Never raises: problems come back as "Error: ..."."""
    if not isinstance(name, str) or name not in TOOL_FUNCTIONS:
        return f"Error: unknown tool '{name}'"
    problem = argument_problem(name, arguments)
    if problem is not None:
        return f"Error: invalid arguments for {name}: {problem}"
    try:
        return TOOL_FUNCTIONS[name](db, **arguments)
    except ToolError as exc:
        return f"Error: {exc}"
    except Exception as exc:  # noqa: BLE001 - the agent must always get an observation
        return f"Error: {name} failed: {type(exc).__name__}: {exc}"
