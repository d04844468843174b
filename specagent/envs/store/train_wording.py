"""More ways to phrase a training request: forms only the train split draws from.

A model trained on two or three greetings keys on their exact words: an S trained on the
first forms of ``generate.py`` alone asked users who had given their e-mail in an unseen
greeting ("Hi! You can find me as ...") for their e-mail. These forms widen the training
phrasing; calibration and eval never use them, and their own held-out forms stay unseen by
training. Slots are those of ``generate.BODIES``; an order id is always written "order
{order}" (or "my order {order}") so that the multi_turn opening can take it out.
"""

from __future__ import annotations

HELLOS = {
    "email": [
        "Hi, {email} is the email on my account.",
        "Hello! I'm {first} {last}; my email address is {email}.",
        "Hey there, it's {first} {last}. Email: {email}.",
        "Good day. My account is registered to {email}.",
        "Hi, {first} here ({email}).",
        "Hello, writing from {email}.",
        "Greetings! {first} {last}, email {email}.",
        "Hi support, my e-mail is {email}.",
        "Morning! The account email is {email}.",
        "Hey, this is {first} {last} and I use {email} for my account.",
    ],
    "name": [
        "Hello, I'm {first} {last}; zip code {zip}.",
        "Hi, {first} {last} from zip {zip} here.",
        "Hey! Name's {first} {last}, my zip is {zip}.",
        "Good day, this is {first} {last} (zip {zip}).",
        "Hi there, {first} {last} writing, zip code {zip}.",
        "Hello. My name is {first} {last}, and {zip} is my zip code.",
        "Hi, it's {first} {last}. Zip: {zip}.",
    ],
}
NEUTRAL_HELLOS = ["Hey.", "Hi there.", "Good day.", "Hello there!", "Hi, I need some help.", "Morning."]
CLOSINGS = ["Please go ahead, I confirm.", "You can do it right away, I'm sure.", "Go ahead, that's confirmed.",
            "I'm certain, please proceed.", "Confirmed, please do it."]

