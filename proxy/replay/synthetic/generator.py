"""Writing one synthetic conversation: a customer, their records, and a dialogue of
identification, lookups (some in parallel), questions and confirmed changes."""

from __future__ import annotations

import json
import random
import string
from typing import Any

from proxy.replay.synthetic.bookshop import BOOKSHOP
from proxy.replay.synthetic.desk import Customer, Domain, ToolSpec, make_customer
from proxy.replay.synthetic.telecom import TELECOM

DESKS = (BOOKSHOP, TELECOM)
_ID_CHARS = string.ascii_letters + string.digits

_ASK_IDENTITY = (
    "I can certainly help you with that. Before I look at anything, I need to find your "
    "account and make sure I'm talking to the account holder: could you tell me the e-mail "
    "address you use with us? If you don't remember which one it is, your first and last "
    "name together with your postcode will do just as well.",
    "Thanks for getting in touch, I'll gladly look into this for you. To get started I need "
    "to verify your identity: please give me the e-mail address on your account, or your "
    "full name and the postcode of your billing address.",
)
_GIVE_EMAIL = (
    "Sure, it's {email}.",
    "It should be {email}, I think. That's the one I use for most things.",
    "{email} - I hope that's the right one, I have a couple of addresses.",
)
_GIVE_NAME = (
    "I'm honestly not sure which e-mail I used when I signed up. I'm {first} {last}, and "
    "my postcode is {postcode}.",
    "Hmm, I have a few addresses and I don't want to give you the wrong one. My name is "
    "{first} {last} and my postcode is {postcode}.",
)
_ANSWER = (
    "Thank you for waiting, {first}. Here is what I found: {record}. {note} {tail}",
    "I've checked it for you, {first}. Your {record}. {note} {tail}",
)
_ANSWER_TAIL = (
    "Nothing on it needs your action right now. Is there something you'd like me to change?",
    "So everything is as expected at this point and there is nothing to worry about. Would "
    "you like me to do anything else with it?",
    "If any of this does not look right, tell me which part and I'll see what I can do.",
)
_PROPOSE = (
    "Thanks, {first}. I found {record}. Here is what I would do: {action}, with {details}. "
    "{note} {effect} Shall I go ahead? Please answer yes to confirm.",
    "Here is the plan, {first}. Your {record}. I can {action} with {details}. {note} "
    "{effect} Do you confirm that I should proceed (yes/no)?",
)
_EFFECT = (
    "The change applies as soon as you confirm, and you will get an e-mail about it.",
    "Any amount due or refunded goes to the payment method on file and will show on your "
    "next statement.",
)
_CONFIRM = (
    "Yes, please go ahead.",
    "Yes. That's exactly what I wanted, thank you for explaining.",
    "Yes, that's right, do it. I'll keep an eye out for the e-mail.",
    "Ok, yes please. As long as I don't have to do anything else on my side.",
)
_DONE = (
    "Done, {first}: the {word} {record_id} is now {status}. You'll receive a confirmation by "
    "e-mail within a few minutes with all the details. Is there anything else I can help "
    "you with today?",
    "That went through. The {word} {record_id} now shows as {status}, and you can see the "
    "details in your account at any time. Can I help with anything else?",
)
_MORE = (
    "Thanks! While I have you, can you also check my other {word}s? I want to be sure "
    "nothing else is wrong there.",
    "Great, thank you. One more thing: could you look at another {word} of mine? I'm not "
    "sure it's set up the way I asked.",
    "Ok, good to know. Actually, there's something else I wanted to ask about while I'm "
    "here, if that's alright.",
)
_THANKS = (
    "Perfect, that's everything I needed. Thank you for your patience!",
    "No, that's all for today. Thanks a lot, that was much easier than I expected.",
)
_CLOSE = (
    "You're welcome, {first}! If anything else comes up, just write to us here. Have a lovely day.",
    "Glad I could help, {first}. Take care, and don't hesitate to get in touch again.",
)
_BYE = ("Bye!", "Thanks, bye.")


