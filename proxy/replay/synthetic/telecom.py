"""The mobile network desk: lines, plans, data, roaming, bills, repairs."""

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

ADDONS = (
    ("Unlimited calls and texts", "feat_calls", 0.0),
    ("5G access", "feat_5g", 0.0),
    ("EU roaming", "feat_eu", 0.0),
    ("Voicemail to e-mail", "addon_vm", 1.00),
    ("Music streaming bundle", "addon_music", 7.99),
    ("Device insurance", "addon_insure", 9.50),
    ("Extra 5 GB data", "addon_5gb", 10.00),
    ("Caller ID block", "addon_cid", 0.50),
    ("Wi-Fi calling", "feat_wifi", 0.0),
    ("International minutes pack", "addon_intl", 6.00),
)
PLANS = (  # (plan id, name, monthly price, data GB, contract months)
    ("plan_basic_2", "Basic 2 GB", 8.00, 2, 0),
    ("plan_flex_10", "Flex 10 GB", 15.00, 10, 0),
    ("plan_plus_30", "Plus 30 GB", 22.00, 30, 24),
    ("plan_unl_5g", "Unlimited 5G", 35.00, None, 24),
    ("plan_kids_1", "Junior 1 GB", 5.00, 1, 0),
    ("plan_biz_50", "Business 50 GB", 29.00, 50, 12),
)
_CHARGES = (
    *(name for name, _, _ in ADDONS),
    "Roaming, world zone, 3 days",
    "Premium SMS service",
    "Late payment fee",
    "Plan change, pro rata",
)
_PHONES = ("Aster 12", "Kestrel S3", "Nimbus Mini", "Corvid Pro 5")


def _plan(entry: tuple[str, str, float, int | None, int]) -> dict[str, Any]:
    plan_id, name, price, data, months = entry
    return {
        "plan_id": plan_id,
        "name": name,
        "monthly_price": price,
        "data_gb": data,
        "contract_months": months,
    }


def _line(rng: random.Random, customer: Customer, line_id: str) -> dict[str, Any]:
    plan = _plan(rng.choice(PLANS[:4]))
    addons = [
        {"addon_id": code, "name": name, "monthly_price": price}
        for name, code, price in rng.sample(ADDONS, rng.randint(3, 6))
    ]
    allowance = plan["data_gb"] or 100
    return {
        "line_id": line_id,
        "customer_id": customer.id,
        "phone_number": f"+31 6 {rng.randint(1000, 9999)} {rng.randint(1000, 9999)}",
        "status": rng.choice(("active", "active", "active", "suspended")),
        "plan": plan,
        "contract_end": day(rng, 2027) if plan["contract_months"] else None,
        "addons": addons,
        "usage_this_cycle": {
            "data_gb": round(rng.uniform(0.1, allowance), 2),
            "minutes": rng.randint(0, 900),
            "texts": rng.randint(0, 300),
            "roaming_days": rng.randint(0, 4),
        },
        "device": {
            "model": rng.choice(_PHONES),
            "serial": f"SN{rng.randint(10**9, 10**10 - 1)}",
            "warranty_until": day(rng, 2027),
        },
    }


def _info(rng: random.Random, tool: str, args: dict[str, Any], customer: Customer) -> Any:
    if tool == "list_available_plans":
        plans = PLANS if args.get("include_business") else PLANS[:5]
        return [_plan(plan) for plan in plans]
    if tool == "get_bill":
        amounts = [round(rng.uniform(0.5, 30.0), 2) for _ in range(rng.randint(4, 8))]
        charges = [
            {
                "charge_id": f"ch_{rng.randint(10000, 99999)}",
                "description": rng.choice(_CHARGES),
                "amount": amount,
            }
            for amount in amounts
        ]
        return {
            "bill_id": f"bill_{rng.randint(100000, 999999)}",
            "month": args.get("month"),
            "due_on": day(rng),
            "paid": rng.random() < 0.6,
            "charges": charges,
            "total": round(sum(amounts), 2),
        }
    if tool == "get_usage_history":
        months = max(1, min(int(args.get("months") or 3), 12))
        return [
            {
                "month": f"2026-{10 - n:02d}",
                "data_gb": round(rng.uniform(0.5, 40), 2),
                "minutes": rng.randint(20, 900),
                "texts": rng.randint(0, 300),
            }
            for n in range(months)
        ]
    return evaluate_sum(str(args.get("expression", "0")))