BODIES: dict[str, list[str]] = {
    # lookup
    "status": ["What's happening with my order {order}?", "Could you check where my order {order} is at?",
               "Status of my order {order}, please."],
    "tracking": ["What's the tracking number of my order {order}? Has it shipped?",
                 "Give me the tracking id for my order {order} and tell me its status.",
                 "Can I get the tracking info and the status of my order {order}?"],
    "total": ["What was the total charged for my order {order}?", "Tell me the total amount of my order {order}.",
              "How much was my order {order} altogether?"],
    "credit": ["How much store credit do I have?", "Tell me my store credit balance, please.",
               "What is the balance of my store credit?"],
    "pending": ["Which orders of mine are still pending?", "Please list my pending orders.",
                "What orders do I have that are not shipped yet?"],
    "item_price": ["What was the price of the {product} in my order {order}?",
                   "Tell me how much I paid for the {product} in my order {order}.",
                   "In my order {order}, how much was the {product}?"],
    "return_status": ["What is the status of my {what} {return_id}, and how much money is in it?",
                      "Please look up my {what} {return_id}.",
                      "Where does my {what} {return_id} stand, and for what amount?"],
    # single_write
    "cancel": ["Cancel my order {order}, please; {why}.", "I'd like my order {order} cancelled: {why}.",
               "Please cancel the order {order}, {why}."],
    "address": ["Please ship my order {order} to {address} instead.",
                "Update the shipping address on my order {order} to {address}.",
                "My order {order} needs to go to {address}."],
    "return": ["Please return {items} from my order {order} and refund it {where}.",
               "I want to send back {items} from my order {order}; the refund goes {where}.",
               "Return {items} from my order {order}, refund {where}, please."],
    "exchange": ["Exchange the {product} in my order {order} for the variant with {wish}; "
                 "put any price difference on my credit card.",
                 "I want the {product} from my order {order} replaced with the one with {wish}, "
                 "using my credit card for the difference.",
                 "Please swap my {product} from my order {order} for the variant with {wish}; "
                 "my credit card covers any difference."],
    "payment": ["Please change the payment method of my order {order} to {method}.",
                "Pay my order {order} with {method}, please.",
                "I want my order {order} charged to {method} instead."],
    # lookups_then_write
    "find_cancel": ["Cancel the pending order that contains the {product}; {why}.",
                    "I'd like to cancel my order with the {product} in it, {why}.",
                    "Please cancel the order that has my {product}; {why}."],
    "find_return": ["Please return the {product} that was delivered to me; refund {where}.",
                    "I'd like to send back the {product} I got, with the refund {where}.",
                    "Return the {product} I received, please, refunded {where}."],
    "find_exchange": ["Exchange the {product} I received for the variant with {wish}; "
                      "my credit card pays any difference.",
                      "I got the {product} but want the one with {wish}; use my credit card for the difference.",
                      "Please replace the delivered {product} with the variant with {wish}, "
                      "difference on my credit card."],
    "moved": ["I have a new address, {address}; please ship my pending order there.",
              "Please redirect my pending order to {address}, I moved.",
              "Send my pending order to my new address, {address}."],
    "find_payment": ["Please charge my pending order to {method}.",
                     "Switch the payment of my pending order to {method}, please.",
                     "I want to pay my pending order with {method}."],
    # policy_forbids
    "refuse_cancel": ["Please cancel my order {order}; {why}.", "I'd like to cancel my order {order}, {why}.",
                      "Cancel the order {order} for me, {why}."],
    "refuse_address": ["Please send my order {order} to {address}.",
                       "Update my order {order} so it ships to {address}.",
                       "I need my order {order} delivered to {address}."],
    "refuse_return": ["I'd like to return {items} from my order {order} for a refund to my original payment method.",
                      "Please take back {items} from my order {order} and refund me.",
                      "Return {items} from my order {order}, refund to how I paid."],
    "refuse_second_return": ["Please return {items} from my order {order} as well, refund to my original "
                             "payment method.",
                             "I want to return {items} from my order {order} too.",
                             "Another return please: {items} from my order {order}."],
    "refuse_exchange": ["Exchange the {product} in my order {order} for the variant with {wish}; "
                        "my credit card covers the difference.",
                        "Please swap the {product} from my order {order} for the one with {wish}, "
                        "charging my credit card.",
                        "I want the {product} in my order {order} exchanged for the variant with {wish}; "
                        "use my credit card."],
    "refuse_credit": ["Please use my store credit to pay my order {order}.",
                      "Switch my order {order} to my store credit, please.",
                      "I'd like to pay my order {order} with store credit."],
    # multi_write
    "cancel_two": ["Cancel my order {order} ({why}) and my order {order2} too ({why2}).",
                   "Please cancel order {order}, {why}, and cancel order {order2}, {why2}.",
                   "Two cancellations please: order {order} as {why}, order {order2} as {why2}."],
    "return_and_address": ["Return {items} from order {order} with the refund {where}, and send order {order2} "
                           "to {address}.",
                           "Please do two things: return {items} from order {order} (refund {where}) and change "
                           "the address of order {order2} to {address}.",
                           "I'd like to return {items} from order {order}, refunded {where}, and to have "
                           "order {order2} shipped to {address}."],
    "cancel_and_exchange": ["Cancel order {order} ({why}), and exchange the {product} from order {order2} for "
                            "the variant with {wish}, difference on my credit card.",
                            "Please cancel order {order}, {why}; then swap the {product} in order {order2} for "
                            "the one with {wish}, my credit card covering any difference.",
                            "Two things: cancel order {order} because {why}, and exchange the {product} of "
                            "order {order2} for the variant with {wish}, using my credit card for the difference."],
    "address_two": ["Please ship order {order} and order {order2} to {address}.",
                    "Change the address of order {order} and of order {order2} to {address}.",
                    "Both order {order} and order {order2} should go to {address}."],
    # multi_turn: each leaves out one detail
    "ask_which_order": ["I want to cancel a pending order; {why}.",
                        "Please cancel one of my orders that hasn't shipped, {why}.",
                        "Cancel a pending order of mine please; {why}."],
    "ask_address": ["I need to change the address of my order {order}.",
                    "Please update where my order {order} ships; I moved.",
                    "My order {order} has to go to a different address."],
    "ask_refund": ["I want to return {items} from my order {order}.",
                   "Please return {items} from my order {order}.",
                   "I'd like to send back {items} from my order {order}."],
    "ask_variant": ["I want a different variant of the {product} in my order {order}; "
                    "my credit card covers any difference.",
                    "Please exchange the {product} from my order {order} for another variant, "
                    "difference on my credit card.",
                    "Could you swap the {product} in my order {order} for a different version? "
                    "Use my credit card for any difference."],
    "ask_payment": ["I want to change how my order {order} is paid.",
                    "Please switch the payment method of my order {order}.",
                    "Can I pay my order {order} another way?"],
}
