"""The tau-bench airline domain's 14 tools over its database.

The database is tau-bench's: ``{"flights": ..., "reservations": ..., "users": ...}`` as
loaded from its three JSON files. Observations are what tau-bench's ``Env.step`` returns,
character for character (``json.dumps`` with its default separators, the same error texts,
the same quirks), so that the recorded runs replay exactly; ``conformance.py`` checks it.

Arguments are taken as tau-bench takes them, not checked against the schemas: tau-bench
calls ``Tool.invoke(data=..., **arguments)`` and turns any exception into
``"Error: {exception}"``. So each tool here does the same operations in the same order as
tau-bench's, and a call with missing, extra or mistyped arguments gets tau-bench's answer
and tau-bench's database effect:

- missing or unknown arguments: the ``TypeError`` text Python 3.10-3.12 gives for the call
  ``BookReservation.invoke(data=..., **arguments)`` (``binding_problem``); nothing changes.
- a value of the wrong type fails where tau-bench's fails, with the same exception text
  (``"Error: unhashable type: 'list'"``, ``"Error: 'flight_number'"``, ...), and before any
  change wherever tau-bench's fails before any change.
- a value of the wrong type that tau-bench's code never checks is stored as it is, as
  tau-bench stores it: ``update_reservation_baggages(total_baggages="3")``,
  ``update_reservation_passengers(passengers="ab")`` on a two-passenger reservation,
  ``book_reservation(passengers="ab")`` (two passengers' worth of seats and fare),
  ``send_certificate(amount="100")`` all succeed and change the database.

A refused call leaves the database as it was, except where tau-bench's own call fails
half-way: a booking that pays with the same certificate twice deletes the certificate
(and takes any gift-card amounts listed before it) and then fails with
``"Error: 'certificate_...'"``, with no reservation made. Tests pin that case down.

Where the project does not match tau-bench, on purpose:

- arguments that are not a JSON object (a list, a string, null): tau-bench cannot build
  the action at all (its agent crashes on them); here they are an ``"Error: ..."`` and
  nothing changes.
- ``send_certificate`` for a user who already holds all three of tau-bench's new
  certificate ids: tau-bench's tool returns None and ``Env.step`` fails on it (the run
  crashes, nothing changed); here it is an ``"Error: ..."`` and nothing changes.
- ``calculate`` refuses an integer power whose result would exceed ``MAX_POWER_BITS``
  bits (``"Error: exponent too large"``); tau-bench's ``eval`` computes it (``9**9**9``
  takes hours). Every other expression is evaluated by ``eval`` exactly as tau-bench does.
- Python 3.13 appends ``". Did you mean 'user_id'?"`` to the unknown-argument text; here
  it is the 3.10-3.12 text. Texts of other Python exceptions are this interpreter's, which
  is what tau-bench prints on it (they differ between versions: 3.10 says "string
  indices must be integers", 3.11 adds ", not 'str'").
- tau-bench stores the caller's own lists in its database (a booking's ``passengers``
  and ``payment_methods``); here a call works on a copy of its arguments. The database
  content is the same.
"""

from __future__ import annotations

