"""Store runs with their user renamed to a made-up person: identification drills for a drafter.

A run's first step names the user, e.g. ``find_user_id_by_email(email="caleb.jensen66@...")``
for a ticket that reads "... my account email is caleb.jensen66@...". The tokens differ
(" c|ale|b" in the ticket, "cale|b" in the call), so a small drafter cannot copy them token by
token; one trained on the store's 200 training users learns to recall a training user
instead (the quickstart's cut drafter answered "nadia.castro35" for diego.suzuki45). The same
runs with every user renamed to a person drawn from names the store never uses, a fresh one
per run, leave nothing to recall: the only way to the right call is to read the ticket.
Measured on the quickstart's 10-layer drafter it did not get there: trained on these drills
it wrote made-up names instead of training users' (docs/results.md, the quickstart pair).

The renaming is textual and exact: the user's e-mail, user id, first and last name (as whole
words, capitalized and lower case) are replaced in every message and call argument.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import replace

from specagent.core.types import Message, Trajectory

FIRST = ["Abel", "Alma", "Anton", "Beatriz", "Boris", "Carmen", "Cyrus", "Dalia", "Emil", "Farah", "Gideon",
         "Greta", "Hector", "Ida", "Ivo", "Jasper", "Juno", "Kenji", "Lena", "Luca", "Malik", "Mira", "Nils",
         "Odile", "Otto", "Paloma", "Quinn", "Ravi", "Rhea", "Silas", "Tamsin", "Tobias", "Ursula", "Vera", "Wim",
         "Xenia", "Yusuf", "Zora", "Amir", "Bianca", "Cedric", "Delia", "Enzo", "Fiona", "Gustav", "Hilda", "Ilan",
         "Joaquin", "Katya", "Lionel", "Magnus", "Noemi", "Orla", "Pavel", "Rocco", "Selma", "Tariq", "Umberto",
         "Viggo", "Willa"]
LAST = ["Adler", "Baptiste", "Carver", "Duarte", "Eriksen", "Falk", "Grimaldi", "Haas", "Ibarra", "Jovanovic",
        "Keller", "Lund", "Mercer", "Nilsen", "Okoro", "Pires", "Rasmussen", "Salazar", "Takeda", "Ueda", "Vance",
        "Whitaker", "Yilmaz", "Zhou", "Arnaud", "Brandt", "Cortez", "Dahl", "Esposito", "Fontaine", "Gallo", "Hale",
        "Ivarsson", "Jaeger", "Kaur", "Lozano", "Marsh", "Novotny", "Oyelaran", "Pham", "Ruggiero", "Sandoval",
        "Thorne", "Valdez", "Wallin", "Yamada", "Zeller", "Aquino", "Bauer", "Costa", "Delgado", "Engel", "Foster",
        "Gunn", "Horvat", "Ibsen", "Kraus", "Lambert", "Mori", "Nowak"]
_USER_ID = re.compile(r"([a-z]+)_([a-z]+)_(\d+)")


def identity(trajectory: Trajectory) -> dict[str, str] | None:
    """The user a store run identified: first, last (as written), user_id; None if it found none.
    Read from the first successful ``find_user_id_by_*`` call and its result."""
    calls = {c.id: c for m in trajectory.messages if m.role == "assistant" for c in m.tool_calls}
    for m in trajectory.messages:
        call = calls.get(m.tool_call_id or "") if m.role == "tool" else None
        found = _USER_ID.fullmatch(m.content or "") if call is not None and call.name.startswith("find_user_id_by_") else None
        if found:
            return {"first": found[1].capitalize(), "last": found[2].capitalize(), "user_id": m.content}
    return None


def rename(trajectory: Trajectory, rng: random.Random) -> Trajectory | None:
    """``trajectory`` with its user renamed to a made-up person (see the module doc); None for a
    run that identified no user. Names the store uses are never drawn."""
    who = identity(trajectory)
    if who is None:
        return None
    first, last = rng.choice(FIRST), rng.choice(LAST)
    number = who["user_id"].rsplit("_", 1)[1]
    pairs = [(who["user_id"], f"{first.lower()}_{last.lower()}_{number}")]
    for old, new in ((who["first"], first), (who["last"], last)):
        pairs += [(old, new), (old.lower(), new.lower())]
    text = json.dumps([m.to_openai() for m in trajectory.messages])
    for old, new in pairs:  # whole words only: "Kai" must not touch "Kaiser"
        text = re.sub(rf"(?<![A-Za-z]){re.escape(old)}(?![a-z])", new, text)
    messages = [Message.from_openai(m) for m in json.loads(text)]
    return replace(trajectory, id=f"{trajectory.id}:made-up", messages=messages,
                   meta={**trajectory.meta, "made_up_user": f"{first} {last}"})
