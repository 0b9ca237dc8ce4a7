"""The online bookshop desk: orders of books, returns, exchanges, addresses, gift cards."""

from __future__ import annotations

import random
from typing import Any

from proxy.replay.synthetic.desk import (
    COMMON_TOOLS,
    FIND_TOOLS,
    Customer,
    Domain,
    ToolSpec,
    day,
    evaluate_sum,
)

ITEMS = (
    ("The Salt Road, paperback", "9780000101", 12.99),
    ("Night Trains of Europe, hardcover", "9780000102", 24.50),
    ("A Field Guide to Lichens, paperback", "9780000103", 18.00),
    ("The Quiet Engineer, e-book", "9780000104", 9.99),
    ("Small Gods of the Kitchen, hardcover", "9780000105", 21.00),
    ("Letters from the Lighthouse, paperback", "9780000106", 11.50),
    ("Counting Clouds, audiobook", "9780000107", 19.99),
    ("Maps of Forgotten Rivers, hardcover", "9780000108", 32.00),
    ("The Patient Gardener, paperback", "9780000109", 14.25),
    ("Winter Chess, paperback", "9780000110", 10.99),
    ("An Atlas of Bread, hardcover", "9780000111", 27.90),
    ("The Cartographer's Daughter, e-book", "9780000112", 7.99),
)
_STATUSES = ("pending", "processing", "shipped", "delivered", "delivered", "delivered")


def _edition(rng: random.Random, name: str, isbn: str, price: float) -> dict[str, Any]:
    title, _, form = name.rpartition(", ")
    return {
        "item_id": f"it_{rng.randint(1_000_000, 9_999_999)}",
        "title": title,
        "isbn": isbn,
        "format": form,
        "price": price,
    }


def _order(rng: random.Random, customer: Customer, order_id: str) -> dict[str, Any]:
    items = [_edition(rng, *item) for item in rng.sample(ITEMS, rng.randint(2, 5))]
    total = round(sum(item["price"] for item in items), 2)
    status = rng.choice(_STATUSES)
    order: dict[str, Any] = {
        "order_id": order_id,
        "customer_id": customer.id,
        "status": status,
        "placed_on": day(rng),
        "items": items,
        "shipping_address": {
            "line1": customer.street,
            "city": customer.city,
            "postcode": customer.postcode,
            "country": customer.country,
        },
        "payments": [{"method_id": customer.payment_id, "kind": "charge", "amount": total}],
        "total": total,
    }
    if status in ("shipped", "delivered"):
        order["delivery"] = {
            "method": rng.choice(("standard", "express")),
            "carrier": "ParcelNet",
            "tracking_id": f"PN{rng.randint(10**9, 10**10 - 1)}",
            "delivered_on": day(rng) if status == "delivered" else None,
        }
    return order


def _info(rng: random.Random, tool: str, args: dict[str, Any], customer: Customer) -> Any:
    if tool == "search_catalogue":
        picks = rng.sample(ITEMS, rng.randint(3, 5))
        return [{**_edition(rng, *item), "in_stock": rng.random() < 0.8} for item in picks]
    if tool == "list_shipping_options":
        return [
            {"option": "standard", "price": 3.95, "estimated_days": "3-6"},
            {"option": "express", "price": 6.90, "estimated_days": "1-2"},
            {"option": "pickup point", "price": 0.0, "estimated_days": "2-4"},
        ]
    if tool == "get_loyalty_balance":
        vouchers = [
            {
                "code": f"V{rng.randint(10**5, 10**6 - 1)}",
                "value": 5.0,
                "expires_on": day(rng, 2027),
            }
            for _ in range(rng.randint(0, 2))
        ]
        return {"customer_id": customer.id, "points": rng.randint(0, 480), "vouchers": vouchers}
    return evaluate_sum(str(args.get("expression", "0")))


def _describe(order: dict[str, Any]) -> str:
    items = ", ".join(f"{i['title']} ({i['format']}, {i['price']:.2f})" for i in order["items"])
    return (
        f"order {order['order_id']} ({order['status']}, placed on {order['placed_on']}): "
        f"{items}; total {order['total']:.2f}"
    )