import ast
import copy
import json
import math
from typing import Any, Callable

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
MAX_POWER_BITS = 1_000_000  # calculate: the largest integer power computed (tau-bench has no limit)
# tau-bench's tool classes, whose names its argument errors show: "BookReservation.invoke() missing ..."
TAU_BENCH_CLASSES = {
    "get_user_details": "GetUserDetails", "get_reservation_details": "GetReservationDetails",
    "search_direct_flight": "SearchDirectFlight", "search_onestop_flight": "SearchOnestopFlight",
    "list_all_airports": "ListAllAirports", "calculate": "Calculate", "think": "Think",
    "book_reservation": "BookReservation", "cancel_reservation": "CancelReservation",
    "update_reservation_flights": "UpdateReservationFlights",
    "update_reservation_baggages": "UpdateReservationBaggages",
    "update_reservation_passengers": "UpdateReservationPassengers", "send_certificate": "SendCertificate",
    "transfer_to_human_agents": "TransferToHumanAgents",
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
#
# Each tool does tau-bench's operations in tau-bench's order: with arguments of the wrong
# type, the first operation that fails is the same one, so the error text is the same, and
# every change a tool makes comes after its last check, as in tau-bench.


def _dump(value: Any) -> str:
    return json.dumps(value)  # tau-bench's separators (", ", ": "): observations must match the runs


def _reservation(db: Database, reservation_id: Any) -> dict[str, Any]:
    if reservation_id not in db["reservations"]:  # an unhashable id fails here, as in tau-bench
        raise ToolError("reservation not found")
    return db["reservations"][reservation_id]


def _day_on(flight: dict[str, Any], date: Any) -> dict[str, Any] | None:
    """The flight's status, seats and prices on ``date``, if it flies then and is available."""
    if date in flight["dates"] and flight["dates"][date]["status"] == "available":
        return flight["dates"][date]
    return None


def _flight_on(flight: dict[str, Any], date: Any) -> dict[str, Any]:
    """A flight's fixed fields with one date's status, seats and prices."""
    shown = {key: value for key, value in flight.items() if key != "dates"}
    shown.update(flight["dates"][date])
    return shown


def _price_leg(db: Database, leg: Any, cabin: Any, passengers: Any) -> None:
    """Check that ``len(passengers)`` seats of ``cabin`` can be sold on ``leg``; write its
    price and airports into it (``leg`` is the caller's copy)."""
    number = leg["flight_number"]
    if number not in db["flights"]:
        raise ToolError(f"flight {number} not found")
    flight = db["flights"][number]
    if leg["date"] not in flight["dates"]:
        raise ToolError(f"flight {number} not found on date {leg['date']}")
    day = flight["dates"][leg["date"]]
    if day["status"] != "available":
        raise ToolError(f"flight {number} not available on date {leg['date']}")
    if day["available_seats"][cabin] < len(passengers):
        raise ToolError(f"not enough seats on flight {number}")
    leg["price"] = day["prices"][cabin]
    leg["origin"] = flight["origin"]
    leg["destination"] = flight["destination"]


def _change_payment(db: Database, reservation: dict[str, Any], payment_id: Any, amount: Any) -> dict[str, Any]:
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


def _record_change(reservation: dict[str, Any], payment_id: Any, amount: Any) -> None:
    if amount != 0:
        reservation["payment_history"].append({"payment_id": payment_id, "amount": amount})


# ---------------------------------------------------------------- read-only tools


def get_user_details(db: Database, user_id: Any) -> str:
    if user_id in db["users"]:
        return _dump(db["users"][user_id])
    raise ToolError("user not found")


def get_reservation_details(db: Database, reservation_id: Any) -> str:
    if reservation_id in db["reservations"]:
        return _dump(db["reservations"][reservation_id])
    raise ToolError("user not found")  # sic: tau-bench's text for an unknown reservation


def search_direct_flight(db: Database, origin: Any, destination: Any, date: Any) -> str:
    found = [
        _flight_on(flight, date)
        for flight in db["flights"].values()
        if flight["origin"] == origin and flight["destination"] == destination and _day_on(flight, date) is not None
    ]
    return _dump(found)


def _next_day(date: Any) -> str:
    # tau-bench's arithmetic, kept for identical results: May 2024 only, no zero padding
    # ("2024-05-09" -> "2024-05-10" but "2024-05-01" -> "2024-05-2", a date no flight has).
    return f"2024-05-{int(date[-2:]) + 1}"


def search_onestop_flight(db: Database, origin: Any, destination: Any, date: Any) -> str:
    pairs = []
    flights = db["flights"].values()
    for first in flights:
        if first["origin"] != origin:
            continue
        for second in flights:
            if second["destination"] != destination or first["destination"] != second["origin"]:
                continue
            arrival = first["scheduled_arrival_time_est"]
            second_date = _next_day(date) if "+1" in arrival else date
            if arrival > second["scheduled_departure_time_est"]:
                continue  # tau-bench compares the clock texts, "+1" and all
            if not (date in first["dates"] and second_date in second["dates"]):
                continue
            if first["dates"][date]["status"] == "available" and second["dates"][second_date]["status"] == "available":
                # sic: the second leg shows its status, seats and prices of the first leg's date
                pairs.append([_flight_on(first, date) | {"date": date},
                              _flight_on(second, date) | {"date": second_date}])
    return _dump(pairs)


def list_all_airports(db: Database) -> str:
    return _dump(AIRPORTS)


_ALLOWED = "0123456789+-*/(). "


def _power(base: Any, exponent: Any) -> Any:
    """``base ** exponent``, refused where the result is an integer of over ``MAX_POWER_BITS`` bits."""
    if type(base) is int and type(exponent) is int and exponent > 0 and abs(base) > 1:
        if exponent * math.log2(abs(base)) > MAX_POWER_BITS:
            raise ToolError("exponent too large")
    return base ** exponent


def _guard_powers(tree: ast.Expression) -> ast.Expression:
    """``tree`` with each ``a ** b`` made a call of ``_power(a, b)`` (same evaluation order).
    Children before their parents, so that powers inside powers are guarded too; iterative,
    so that a long sum does not hit Python's recursion limit where ``eval`` would not."""
    def guarded(child: Any) -> Any:
        if isinstance(child, ast.BinOp) and isinstance(child.op, ast.Pow):
            return ast.copy_location(ast.Call(ast.Name("_power", ast.Load()), [child.left, child.right], []), child)
        return child

    for node in reversed(list(ast.walk(tree))):
        for name, value in ast.iter_fields(node):
            if isinstance(value, list):
                value[:] = [guarded(item) for item in value]
            elif guarded(value) is not value:
                setattr(node, name, guarded(value))
    return ast.fix_missing_locations(tree)


def calculate(db: Database, expression: Any) -> str:
    if not all(char in _ALLOWED for char in expression):
        raise ToolError("invalid characters in expression")
    # tau-bench's own evaluation: eval without builtins. The allowed characters spell no
    # name, attribute, string or subscript: only numbers, operators, parentheses, `()` and
    # `...`. The one thing that can run away is `**`, so powers go through `_power`.
    scope: dict[str, Any] = {"__builtins__": None}
    if not isinstance(expression, str) or "**" not in expression:
        value = eval(expression, scope, {})  # noqa: S307 - see above; a non-string fails as in tau-bench
    else:
        try:  # a syntax error here has eval's text: the same parser, the same "<string>"
            tree = ast.parse(expression.lstrip(" "), "<string>", mode="eval")  # eval skips leading blanks
        except (RecursionError, MemoryError):  # too deep to guard its powers: not evaluated
            raise ToolError("expression too complex") from None
        code = compile(_guard_powers(tree), "<string>", "eval")
        value = eval(code, {**scope, "_power": _power}, {})  # noqa: S307
    return str(round(float(value), 2))


def think(db: Database, thought: Any) -> str:
    return ""


# ---------------------------------------------------------------- state-changing tools


def book_reservation(
    db: Database, user_id: Any, origin: Any, destination: Any, flight_type: Any, cabin: Any,
    flights: Any, passengers: Any, payment_methods: Any, total_baggages: Any, nonfree_baggages: Any,
    insurance: Any,
) -> str:
    reservations, users = db["reservations"], db["users"]
    if user_id not in users:
        raise ToolError("user not found")
    user = users[user_id]
    reservation_id = next((rid for rid in NEW_RESERVATION_IDS if rid not in reservations), NEW_RESERVATION_IDS[-1])
    legs = copy.deepcopy(flights)
    total = 0
    for leg in legs:
        _price_leg(db, leg, cabin, passengers)
        total += leg["price"] * len(passengers)
    if insurance == "yes":
        total += 30 * len(passengers)
    total += 50 * nonfree_baggages
    for payment in payment_methods:
        payment_id, amount = payment["payment_id"], payment["amount"]
        if payment_id not in user["payment_methods"]:
            raise ToolError(f"payment method {payment_id} not found")
        method = user["payment_methods"][payment_id]
        if method["source"] in ("gift_card", "certificate") and method["amount"] < amount:
            raise ToolError(f"not enough balance in payment method {payment_id}")
    paid = sum(payment["amount"] for payment in payment_methods)
    if paid != total:
        raise ToolError(f"payment amount does not add up, total price is {total}, but paid {paid}")
    for payment in payment_methods:  # tau-bench's only change before a possible failure (see the docstring)
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


def cancel_reservation(db: Database, reservation_id: Any) -> str:
    reservation = _reservation(db, reservation_id)
    refunds = [{"payment_id": p["payment_id"], "amount": -p["amount"]} for p in reservation["payment_history"]]
    reservation["payment_history"].extend(refunds)
    reservation["status"] = "cancelled"
    return _dump(reservation)


def update_reservation_flights(db: Database, reservation_id: Any, cabin: Any, flights: Any, payment_id: Any) -> str:
    reservation = _reservation(db, reservation_id)
    total = 0
    legs = copy.deepcopy(flights)
    for leg in legs:
        kept = [  # an unchanged flight (same number, date and cabin) keeps the price it was bought at
            old for old in reservation["flights"]
            if old["flight_number"] == leg["flight_number"] and old["date"] == leg["date"]
            and cabin == reservation["cabin"]
        ]
        if kept:
            total += kept[0]["price"] * len(reservation["passengers"])
            old = kept[0]
            leg["price"], leg["origin"], leg["destination"] = old["price"], old["origin"], old["destination"]
            continue
        _price_leg(db, leg, cabin, reservation["passengers"])
        total += leg["price"] * len(reservation["passengers"])
    total -= sum(old["price"] for old in reservation["flights"]) * len(reservation["passengers"])
    method = _change_payment(db, reservation, payment_id, total)
    if method["source"] == "gift_card":
        method["amount"] -= total
    reservation["flights"] = legs  # seat counts are not updated (as in tau-bench)
    _record_change(reservation, payment_id, total)
    return _dump(reservation)


def update_reservation_baggages(
    db: Database, reservation_id: Any, total_baggages: Any, nonfree_baggages: Any, payment_id: Any
) -> str:
    reservation = _reservation(db, reservation_id)
    cost = 50 * max(0, nonfree_baggages - reservation["nonfree_baggages"])
    method = _change_payment(db, reservation, payment_id, cost)
    reservation["total_baggages"] = total_baggages  # never checked by tau-bench: stored as given
    reservation["nonfree_baggages"] = nonfree_baggages
    if method["source"] == "gift_card":
        method["amount"] -= cost
    _record_change(reservation, payment_id, cost)
    return _dump(reservation)


def update_reservation_passengers(db: Database, reservation_id: Any, passengers: Any) -> str:
    reservation = _reservation(db, reservation_id)
    if len(passengers) != len(reservation["passengers"]):
        raise ToolError("number of passengers does not match")
    reservation["passengers"] = passengers
    return _dump(reservation)


def send_certificate(db: Database, user_id: Any, amount: Any) -> str:
    if user_id not in db["users"]:
        raise ToolError("user not found")
    methods = db["users"][user_id]["payment_methods"]
    payment_id = next((pid for pid in NEW_CERTIFICATE_IDS if pid not in methods), None)
    if payment_id is None:  # tau-bench returns None here and its Env.step fails on it; a text says why
        raise ToolError(f"user {user_id} already holds certificates {', '.join(NEW_CERTIFICATE_IDS)}")
    methods[payment_id] = {"source": "certificate", "amount": amount, "id": payment_id}
    return f"Certificate {payment_id} added to user {user_id} with amount {amount}."


def transfer_to_human_agents(db: Database, summary: Any) -> str:
    return "Transfer successful"


TOOL_FUNCTIONS: dict[str, Callable[..., str]] = {
    fn.__name__: fn
    for fn in (
        get_user_details, get_reservation_details, search_direct_flight, search_onestop_flight,
        list_all_airports, calculate, think, book_reservation, cancel_reservation, update_reservation_flights,
        update_reservation_baggages, update_reservation_passengers, send_certificate, transfer_to_human_agents,
    )
}
# tau-bench's parameters of each tool, in order (after its `data`): the same names as here
PARAMETERS: dict[str, tuple[str, ...]] = {
    name: fn.__code__.co_varnames[1:fn.__code__.co_argcount] for name, fn in TOOL_FUNCTIONS.items()
}


def _names(names: list[str]) -> str:
    """Python's list of argument names: 'a'; 'a' and 'b'; 'a', 'b', and 'c'."""
    quoted = [f"'{name}'" for name in names]
    if len(quoted) <= 2:
        return " and ".join(quoted)
    return ", ".join(quoted[:-1]) + ", and " + quoted[-1]


def binding_problem(name: str, arguments: dict[str, Any]) -> str | None:
    """The ``TypeError`` text of tau-bench's ``invoke(data=..., **arguments)`` for arguments
    it cannot take (Python 3.10-3.12's wording), or None.

    Python checks, in this order: ``data`` given twice (at the call, so the message names
    the function with its module), then the first argument in ``arguments``' order that
    the function has not, then every missing argument in the function's order."""
    tau_class, parameters = TAU_BENCH_CLASSES[name], PARAMETERS[name]
    if "data" in arguments:
        return (f"tau_bench.envs.airline.tools.{name}.{tau_class}.invoke() "
                "got multiple values for keyword argument 'data'")
    unexpected = next((key for key in arguments if key not in parameters), None)
    if unexpected is not None:
        return f"{tau_class}.invoke() got an unexpected keyword argument '{unexpected}'"
    missing = [parameter for parameter in parameters if parameter not in arguments]
    if missing:
        plural = "s" if len(missing) > 1 else ""
        return f"{tau_class}.invoke() missing {len(missing)} required positional argument{plural}: {_names(missing)}"
    return None


def run_tool(db: Database, name: str, arguments: Any) -> str:
    """Execute one call against ``db`` as tau-bench's ``Env.step`` does. Never raises:
    problems come back as "Error: ..."."""
    if name not in TOOL_FUNCTIONS:
        return f"Unknown action {name}"  # tau-bench's text
    if not isinstance(arguments, dict):  # tau-bench cannot even make the action (see the docstring)
        return f"Error: the arguments of {name} must be a JSON object, not {type(arguments).__name__}"
    problem = binding_problem(name, arguments)
    if problem is not None:
        return f"Error: {problem}"
    try:
        # a copy: the database must not share lists with the caller's message history
        return TOOL_FUNCTIONS[name](db, **copy.deepcopy(arguments))
    except Exception as exc:  # noqa: BLE001 - tau-bench reports every failure as "Error: {exception}"
        return f"Error: {exc}"
