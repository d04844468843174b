"""The tau-bench airline domain's 14 tools over its database.

The database is tau-bench's: ``{"flights": ..., "reservations": ..., "users": ...}`` as
loaded from its three JSON files. Observations are what tau-bench returns, character for
character (``json.dumps`` with its default separators, the same error texts, the same
quirks), so that the recorded runs replay exactly; ``conformance.py`` checks it.
A tool that refuses raises ``ToolError``; ``run_tool`` turns that, and any other
exception, into ``"Error: ..."`` as tau-bench does. Refusals are checked before anything
changes, so a refused call leaves the database as it was; the one exception is tau-bench's
too: a booking that names the same certificate twice fails half-way through paying.
"""

from __future__ import annotations

import ast
import copy
import json
import operator
from typing import Any, Callable

from jsonschema import Draft202012Validator

from specagent.core.types import ToolSpec

Database = dict[str, dict[str, Any]]

TERMINAL_TOOLS = frozenset({"transfer_to_human_agents"})
NEW_RESERVATION_IDS = ("HATHAT", "HATHAU", "HATHAV")  # tau-bench's fixed ids: at most three bookings a task
NEW_CERTIFICATE_IDS = ("certificate_3221322", "certificate_3221323", "certificate_3221324")
BOOKING_TIME = "2024-05-15T15:00:00"  # "now" in the policy
AIRPORTS = {
    "SFO": "San Francisco", "JFK": "New York", "LAX": "Los Angeles", "ORD": "Chicago", "DFW": "Dallas",
    "DEN": "Denver", "SEA": "Seattle", "ATL": "Atlanta", "MIA": "Miami", "BOS": "Boston", "PHX": "Phoenix",
    "IAH": "Houston", "LAS": "Las Vegas", "MCO": "Orlando", "EWR": "Newark", "CLT": "Charlotte",
    "MSP": "Minneapolis", "DTW": "Detroit", "PHL": "Philadelphia", "LGA": "LaGuardia",
}


class ToolError(Exception):
    """A call the domain refuses; the message is tau-bench's text after "Error: "."""


# ---------------------------------------------------------------- schemas (as `specagent import` gives the runs)


def _params(properties: dict[str, Any], required: tuple[str, ...] | None = None) -> dict[str, Any]:
    """A JSON schema object; every property is required unless ``required`` says otherwise."""
    out: dict[str, Any] = {"type": "object", "properties": properties}
    if properties:
        out["required"] = list(properties if required is None else required)
    return out


def _str(description: str | None = None, enum: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "string"}
    if enum is not None:
        out["enum"] = enum
    if description is not None:
        out["description"] = description
    return out


_DATE = _str("Date in YYYY-MM-DD format.")
_CABIN = _str(enum=["basic_economy", "economy", "business"])
_PASSENGERS = {
    "type": "array",
    "items": _params({"first_name": _str(), "last_name": _str(), "dob": _str("Date of birth in YYYY-MM-DD format.")}),
}
_SEARCH = _params({
    "origin": _str("Origin airport IATA code, such as 'JFK'."),
    "destination": _str("Destination airport IATA code, such as 'LAX'."),
    "date": _DATE,
})

