"""toolrl/Bank-v0: a stateful multi-turn customer-service env (in the spirit of tau-bench).

Each episode gets its own in-memory database (customers, accounts, transactions), seeded from
the task row. The agent serves a scripted customer who reveals information one line per
assistant text turn (first the intent, then identity, then the request, then goodbye); the
conversation ends on the agent's first text turn after the customer's last line.

Tools read and mutate the database. Hard rules are enforced by the tools (they raise
``PolicyError``, which the model sees as a ``tool_exception`` observation): verify identity
before touching a customer's data, act only on the verified customer's accounts, no overdraft.
One rule is policy only, stated in the system prompt and checked by the outcome: no single
transfer above $2,000.00 (and no splitting). Success means the final database equals the
row's ``expected_state`` exactly.

Row fields: ``id``, ``category`` (the scenario kind), ``db`` (initial database),
``user_script`` (the customer's lines, first one is the opening message), ``ground_truth``
(the gold tool calls), ``expected_state``, ``oracle`` (the scripted agent's turns).
"""

from __future__ import annotations

import copy
import random
from typing import Any

from toolrl import ParseResult, ToolCall, ToolEnv, ToolResult, Turn, tasks_by_kind, tool

TRANSFER_LIMIT_CENTS = 200_000
SCENARIOS = ("internal_transfer", "external_transfer", "update_email", "over_limit",
             "overdraft")
SYSTEM_PROMPT = (
    "You are a bank support agent. Policy: verify the customer's identity (customer id and "
    "date of birth) before anything else. Act only on accounts of the verified customer. "
    "Never transfer more than $2000.00 in one transfer, and never split a larger transfer. "
    "Refuse requests that break the policy."
)
_FIRST = ["Ana", "Bo", "Chen", "Dara", "Eli", "Fay", "Gio", "Hal", "Ida", "Jon", "Kai", "Lea"]
_LAST = ["Moss", "Ng", "Ortiz", "Park", "Quinn", "Ruiz", "Shah", "Tran", "Ueda", "Vega"]


class PolicyError(Exception):
    """A bank rule refused the request (shown to the model as a tool_exception)."""


def money(cents: int) -> str:
    return f"${cents / 100:.2f}"


def to_cents(amount: float) -> int:
    cents = round(amount * 100)
    if abs(amount * 100 - cents) > 1e-6:
        raise ValueError("amounts have at most two decimals")
    return cents


# --- pure database operations (used by the tools and by the task generator) ------------------
def apply_transfer(db: dict[str, Any], source: str, target: str, cents: int) -> dict[str, Any]:
    accounts = db["accounts"]
    if source not in accounts or target not in accounts:
        raise PolicyError(f"unknown account {source if source not in accounts else target!r}")
    if source == target:
        raise PolicyError("source and target accounts are the same")
    if cents <= 0:
        raise PolicyError("the amount must be positive")
    if accounts[source]["balance_cents"] < cents:
        raise PolicyError(f"insufficient funds in {source}")
    accounts[source]["balance_cents"] -= cents
    accounts[target]["balance_cents"] += cents
    record = {"id": f"T{len(db['transactions']) + 1}", "from": source, "to": target,
              "amount_cents": cents}
    db["transactions"].append(record)
    return record


def apply_email(db: dict[str, Any], customer_id: str, email: str) -> None:
    if "@" not in email or email.startswith("@") or email.endswith("@"):
        raise ValueError(f"not an email address: {email!r}")
    db["customers"][customer_id]["email"] = email


def make_db(rng: random.Random) -> dict[str, Any]:
    customers: dict[str, Any] = {}
    accounts: dict[str, Any] = {}
    ids = rng.sample(range(1000, 10000), 4)
    for cid_num in ids:
        cid = f"C{cid_num}"
        first, last = rng.choice(_FIRST), rng.choice(_LAST)
        customers[cid] = {"name": f"{first} {last}",
                          "dob": f"{rng.randint(1950, 2002)}-{rng.randint(1, 12):02d}-"
                                 f"{rng.randint(1, 28):02d}",
                          "email": f"{first.lower()}.{last.lower()}@mail.test"}
        for kind in ("checking", "savings"):
            aid = f"A{rng.randint(10000, 99999)}"
            while aid in accounts:
                aid = f"A{rng.randint(10000, 99999)}"
            accounts[aid] = {"customer_id": cid, "type": kind,
                             "balance_cents": rng.randint(50_00, 5_000_00)}
    return {"customers": customers, "accounts": accounts, "transactions": []}


def _accounts_of(db: dict[str, Any], cid: str) -> dict[str, str]:
    return {a["type"]: aid for aid, a in db["accounts"].items() if a["customer_id"] == cid}