class _Writer:
    """Appends messages in the OpenAI format and counts the model calls."""

    def __init__(self, rng: random.Random, desk: Domain) -> None:
        self.rng = rng
        self.desk = desk
        self.customer = make_customer(rng)
        self.records: dict[str, dict[str, Any]] = {}
        for _ in range(rng.randint(2, 4)):
            record_id = f"{desk.record_prefix}{rng.randint(1_000_000, 9_999_999)}"
            self.records[record_id] = desk.make_record(rng, self.customer, record_id)
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": desk.system_prompt()}]
        self.calls = 0

    def fill(self, template: str, **extra: Any) -> str:
        c = self.customer
        return template.format(
            first=c.first_name, last=c.last_name, email=c.email, postcode=c.postcode, **extra
        )

    def user(self, templates: tuple[str, ...], **extra: Any) -> None:
        text = self.fill(self.rng.choice(templates), word=self.desk.record_word, **extra)
        self.messages.append({"role": "user", "content": text})

    def say(self, templates: tuple[str, ...], **extra: Any) -> None:
        template = self.rng.choice(templates)
        text = self.fill(template, note=self.rng.choice(self.desk.notes), **extra)
        self.messages.append({"role": "assistant", "content": text})
        self.calls += 1

    def call(self, calls: list[tuple[ToolSpec, dict[str, Any], Any]]) -> None:
        """One assistant message with these tool calls, then one result for each."""
        ids = [f"call_{''.join(self.rng.choices(_ID_CHARS, k=24))}" for _ in calls]
        tool_calls = [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": tool.name, "arguments": json.dumps(args)},
            }
            for call_id, (tool, args, _) in zip(ids, calls, strict=True)
        ]
        self.messages.append({"role": "assistant", "content": None, "tool_calls": tool_calls})
        self.calls += 1
        for call_id, (tool, _, result) in zip(ids, calls, strict=True):
            content = result if isinstance(result, str) else json.dumps(result)
            self.messages.append(
                {"role": "tool", "tool_call_id": call_id, "name": tool.name, "content": content}
            )


def conversation(seed: int, index: int, steps: int | None = None) -> dict[str, Any]:
    """Conversation ``index`` of the set made with ``seed``, as a trace record: about
    ``steps`` model calls (tasks overshoot by about one), or 8 to 14 by default. The same
    customer and opening whatever ``steps`` is; a long session goes on with more tasks."""
    rng = random.Random(f"prefill-proxy synthetic {seed} {index}")
    desk = DESKS[index % len(DESKS)]
    writer = _Writer(rng, desk)
    writer.user(desk.openers)
    writer.say(_ASK_IDENTITY)
    _identify(writer)
    target = rng.randint(8, 14)  # drawn even when ``steps`` is given: the same rng stream
    if steps is not None:
        target = steps
    while True:
        _task(writer)
        if writer.calls >= target - 1:
            break
        writer.user(_MORE)
    writer.user(_THANKS)
    writer.say(_CLOSE)
    writer.user(_BYE)  # after the last assistant message: never sent, as in the traces
    suffix = "" if steps is None else f"-{steps}steps"
    return {
        "id": f"synthetic-{seed}-{index:04d}{suffix}",
        "source": f"synthetic/{desk.name}",
        "tools": [tool.schema() for tool in desk.tools],
        "messages": writer.messages,
        "meta": {
            "request": {"temperature": 0.0, "tool_choice": "auto"},
            "injected_assistant_idx": [],
            "format_retry_assistant_idx": [],
            "generator": f"prefill-proxy synthetic, seed {seed}"
            + ("" if steps is None else f", {steps} steps"),
        },
    }


def _identify(writer: _Writer) -> None:
    customer, desk = writer.customer, writer.desk
    by_email, by_name = desk.tool("identify")
    if writer.rng.random() < 0.6:
        writer.user(_GIVE_EMAIL)
        writer.call([(by_email, {"email": customer.email}, customer.id)])
    else:
        writer.user(_GIVE_NAME)
        args = {
            "first_name": customer.first_name,
            "last_name": customer.last_name,
            "postcode": customer.postcode,
        }
        writer.call([(by_name, args, customer.id)])
    (profile,) = desk.tool("profile")
    writer.call([(profile, {"customer_id": customer.id}, _profile(writer))])


def _profile(writer: _Writer) -> dict[str, Any]:
    c = writer.customer
    return {
        "customer_id": c.id,
        "name": {"first_name": c.first_name, "last_name": c.last_name},
        "email": c.email,
        "address": {
            "line1": c.street,
            "city": c.city,
            "postcode": c.postcode,
            "country": c.country,
        },
        "payment_methods": list(c.payment_methods),
        f"{writer.desk.record_word}s": list(writer.records),
        "member_since": f"20{writer.rng.randint(15, 25)}-0{writer.rng.randint(1, 9)}-15",
    }