_READ, _WRITE = True, False
# In the order `specagent import` lists them for the shared runs (by first use), with the
# texts of configs/import/tau_airline_tools.yaml: a live prompt renders the tools exactly
# as a prompt built from the imported trajectories does.
_SPECS: list[tuple[str, str, dict[str, Any], bool]] = [
    ("get_user_details",
     "The profile of a user (name, addresses, payment methods, reservation ids, membership).",
     _params({"user_id": _str("The user id, such as 'sara_doe_496'.")}), _READ),
    ("search_direct_flight",
     "Direct flights between two airports on a date, with status, seats and prices.", _SEARCH, _READ),
    ("search_onestop_flight",
     "One-stop flight pairs between two airports on a date, with status, seats and prices.",
     _params({**_SEARCH["properties"], "date": _str("Date of the first flight in YYYY-MM-DD format.")}), _READ),
    ("calculate",
     "Evaluates an arithmetic expression (numbers, + - * /, parentheses) and returns the result.",
     _params({"expression": _str("The expression, such as '(158 + 141) * 2'.")}), _READ),
    ("book_reservation", "Books a new reservation for a user.", _params({
        "user_id": _str(),
        "origin": _str("IATA code of the trip's origin."),
        "destination": _str("IATA code of the trip's destination."),
        "flight_type": _str(enum=["one_way", "round_trip"]),
        "cabin": _CABIN,
        "flights": {
            "type": "array",
            "description": "Every flight of the trip, in order.",
            "items": _params({"flight_number": _str("Such as 'HAT001'."), "date": _DATE}),
        },
        "passengers": _PASSENGERS,
        "payment_methods": {
            "type": "array",
            "description": "Payment methods from the user's profile and the amount each pays.",
            "items": _params({
                "payment_id": _str("Such as 'credit_card_7815826' or 'certificate_7504069'."),
                "amount": {"type": "number"},
            }),
        },
        "total_baggages": {"type": "integer"},
        "nonfree_baggages": {"type": "integer"},
        "insurance": _str(enum=["yes", "no"]),
    }), _WRITE),
    ("think", "Writes down a thought. Reads and changes nothing; use it for complex reasoning.",
     _params({"thought": _str("The thought.")}), _READ),
    ("get_reservation_details",
     "The details of a reservation (flights, passengers, payments, baggage, insurance).",
     _params({"reservation_id": _str("The reservation id, such as '8JX2WO'.")}), _READ),
    ("update_reservation_flights",
     "Changes the cabin and/or flights of a reservation; lists every flight of the new itinerary.", _params({
         "reservation_id": _str(),
         "cabin": _CABIN,
         "flights": {
             "type": "array",
             "description": "Every flight of the new itinerary, changed or not.",
             "items": _params(
                 {"flight_number": _str(), "date": _DATE, "origin": _str(), "destination": _str()},
                 required=("flight_number", "date"),
             ),
         },
         "payment_id": _str("The payment method for a price difference, from the user's profile."),
     }), _WRITE),
    ("transfer_to_human_agents",
     "Hands the conversation to a human agent, with a summary of the user's issue. Ends the conversation.",
     _params({"summary": _str()}), _WRITE),
    ("list_all_airports", "Every airport the airline serves, as IATA code and city.", _params({}), _READ),
    ("update_reservation_baggages", "Sets the baggage counts of a reservation.", _params({
        "reservation_id": _str(),
        "total_baggages": {"type": "integer"},
        "nonfree_baggages": {"type": "integer"},
        "payment_id": _str(),
    }), _WRITE),
    ("cancel_reservation", "Cancels a whole reservation.", _params({"reservation_id": _str()}), _WRITE),
    ("update_reservation_passengers",
     "Replaces the passenger details of a reservation (the number of passengers stays the same).",
     _params({"reservation_id": _str(), "passengers": _PASSENGERS}), _WRITE),
    ("send_certificate", "Sends a travel certificate of the given amount to a user, as compensation.",
     _params({"user_id": _str(), "amount": {"type": "number"}}), _WRITE),
]
TOOL_SPECS: list[ToolSpec] = [
    ToolSpec(name, description, copy.deepcopy(parameters), read_only)
    for name, description, parameters, read_only in _SPECS
]


# ---------------------------------------------------------------- shared pieces


def _dump(value: Any) -> str:
    return json.dumps(value)  # tau-bench's separators (", ", ": "): observations must match the runs


def _user(db: Database, user_id: str) -> dict[str, Any]:
    if user_id not in db["users"]:
        raise ToolError("user not found")
    return db["users"][user_id]


def _reservation(db: Database, reservation_id: str) -> dict[str, Any]:
    if reservation_id not in db["reservations"]:
        raise ToolError("reservation not found")
    return db["reservations"][reservation_id]


