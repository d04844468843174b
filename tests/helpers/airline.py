"""A small airline database in tau-bench's shapes (no shared data needed), shared by the
airline argument and conformance tests."""

from __future__ import annotations

import pickle
from typing import Any

from specagent.envs.airline.tools import NEW_CERTIFICATE_IDS


def tiny_database() -> dict[str, dict[str, Any]]:
    """Three flights, three users, three reservations, in tau-bench's shapes."""
    def day(seats: int, prices: tuple[int, int, int]) -> dict[str, Any]:
        cabins = ("basic_economy", "economy", "business")
        return {"status": "available", "available_seats": dict.fromkeys(cabins, seats),
                "prices": dict(zip(cabins, prices))}

    def flight(number: str, origin: str, destination: str, departs: str, arrives: str, dates: dict) -> dict:
        return {"flight_number": number, "origin": origin, "destination": destination,
                "scheduled_departure_time_est": departs, "scheduled_arrival_time_est": arrives, "dates": dates}

    landed = {"status": "landed", "actual_departure_time_est": "2024-05-10T08:02:00",
              "actual_arrival_time_est": "2024-05-10T14:05:00"}
    flights = {
        "HAT001": flight("HAT001", "JFK", "SEA", "08:00:00", "14:00:00", {
            "2024-05-10": landed, "2024-05-20": day(3, (80, 120, 400)), "2024-05-21": {"status": "cancelled"}}),
        "HAT002": flight("HAT002", "SEA", "LAX", "16:00:00", "18:00:00", {
            "2024-05-20": day(9, (60, 90, 300)), "2024-05-21": day(1, (70, 95, 310))}),
        "HAT003": flight("HAT003", "JFK", "SEA", "20:00:00", "02:00:00+1", {"2024-05-20": day(5, (50, 75, 250))}),
    }

    def card(kind: str, number: str, amount: float | None = None) -> tuple[str, dict[str, Any]]:
        method: dict[str, Any] = {"source": kind, "id": f"{kind}_{number}"}
        if amount is None:
            method |= {"brand": "visa", "last_four": number[-4:]}
        else:
            method["amount"] = amount
        return f"{kind}_{number}", method

    def user(first: str, last: str, methods: list, reservations: list[str]) -> dict[str, Any]:
        return {"name": {"first_name": first, "last_name": last},
                "address": {"address1": "1 Main St", "address2": "", "city": "Austin", "country": "USA",
                            "province": "TX", "zip": "78750"},
                "email": f"{first.lower()}@example.com", "dob": "1990-04-05", "payment_methods": dict(methods),
                "saved_passengers": [], "membership": "gold", "reservations": reservations}

    users = {
        "ann_lee_1": user("Ann", "Lee", [card("credit_card", "1111"), card("gift_card", "2222", 300),
                                         card("certificate", "3333", 100)], ["RES001", "RES002"]),
        "bob_kim_2": user("Bob", "Kim", [card("credit_card", "4444")], ["RES003"]),
        "cat_full_3": user("Cat", "Full", [card("credit_card", "5555")]
                           + [(c, {"source": "certificate", "amount": 50, "id": c}) for c in NEW_CERTIFICATE_IDS], []),
    }

    def leg(number: str, date: str, price: int) -> dict[str, Any]:
        return {"origin": flights[number]["origin"], "destination": flights[number]["destination"],
                "flight_number": number, "date": date, "price": price}

    def reservation(rid, user_id, cabin, legs, passengers, paid, bags, nonfree, insurance) -> dict[str, Any]:
        return {"reservation_id": rid, "user_id": user_id, "origin": legs[0]["origin"],
                "destination": legs[-1]["destination"], "flight_type": "one_way", "cabin": cabin, "flights": legs,
                "passengers": [{"first_name": n, "last_name": "Lee", "dob": "1990-04-05"} for n in passengers],
                "payment_history": [{"payment_id": p, "amount": a} for p, a in paid],
                "created_at": "2024-05-01T10:00:00", "total_baggages": bags, "nonfree_baggages": nonfree,
                "insurance": insurance}

    reservations = {
        "RES001": reservation("RES001", "ann_lee_1", "economy", [leg("HAT001", "2024-05-20", 120),
                              leg("HAT002", "2024-05-20", 90)], ["Ann"], [("credit_card_1111", 210)], 1, 0, "no"),
        "RES002": reservation("RES002", "ann_lee_1", "business", [leg("HAT002", "2024-05-21", 300)], ["Ann", "Tom"],
                              [("gift_card_2222", 690)], 2, 1, "yes"),
        "RES003": reservation("RES003", "bob_kim_2", "basic_economy", [leg("HAT001", "2024-05-20", 80)], ["Bob"],
                              [("credit_card_4444", 80)], 0, 0, "no"),
    }
    return {"flights": flights, "reservations": reservations, "users": users}


SEED = pickle.dumps(tiny_database())


def fresh() -> dict[str, dict[str, Any]]:
    return pickle.loads(SEED)