BOOKSHOP = Domain(
    name="bookshop",
    company="Marginalia Books, an online bookshop",
    record_word="order",
    record_prefix="#B",
    policy="""# Bookshop support policy

## Orders
An order has one of these statuses: pending (paid, not yet packed), processing (being \
packed, can no longer be changed), shipped, delivered, or cancelled. Customers can have \
several orders; always check the order's status with a lookup before discussing it.

## Cancelling
Only pending orders can be cancelled, and only all at once: single items cannot be removed \
from an order. The reason must be one of: no longer needed, ordered by mistake, found \
cheaper elsewhere, delivery too slow. The refund goes to the original payment method and \
takes three to five business days; gift card amounts return to the gift card at once.

## Returns and exchanges
Delivered items can be returned within 30 days of delivery, unread and in their original \
condition; e-books and audiobooks cannot be returned once downloaded. Several items of one \
order can be returned in one request. The refund goes to the original payment method or to \
a gift card of the customer's choice. An exchange swaps a delivered printed book for another \
edition or format of the same title, or for another title of equal or higher price; the \
customer pays any difference with a saved payment method. Collect every item to exchange \
before calling the tool: an order can be exchanged only once.

## Shipping and addresses
The shipping address of a pending order can be changed; once an order is processing it \
cannot. Standard delivery takes three to six business days, express one to two. Express \
costs 6.90 per order and is refunded only if the parcel arrives late. International orders \
may take up to three weeks and customs fees are the customer's.

## Damaged or missing items
If a delivered book is damaged, offer a free replacement through an exchange for the same \
edition, or a return with a full refund; the customer does not need to send damaged items \
back. If a parcel is marked delivered but did not arrive, transfer to a human colleague, \
who opens a carrier investigation.

## Payment and gift cards
Accepted payment methods are cards, PayPal and gift cards. A gift card can be applied to a \
pending order; its balance never expires and cannot be paid out in cash. Do not read full \
card numbers to the customer: the last four digits are enough.

## Loyalty points
Members earn one point per whole unit spent; 100 points give a 5.00 voucher. Points for \
returned items are taken back. You cannot add points by hand as a gesture of goodwill.

## Preorders
Preordered titles are charged on the day they ship. A preorder can be cancelled at any time \
before it ships, for any reason.

## Prices and promotions
We do not match other shops' prices. Promotional codes apply at checkout only and cannot be \
added to an order afterwards; a customer who forgot a code on a pending order may cancel it \
and order again. Delivery is free for orders over 35.00, counted before gift cards. If a \
title becomes cheaper after it was ordered, the difference is not refunded.

## Signed and special editions
Signed copies, numbered limited editions and sprayed-edge editions are final sale: they can \
be returned only when damaged and cannot be exchanged. The item's format in the order says \
whether it is one of them; check it before offering a return.

## Schools, libraries and bulk orders
Orders of more than 20 copies of one title, and orders paid by invoice, belong to the sales \
team. You can look them up and describe their status, but transfer any change to them.
""",
    tools=(
        *FIND_TOOLS,
        ToolSpec(
            "get_order_details",
            "record",
            "Get an order: status, items with their ids, formats and prices, the shipping "
            "address, the payment history and, once shipped, the tracking details.",
            (("order_id", "str", "The order id, starting with '#', such as '#B2048113'."),),
        ),
        ToolSpec(
            "search_catalogue",
            "info",
            "Search the catalogue by title, author or ISBN. Returns matching editions with "
            "format, price and availability.",
            (
                ("query", "str", "Words from the title or the author's name, or an ISBN."),
                ("format", "enum:hardcover|paperback|ebook|audiobook", "Only this format."),
                ("max_results", "int", "How many editions to return, at most 20."),
            ),
            optional=("format", "max_results"),
        ),
        ToolSpec(
            "list_shipping_options",
            "info",
            "List the delivery options, prices and estimated dates to a postcode.",
            (
                ("postcode", "str", "The destination postcode."),
                ("country", "str", "The destination country as an ISO code, such as 'DE'."),
            ),
        ),
        ToolSpec(
            "cancel_pending_order",
            "action",
            "Cancel a pending order. The refund goes to the original payment method. Only "
            "after the customer confirmed.",
            (
                ("order_id", "str", "The order id, such as '#B2048113'."),
                (
                    "reason",
                    "enum:no longer needed|ordered by mistake|found cheaper elsewhere|"
                    "delivery too slow",
                    "Why the customer cancels.",
                ),
            ),
        ),
        ToolSpec(
            "return_delivered_items",
            "action",
            "Return delivered items of one order and refund them. Only after the customer "
            "confirmed the items and the refund method.",
            (
                ("order_id", "str", "The order id, such as '#B2048113'."),
                ("item_ids", "list:str", "The ids of the items to return."),
                ("refund_method_id", "str", "The payment method to refund, such as 'card_7731'."),
            ),
        ),
        ToolSpec(
            "exchange_delivered_items",
            "action",
            "Exchange delivered printed books of one order for other editions or titles. The "
            "customer pays any price difference with a saved payment method.",
            (
                ("order_id", "str", "The order id, such as '#B2048113'."),
                ("item_ids", "list:str", "The ids of the items to exchange."),
                ("new_item_ids", "list:str", "The ids of the editions to send instead."),
                ("payment_method_id", "str", "The payment method for any difference."),
            ),
        ),
        ToolSpec(
            "update_shipping_address",
            "action",
            "Change the shipping address of a pending order.",
            (
                ("order_id", "str", "The order id, such as '#B2048113'."),
                ("address", "obj:line1,line2,city,postcode,country", "The new address."),
            ),
        ),
        ToolSpec(
            "apply_gift_card",
            "action",
            "Apply a gift card to a pending order; the card's balance pays for it first.",
            (
                ("order_id", "str", "The order id, such as '#B2048113'."),
                ("gift_card_code", "str", "The 16-character code printed on the card."),
            ),
        ),
        ToolSpec(
            "get_loyalty_balance",
            "info",
            "Get the customer's loyalty points, the vouchers they hold and when each expires.",
            (("customer_id", "str", "The customer id, such as 'ana_kovac_3021'."),),
        ),
        *COMMON_TOOLS,
    ),
    item_pool=ITEMS,
    openers=(
        "Hi, I got my order yesterday but one of the books is the wrong edition: I ordered the "
        "hardcover and a paperback came, and it was meant to be a gift. Can you help?",
        "Hello, I'd like to cancel an order I placed this week if it hasn't shipped yet. I "
        "found the same books in a shop near my work and I don't need them twice.",
        "Hi there. I want to return a couple of books I bought last month. They're still in "
        "the wrapping, I just changed my mind. How does that work with you?",
        "Hey, I moved house two weeks ago and I think one of my orders is still going to the "
        "old address. Can that still be changed, or is it too late?",
        "Good morning, a book arrived this morning with a torn cover and a few bent pages, "
        "which is a shame because it's a present. I'd like a replacement if possible.",
        "Hi, my aunt gave me a gift card for my birthday and I have an order that isn't paid "
        "for completely. Can I still use the card on it, and how much is left on it?",
    ),
    notes=(
        "Refunds go back to the original payment method and usually appear within three to "
        "five business days; gift card amounts are back on the card straight away.",
        "Items can be returned within 30 days of delivery as long as they are unread and in "
        "their original condition, and several items of one order can go back together.",
        "Only pending orders can still be changed or cancelled; once an order is processing "
        "it is already being packed in our warehouse.",
        "Express delivery costs 6.90 per order and is refunded only if the parcel is late.",
    ),
    make_record=_order,
    answer_info=_info,
    status_after={
        "cancel_pending_order": "cancelled",
        "return_delivered_items": "return requested",
        "exchange_delivered_items": "exchange requested",
        "update_shipping_address": "pending",
        "apply_gift_card": "pending",
    },
    describe=_describe,
)