def _is_available(flight: dict[str, Any], date: str) -> bool:
    return date in flight["dates"] and flight["dates"][date]["status"] == "available"


def _flight_on(flight: dict[str, Any], date: str) -> dict[str, Any]:
    """A flight's fixed fields with one date's status, seats and prices."""
    return {key: value for key, value in flight.items() if key != "dates"} | flight["dates"][date]


def _price_leg(db: Database, leg: dict[str, Any], cabin: str, seats: int) -> int:
    """Check that ``seats`` seats of ``cabin`` can be sold on ``leg``; write its price and airports into it."""
    number = leg["flight_number"]
    if number not in db["flights"]:
        raise ToolError(f"flight {number} not found")
    flight = db["flights"][number]
    if leg["date"] not in flight["dates"]:
        raise ToolError(f"flight {number} not found on date {leg['date']}")
    day = flight["dates"][leg["date"]]
    if day["status"] != "available":
        raise ToolError(f"flight {number} not available on date {leg['date']}")
    if day["available_seats"][cabin] < seats:
        raise ToolError(f"not enough seats on flight {number}")
    leg["price"] = day["prices"][cabin]
    leg["origin"] = flight["origin"]
    leg["destination"] = flight["destination"]
    return leg["price"]


def _change_payment(db: Database, reservation: dict[str, Any], payment_id: str, amount: float) -> dict[str, Any]:
    """The user's payment method for a change costing ``amount``: no certificates, gift cards must cover it."""
    methods = db["users"][reservation["user_id"]]["payment_methods"]
    if payment_id not in methods:
        raise ToolError("payment method not found")
    method = methods[payment_id]
    if method["source"] == "certificate":
        raise ToolError("certificate cannot be used to update reservation")
    if method["source"] == "gift_card" and method["amount"] < amount:
        raise ToolError("gift card balance is not enough")
    return method


def _charge_change(reservation: dict[str, Any], method: dict[str, Any], payment_id: str, amount: float) -> None:
    if method["source"] == "gift_card":
        method["amount"] -= amount
    if amount != 0:
        reservation["payment_history"].append({"payment_id": payment_id, "amount": amount})


# ---------------------------------------------------------------- read-only tools


def get_user_details(db: Database, user_id: str) -> str:
    return _dump(_user(db, user_id))


def get_reservation_details(db: Database, reservation_id: str) -> str:
    if reservation_id not in db["reservations"]:
        raise ToolError("user not found")  # sic: tau-bench's text for an unknown reservation
    return _dump(db["reservations"][reservation_id])


def search_direct_flight(db: Database, origin: str, destination: str, date: str) -> str:
    found = [
        _flight_on(flight, date)
        for flight in db["flights"].values()
        if flight["origin"] == origin and flight["destination"] == destination and _is_available(flight, date)
    ]
    return _dump(found)


def _next_day(date: str) -> str:
    # tau-bench's arithmetic, kept for identical results: May 2024 only, no zero padding
    # ("2024-05-09" -> "2024-05-10" but "2024-05-01" -> "2024-05-2", a date no flight has).
    return f"2024-05-{int(date[-2:]) + 1}"


def search_onestop_flight(db: Database, origin: str, destination: str, date: str) -> str:
    pairs = []
    flights = db["flights"].values()
    for first in flights:
        if first["origin"] != origin:
            continue
        for second in flights:
            if second["destination"] != destination or second["origin"] != first["destination"]:
                continue
            second_date = _next_day(date) if "+1" in first["scheduled_arrival_time_est"] else date
            if first["scheduled_arrival_time_est"] > second["scheduled_departure_time_est"]:
                continue  # tau-bench compares the clock texts, "+1" and all
            if _is_available(first, date) and second_date in second["dates"] and _is_available(second, second_date):
                # sic: the second leg shows its status, seats and prices of the first leg's date
                pairs.append([_flight_on(first, date) | {"date": date},
                              _flight_on(second, date) | {"date": second_date}])
    return _dump(pairs)