def _task(writer: _Writer) -> None:
    """Look records up (sometimes several at once), then answer or make a confirmed change.
    Ends with an assistant message to the customer."""
    rng, desk = writer.rng, writer.desk
    (lookup,) = desk.tool("record")
    key = lookup.params[0][0]
    wide = rng.random() < 0.2 and len(writer.records) > 1
    chosen = rng.sample(
        list(writer.records), rng.randint(2, min(3, len(writer.records))) if wide else 1
    )
    writer.call([(lookup, {key: rid}, writer.records[rid]) for rid in chosen])
    if rng.random() < 0.35:
        info = rng.choice(desk.tool("info"))
        args = _arguments(info, writer, chosen[0])
        writer.call([(info, args, desk.answer_info(rng, info.name, args, writer.customer))])
    record = writer.records[chosen[0]]
    if rng.random() < 0.4:
        writer.say(_ANSWER, record=desk.describe(record), tail=rng.choice(_ANSWER_TAIL))
        return
    action = rng.choice(desk.tool("action"))
    args = _arguments(action, writer, chosen[0])
    details = ", ".join(f"{k.replace('_', ' ')} {_spoken(v)}" for k, v in args.items())
    writer.say(
        _PROPOSE,
        record=desk.describe(record),
        action=action.name.replace("_", " "),
        details=details,
        effect=rng.choice(_EFFECT),
    )
    writer.user(_CONFIRM)
    changed = desk.apply_action(action.name, record, args)
    writer.records[chosen[0]] = changed
    writer.call([(action, args, changed)])
    writer.say(_DONE, word=desk.record_word, record_id=chosen[0], status=changed["status"])


def _spoken(value: Any) -> str:
    if isinstance(value, list):
        return " and ".join(str(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(str(v) for v in value.values())
    return str(value)


def _arguments(tool: ToolSpec, writer: _Writer, record_id: str) -> dict[str, Any]:
    args = {}
    for name, kind, _ in tool.params:
        if name in tool.optional and writer.rng.random() < 0.5:
            continue
        args[name] = _value(name, kind, writer, record_id)
    return args


def _value(name: str, kind: str, writer: _Writer, record_id: str) -> Any:
    rng, customer = writer.rng, writer.customer
    record = writer.records[record_id]
    known = _known(customer, record_id)
    if name in known:
        return known[name]
    if kind.startswith("enum:"):
        return rng.choice(kind[5:].split("|"))
    if name == "item_ids":
        items = record.get("items") or []
        return [item["item_id"] for item in rng.sample(items, rng.randint(1, len(items)))]
    if name == "new_item_ids":
        return [f"it_{rng.randint(1_000_000, 9_999_999)}"]
    if name == "address":
        return {
            "line1": f"{rng.randint(1, 99)} Canal Walk",
            "line2": f"Apartment {rng.randint(1, 40)}",
            "city": customer.city,
            "postcode": str(rng.randint(10000, 99999)),
            "country": customer.country,
        }
    if name == "expression":
        prices = [f"{p:.2f}" for _, _, p in rng.sample(writer.desk.item_pool, 3)]
        return " + ".join(prices)
    return _plain(name, kind, rng)


def _known(customer: Customer, record_id: str) -> dict[str, Any]:
    return {
        "customer_id": customer.id,
        "email": customer.email,
        "first_name": customer.first_name,
        "last_name": customer.last_name,
        "postcode": customer.postcode,
        "country": customer.country,
        "order_id": record_id,
        "line_id": record_id,
        "refund_method_id": customer.payment_id,
        "payment_method_id": customer.payment_id,
    }


def _plain(name: str, kind: str, rng: random.Random) -> Any:
    if kind == "int":
        return rng.randint(2, 14)
    if kind == "bool":
        return rng.random() < 0.3
    values = {
        "query": rng.choice(("salt road", "lighthouse letters", "atlas of bread", "lichens")),
        "gift_card_code": "".join(rng.choices(string.ascii_uppercase + string.digits, k=16)),
        "month": f"2026-{rng.randint(6, 10):02d}",
        "plan_id": rng.choice(("plan_flex_10", "plan_plus_30", "plan_unl_5g", "plan_basic_2")),
        "charge_id": f"ch_{rng.randint(10000, 99999)}",
        "reason": "I never signed up for this service and did not use it.",
        "summary": "Customer asks for help the tools cannot give; identity verified.",
    }
    return values.get(name, f"{name}-{rng.randint(100, 999)}")