def make_task(rng: random.Random, kind: str) -> dict[str, Any]:
    """One scenario: initial db, the customer's script, gold calls, expected state, oracle."""
    if kind not in SCENARIOS:
        raise ValueError(f"unknown Bank scenario {kind!r}; valid: {', '.join(SCENARIOS)}")
    db = make_db(rng)
    cid, other = rng.sample(sorted(db["customers"]), 2)
    mine, theirs = _accounts_of(db, cid), _accounts_of(db, other)
    dob = db["customers"][cid]["dob"]
    identity = f"My customer ID is {cid} and my date of birth is {dob}."
    verify = ToolCall("verify_identity", {"customer_id": cid, "date_of_birth": dob})
    gold: list[ToolCall] = [verify]
    after: list[Any]  # oracle turns after verification
    if kind in ("internal_transfer", "external_transfer"):
        source = mine["checking"]
        target = mine["savings"] if kind == "internal_transfer" else theirs["checking"]
        balance = db["accounts"][source]["balance_cents"]
        cents = rng.randint(1, min(balance, TRANSFER_LIMIT_CENTS) // 100) * 100
        opening = "Hi, I'd like to move some money."
        request = (f"Please transfer {money(cents)} from my checking account {source} to "
                   + ("my savings account" if kind == "internal_transfer" else "account")
                   + f" {target}.")
        call = ToolCall("transfer", {"from_account": source, "to_account": target,
                                     "amount": cents / 100})
        gold.append(call)
        after = [[call], f"Done: {money(cents)} moved from {source} to {target}."]
    elif kind == "update_email":
        email = f"{rng.choice(_FIRST).lower()}{rng.randint(1, 99)}@new.test"
        opening = "Hi, I need to change my email address."
        request = f"Please change my email to {email}."
        call = ToolCall("update_email", {"customer_id": cid, "email": email})
        gold.append(call)
        after = [[call], f"Your email is now {email}."]
    elif kind == "over_limit":
        source, target = mine["checking"], mine["savings"]
        cents = rng.randint(TRANSFER_LIMIT_CENTS // 100 + 1, 5000) * 100
        db["accounts"][source]["balance_cents"] = cents + rng.randint(0, 1000) * 100
        opening = "Hi, I'd like to move some money."
        request = (f"Please transfer {money(cents)} from my checking account {source} to my "
                   f"savings account {target}.")
        after = ["I'm sorry, I cannot make a transfer above $2000.00."]
    else:  # overdraft
        source, target = mine["savings"], mine["checking"]
        balance = db["accounts"][source]["balance_cents"] = rng.randint(10, 500) * 100
        cents = min(balance + rng.randint(1, 500) * 100, TRANSFER_LIMIT_CENTS)
        opening = "Hi, I'd like to move some money."
        request = (f"Please transfer {money(cents)} from my savings account {source} to my "
                   f"checking account {target}.")
        check = ToolCall("get_balance", {"account_id": source})
        gold.append(check)
        after = [[check], f"I'm sorry, {source} does not have enough funds for that transfer."]
    expected = copy.deepcopy(db)
    for call in gold:
        if call.name == "transfer":
            apply_transfer(expected, call.arguments["from_account"],
                           call.arguments["to_account"], to_cents(call.arguments["amount"]))
        elif call.name == "update_email":
            apply_email(expected, call.arguments["customer_id"], call.arguments["email"])
    oracle = ["I can help. Please give me your customer ID and date of birth.", [verify],
              "Thank you, you are verified. What can I do for you?", *after,
              "You're welcome. Goodbye!"]
    return {"category": kind, "db": db,
            "user_script": [opening, identity, request, "Thanks, that's all."],
            "ground_truth": [c.to_dict() for c in gold], "expected_state": expected,
            "oracle_turns": [t if isinstance(t, str) else [c.to_dict() for c in t]
                             for t in oracle]}


class BankEnv(ToolEnv):
    """A bank support conversation with a scripted customer; see the module docstring."""

    system_prompt = SYSTEM_PROMPT
    default_max_turns = 16

    def __init__(self, *, scenarios: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scenarios = list(scenarios or SCENARIOS)
        self.db: dict[str, Any] = {}
        self.verified: set[str] = set()
        self.user_lines: list[str] = []

    @classmethod
    def make_tasks(cls, n: int, seed: int = 0, split: str = "train",
                   scenarios: list[str] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
        return tasks_by_kind(make_task, scenarios or SCENARIOS, n, seed=seed, split=split,
                             name="bank", prefix="bank")

    def sample_task(self) -> dict[str, Any]:
        seed = int(self.np_random.integers(2**31 - 1))
        return self.make_tasks(1, seed=seed, scenarios=self.scenarios)[0]

    def setup(self, row: dict[str, Any]) -> None:
        for key in ("db", "user_script"):
            if key not in row:
                raise ValueError(f"a Bank row needs {key!r}; got keys {sorted(row)}")
        self.db = copy.deepcopy(row["db"])
        self.db.setdefault("transactions", [])
        self.verified = set()
        self.user_lines = list(row["user_script"][1:])

    def initial_messages(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"role": "system", "content": self.system_prompt},
                {"role": "user", "content": row["user_script"][0]}]

    # --- policy helpers --------------------------------------------------------------------
    def _customer(self, customer_id: str) -> dict[str, Any]:
        if customer_id not in self.db["customers"]:
            raise PolicyError(f"no customer {customer_id!r}")
        if customer_id not in self.verified:
            raise PolicyError(f"identity of {customer_id} is not verified")
        return self.db["customers"][customer_id]

    def _own_account(self, account_id: str) -> dict[str, Any]:
        account = self.db["accounts"].get(account_id)
        if account is None:
            raise PolicyError(f"no account {account_id!r}")
        self._customer(account["customer_id"])
        return account

    # --- tools -----------------------------------------------------------------------------
    @tool(inline=True)
    def verify_identity(self, customer_id: str, date_of_birth: str) -> str:
        """Verify a customer's identity.

        Args:
            customer_id: e.g. C1234
            date_of_birth: YYYY-MM-DD
        """
        customer = self.db["customers"].get(customer_id)
        if customer is None or customer["dob"] != date_of_birth.strip():
            raise PolicyError("identity could not be verified")
        self.verified.add(customer_id)
        return f"verified {customer_id} ({customer['name']})"

    @tool(inline=True)
    def get_customer(self, customer_id: str) -> dict:
        """Profile of a verified customer.

        Args:
            customer_id: e.g. C1234
        """
        customer = self._customer(customer_id)
        return {"customer_id": customer_id, "name": customer["name"], "email": customer["email"]}

    @tool(inline=True)
    def list_accounts(self, customer_id: str) -> list:
        """Accounts of a verified customer.

        Args:
            customer_id: e.g. C1234
        """
        self._customer(customer_id)
        return [{"account_id": aid, "type": a["type"], "balance": money(a["balance_cents"])}
                for aid, a in self.db["accounts"].items() if a["customer_id"] == customer_id]

    @tool(inline=True)
    def get_balance(self, account_id: str) -> dict:
        """Balance of an account of the verified customer.

        Args:
            account_id: e.g. A12345
        """
        account = self._own_account(account_id)
        return {"account_id": account_id, "balance": money(account["balance_cents"])}

    @tool(inline=True)
    def transfer(self, from_account: str, to_account: str, amount: float) -> dict:
        """Transfer money from the verified customer's account.

        Args:
            from_account: source account id (the customer's)
            to_account: target account id
            amount: in dollars, e.g. 125.50
        """
        self._own_account(from_account)
        record = apply_transfer(self.db, from_account, to_account, to_cents(amount))
        return {"transaction_id": record["id"], "status": "completed",
                "amount": money(record["amount_cents"])}

    @tool(inline=True)
    def update_email(self, customer_id: str, email: str) -> str:
        """Change a verified customer's email address.

        Args:
            customer_id: e.g. C1234
            email: the new address
        """
        self._customer(customer_id)
        apply_email(self.db, customer_id, email)
        return f"email of {customer_id} updated"

    @tool(inline=True)
    def list_transactions(self, account_id: str) -> list:
        """Transactions touching an account of the verified customer.

        Args:
            account_id: e.g. A12345
        """
        self._own_account(account_id)
        return [{"id": t["id"], "from": t["from"], "to": t["to"],
                 "amount": money(t["amount_cents"])}
                for t in self.db["transactions"] if account_id in (t["from"], t["to"])]

    # --- episode logic ---------------------------------------------------------------------
    def on_turn(self, parse: ParseResult, results: list[ToolResult]) -> Turn:
        mistakes = sum(not r.ok for r in results) + len(parse.errors)
        penalty = -0.1 * mistakes if mistakes else 0.0
        if parse.calls or parse.errors:
            return Turn(reward=penalty)
        if not self.user_lines:  # the customer has said goodbye: the conversation is over
            return Turn(terminated=True, reward=penalty)
        line = self.user_lines.pop(0)
        return Turn(messages=[{"role": "user", "content": line}], reward=penalty)

    def state_snapshot(self) -> dict[str, Any]:
        return copy.deepcopy(self.db)

    def evaluate(self) -> bool:
        return self.state_snapshot() == self.row.get("expected_state")

    def oracle_action(self) -> str:
        turns = self.row.get("oracle_turns") or []
        if self.turn >= len(turns):
            return "Goodbye!"
        step = turns[self.turn]
        if isinstance(step, str):
            return step
        return self.render_calls([ToolCall(c["name"], c["arguments"]) for c in step])