def _describe(line: dict[str, Any]) -> str:
    plan = line["plan"]
    addons = ", ".join(f"{a['name']} ({a['monthly_price']:.2f})" for a in line["addons"])
    return (
        f"line {line['line_id']} ({line['phone_number']}, {line['status']}) on "
        f"{plan['name']} at {plan['monthly_price']:.2f} a month, with {addons}; "
        f"{line['usage_this_cycle']['data_gb']} GB used this cycle"
    )


TELECOM = Domain(
    name="telecom",
    company="Northwind Mobile, a mobile network",
    record_word="line",
    record_prefix="L-",
    policy="""# Mobile network support policy

## Lines and plans
A customer account holds one or more lines (phone numbers). Each line has exactly one plan \
and any number of add-ons. A line is active, suspended (by the customer or for unpaid \
bills) or closed. Check the line with a lookup before discussing its plan or usage.

## Changing plans
A line can move to any plan that is available to the account. Moving to a more expensive \
plan takes effect immediately and the difference for the rest of the cycle is charged pro \
rata on the next bill. Moving to a cheaper plan takes effect at the start of the next \
billing cycle. A line on a 24-month contract cannot move to a cheaper plan before the \
contract ends. Business plans are available only to accounts with a company number.

## Data packages
Extra data comes in packages of 1 GB (3.00), 5 GB (10.00) and 20 GB (25.00), valid until the \
end of the current cycle; unused data does not roll over. A suspended line cannot buy data. \
Packages are paid with a saved payment method and cannot be refunded once data was used.

## Roaming
Roaming in the EU zone is included in every plan. For the world zone, roaming is enabled \
per line for a number of days (1 to 30) at 4.50 per day, charged on the next bill; it is \
not available on lines with an unpaid bill.

## Bills and disputes
Bills are issued on the first day of each month and are due within 14 days. A customer \
can dispute a single charge within 60 days of the bill date; open a dispute with the \
charge id and the reason in the customer's words. While a dispute is open, the disputed \
amount is not due. Never promise the outcome of a dispute.

## Suspension and lost phones
A customer can suspend a line at once if the phone was lost or stolen; the line keeps its \
number and the plan keeps being charged. Reactivation needs a human colleague. Suspension \
for travel is possible for 1 to 3 months, once per year, at 2.00 per month.

## Devices and repairs
Phones bought from us are covered for two years against manufacturing faults. Open a repair \
ticket with the device serial number, a description of the fault and a return address; the \
customer receives a prepaid shipping label by e-mail. Water and screen damage are not \
covered: the customer pays the repair quote first.

## Numbers and porting
Porting a number away needs the porting code, which only a human colleague can issue after \
checking identity by phone. Transfer such requests.

## Contracts and early termination
A contract line can be closed before the contract ends against a fee of the remaining \
monthly device payments; the plan part is waived. Closing needs a human colleague: describe \
the fee from the line details, then transfer. Lines without a contract can be closed at the \
end of any cycle, also through a colleague.

## Family accounts
The account holder can add up to five lines. Each line's user may ask about their own \
usage, but only the account holder may change plans, buy packages or dispute charges. \
When someone other than the holder asks for a change, explain this kindly.

## Network problems
If a customer reports no signal or slow data, check the line's status and usage first: a \
suspended line or an exhausted allowance explains most cases. Otherwise suggest restarting \
the phone and checking that mobile data and roaming settings are on; if that does not help, \
transfer to a colleague, who can check the local network.
""",
    tools=(
        *FIND_TOOLS,
        ToolSpec(
            "get_line_details",
            "record",
            "Get a line: phone number, status, plan, add-ons, contract end date, this cycle's "
            "usage and the device registered on it.",
            (("line_id", "str", "The line id, starting with 'L-', such as 'L-40917'."),),
        ),
        ToolSpec(
            "list_available_plans",
            "info",
            "List the plans an account can move a line to, with monthly price, data allowance "
            "and contract length.",
            (
                ("customer_id", "str", "The customer id, such as 'ana_kovac_3021'."),
                ("include_business", "bool", "Also list business plans."),
            ),
            optional=("include_business",),
        ),
        ToolSpec(
            "get_bill",
            "info",
            "Get one month's bill for the account: every charge with its id, the total, the "
            "due date and whether it was paid.",
            (
                ("customer_id", "str", "The customer id, such as 'ana_kovac_3021'."),
                ("month", "str", "The billing month as 'YYYY-MM', such as '2026-10'."),
            ),
        ),
        ToolSpec(
            "change_plan",
            "action",
            "Move a line to another plan. Only after the customer confirmed the plan, the "
            "price and when it takes effect.",
            (
                ("line_id", "str", "The line id, such as 'L-40917'."),
                ("plan_id", "str", "The new plan's id, such as 'plan_unl_5g'."),
                ("effective", "enum:immediately|next_cycle", "When the change applies."),
            ),
        ),
        ToolSpec(
            "add_data_package",
            "action",
            "Buy a data package for a line, valid until the end of the cycle.",
            (
                ("line_id", "str", "The line id, such as 'L-40917'."),
                ("package", "enum:1GB|5GB|20GB", "The package size."),
                ("payment_method_id", "str", "The saved payment method, such as 'card_7731'."),
            ),
        ),
        ToolSpec(
            "enable_world_roaming",
            "action",
            "Enable world-zone roaming on a line for a number of days.",
            (
                ("line_id", "str", "The line id, such as 'L-40917'."),
                ("days", "int", "How many days, from 1 to 30."),
            ),
        ),
        ToolSpec(
            "suspend_line",
            "action",
            "Suspend a line at once, keeping its number.",
            (
                ("line_id", "str", "The line id, such as 'L-40917'."),
                ("reason", "enum:lost|stolen|travel", "Why the line is suspended."),
            ),
        ),
        ToolSpec(
            "dispute_charge",
            "action",
            "Open a dispute on one charge of a bill; the amount is not due while it is open.",
            (
                ("customer_id", "str", "The customer id, such as 'ana_kovac_3021'."),
                ("charge_id", "str", "The charge id from the bill, such as 'ch_88120'."),
                ("reason", "str", "The customer's reason, in their words."),
            ),
        ),
        ToolSpec(
            "get_usage_history",
            "info",
            "Get a line's data, call and text usage for each of the last months.",
            (
                ("line_id", "str", "The line id, such as 'L-40917'."),
                ("months", "int", "How many past months, from 1 to 12."),
            ),
        ),
        *COMMON_TOOLS,
    ),
    item_pool=ADDONS,
    openers=(
        "Hi, my bill this month is much higher than usual and I don't understand why. I "
        "haven't changed anything on my plan and I was home the whole month.",
        "Hello, I'm going to Canada for two weeks for work next Monday. What do I need to do "
        "to use my phone there, and how much will it cost me?",
        "Hi, I keep running out of data before the end of the month, usually around the 20th. "
        "What are my options? I don't want to pay a fortune.",
        "I think I lost my phone on the train this morning. Can you block my number before "
        "someone uses it? I'm calling from my partner's laptop.",
        "Hey, I'd like to switch my daughter's line to a cheaper plan. She hardly uses any "
        "data, she's mostly on Wi-Fi at home and at school.",
        "Hi, my phone won't charge anymore and it's only a year old. I bought it from you "
        "with my contract, so I hope it's still under warranty?",
    ),
    notes=(
        "Moving to a more expensive plan applies immediately, with the difference for the "
        "rest of this cycle charged pro rata on your next bill.",
        "Roaming in the EU zone is included; in the world zone it costs 4.50 per day, "
        "charged on your next bill.",
        "Extra data is valid until the end of the current cycle and unused data does not "
        "roll over to the next month.",
        "While a dispute is open, the disputed amount is not due, but I can't promise how "
        "it will be decided.",
    ),
    make_record=_line,
    answer_info=_info,
    status_after={
        "change_plan": "active",
        "add_data_package": "active",
        "enable_world_roaming": "active",
        "suspend_line": "suspended",
    },
    describe=_describe,
)