def list_all_airports(db: Database) -> str:
    return _dump(AIRPORTS)


_OPERATORS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos,
}
_MAX_EXPONENT = 1000  # 9**9**9 would run for ever


def _evaluate(node: ast.AST) -> Any:
    """The arithmetic the allowed characters can spell: numbers, + - * / // **, parentheses."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ToolError("exponent too large")
        return _OPERATORS[type(node.op)](left, right)
    raise ToolError("not an arithmetic expression")


def calculate(db: Database, expression: str) -> str:
    if not all(char in "0123456789+-*/(). " for char in expression):
        raise ToolError("invalid characters in expression")
    # eval() skips leading blanks, ast.parse does not; "<string>" gives eval's SyntaxError texts
    tree = ast.parse(expression.lstrip(" "), "<string>", mode="eval")
    return str(round(float(_evaluate(tree.body)), 2))


def think(db: Database, thought: str) -> str:
    return ""


# ---------------------------------------------------------------- state-changing tools


def book_reservation(
    db: Database, user_id: str, origin: str, destination: str, flight_type: str, cabin: str,
    flights: list[dict[str, Any]], passengers: list[dict[str, Any]], payment_methods: list[dict[str, Any]],
    total_baggages: int, nonfree_baggages: int, insurance: str,
) -> str:
    user = _user(db, user_id)
    reservations = db["reservations"]
    reservation_id = next((rid for rid in NEW_RESERVATION_IDS if rid not in reservations), NEW_RESERVATION_IDS[-1])
    legs = copy.deepcopy(flights)
    total = sum(_price_leg(db, leg, cabin, len(passengers)) * len(passengers) for leg in legs)
    if insurance == "yes":
        total += 30 * len(passengers)
    total += 50 * nonfree_baggages
    for payment in payment_methods:
        payment_id = payment["payment_id"]
        if payment_id not in user["payment_methods"]:
            raise ToolError(f"payment method {payment_id} not found")
        method = user["payment_methods"][payment_id]
        if method["source"] in ("gift_card", "certificate") and method["amount"] < payment["amount"]:
            raise ToolError(f"not enough balance in payment method {payment_id}")
    paid = sum(payment["amount"] for payment in payment_methods)
    if paid != total:
        raise ToolError(f"payment amount does not add up, total price is {total}, but paid {paid}")
    for payment in payment_methods:
        method = user["payment_methods"][payment["payment_id"]]
        if method["source"] == "gift_card":
            method["amount"] -= payment["amount"]
        elif method["source"] == "certificate":
            del user["payment_methods"][payment["payment_id"]]  # what is left of a certificate is lost
    reservation = {
        "reservation_id": reservation_id, "user_id": user_id, "origin": origin, "destination": destination,
        "flight_type": flight_type, "cabin": cabin, "flights": legs, "passengers": passengers,
        "payment_history": payment_methods, "created_at": BOOKING_TIME, "total_baggages": total_baggages,
        "nonfree_baggages": nonfree_baggages, "insurance": insurance,
    }
    reservations[reservation_id] = reservation
    user["reservations"].append(reservation_id)
    return _dump(reservation)


def cancel_reservation(db: Database, reservation_id: str) -> str:
    reservation = _reservation(db, reservation_id)
    history = reservation["payment_history"]
    history.extend([{"payment_id": p["payment_id"], "amount": -p["amount"]} for p in history])
    reservation["status"] = "cancelled"
    return _dump(reservation)


def update_reservation_flights(
    db: Database, reservation_id: str, cabin: str, flights: list[dict[str, Any]], payment_id: str
) -> str:
    reservation = _reservation(db, reservation_id)
    seats = len(reservation["passengers"])
    legs = copy.deepcopy(flights)
    total = 0
    for leg in legs:
        kept = next((
            old for old in reservation["flights"]
            if old["flight_number"] == leg["flight_number"] and old["date"] == leg["date"]
            and cabin == reservation["cabin"]
        ), None)
        if kept is None:
            total += _price_leg(db, leg, cabin, seats) * seats
        else:  # an unchanged flight keeps the price it was bought at
            leg["price"], leg["origin"], leg["destination"] = kept["price"], kept["origin"], kept["destination"]
            total += kept["price"] * seats
    total -= sum(old["price"] for old in reservation["flights"]) * seats
    method = _change_payment(db, reservation, payment_id, total)
    reservation["flights"] = legs  # seat counts are not updated (as in tau-bench)
    _charge_change(reservation, method, payment_id, total)
    return _dump(reservation)


def update_reservation_baggages(
    db: Database, reservation_id: str, total_baggages: int, nonfree_baggages: int, payment_id: str
) -> str:
    reservation = _reservation(db, reservation_id)
    cost = 50 * max(0, nonfree_baggages - reservation["nonfree_baggages"])
    method = _change_payment(db, reservation, payment_id, cost)
    reservation["total_baggages"] = total_baggages
    reservation["nonfree_baggages"] = nonfree_baggages
    _charge_change(reservation, method, payment_id, cost)
    return _dump(reservation)


def update_reservation_passengers(db: Database, reservation_id: str, passengers: list[dict[str, Any]]) -> str:
    reservation = _reservation(db, reservation_id)
    if len(passengers) != len(reservation["passengers"]):
        raise ToolError("number of passengers does not match")
    reservation["passengers"] = passengers
    return _dump(reservation)


def send_certificate(db: Database, user_id: str, amount: float) -> str:
    methods = _user(db, user_id)["payment_methods"]
    payment_id = next((pid for pid in NEW_CERTIFICATE_IDS if pid not in methods), None)
    if payment_id is None:  # tau-bench returns nothing here; a text says why
        raise ToolError(f"user {user_id} already holds certificates {', '.join(NEW_CERTIFICATE_IDS)}")
    methods[payment_id] = {"source": "certificate", "amount": amount, "id": payment_id}
    return f"Certificate {payment_id} added to user {user_id} with amount {amount}."


def transfer_to_human_agents(db: Database, summary: str) -> str:
    return "Transfer successful"


TOOL_FUNCTIONS: dict[str, Callable[..., str]] = {
    fn.__name__: fn
    for fn in (
        get_user_details, get_reservation_details, search_direct_flight, search_onestop_flight,
        list_all_airports, calculate, think, book_reservation, cancel_reservation, update_reservation_flights,
        update_reservation_baggages, update_reservation_passengers, send_certificate, transfer_to_human_agents,
    )
}
_VALIDATORS = {spec.name: Draft202012Validator(spec.parameters) for spec in TOOL_SPECS}


def argument_problem(name: str, arguments: Any) -> str | None:
    """Why ``arguments`` do not fit the tool's schema (or name arguments it has not), or None."""
    error = next(iter(_VALIDATORS[name].iter_errors(arguments)), None)
    if error is not None:
        where = "/".join(str(part) for part in error.absolute_path)
        return f"{where}: {error.message}" if where else error.message
    unexpected = sorted(set(arguments) - set(_VALIDATORS[name].schema["properties"]))
    return f"unexpected argument(s) {', '.join(unexpected)}" if unexpected else None


def run_tool(db: Database, name: str, arguments: Any) -> str:
    """Execute one call against ``db``. Never raises: problems come back as "Error: ..."."""
    if name not in TOOL_FUNCTIONS:
        return f"Unknown action {name}"  # tau-bench's text
    problem = argument_problem(name, arguments)
    if problem is not None:
        return f"Error: invalid arguments for {name}: {problem}"
    try:
        # a copy: the database must not share lists with the caller's message history
        return TOOL_FUNCTIONS[name](db, **copy.deepcopy(arguments))
    except Exception as exc:  # noqa: BLE001 - tau-bench reports every failure as "Error: {exception}"
        return f"Error: {exc}"
