"""toolrl/HttpApi-v0: tools are the endpoints of a real HTTP service (the store in service.py).

Each tool call is an ``httpx`` request with explicit timeouts, retried on connection errors
only (``httpx.AsyncHTTPTransport(retries=...)``), and read up to a response size cap. A 4xx/5xx
answer becomes an ``http_error`` observation; a slow answer a ``timeout``.

Point the env at a running service with ``base_url``; without one it serves the shipped app
itself on 127.0.0.1 (one uvicorn thread per process, started on first use). Every episode uses
a fresh session id (header ``X-Session``), so its orders and stock are its own.

Tasks: order a product found by category/price/name; success means the session's orders equal
``expected_state["orders"]`` at the end. Row fields: ``id``, ``category``, ``question``,
``ground_truth`` (gold calls), ``expected_state``.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import random
import threading
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
from toolrl.envs.http_api.service import CATALOG, CATEGORIES, ThreadedServer

from toolrl import Tool, ToolCall, ToolEnv, ToolFailure, make_tasks_by_kind

SYSTEM_PROMPT = ("You are a shopping assistant with access to a store API. Use the tools to do "
                 "what the user asks, then confirm briefly.")


@dataclass(frozen=True)
class Endpoint:
    """One HTTP endpoint exposed as a tool."""

    name: str
    method: str
    path: str
    description: str
    properties: dict[str, Any]
    required: tuple[str, ...] = ()

    @property
    def path_params(self) -> list[str]:
        return [p for p in self.properties if "{" + p + "}" in self.path]

    def schema(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description,
                "parameters": {"type": "object", "properties": self.properties,
                               "required": list(self.required)}}


ENDPOINTS = (
    Endpoint("search_products", "GET", "/products", "Search products.", {
        "category": {"type": "string", "enum": list(CATEGORIES)},
        "query": {"type": "string", "description": "words in the product name"},
        "max_price": {"type": "number", "description": "in dollars"}}),
    Endpoint("get_product", "GET", "/products/{sku}", "One product by SKU.",
             {"sku": {"type": "string"}}, ("sku",)),
    Endpoint("place_order", "POST", "/orders", "Order a product.", {
        "sku": {"type": "string"}, "quantity": {"type": "integer", "minimum": 1}},
        ("sku", "quantity")),
    Endpoint("list_orders", "GET", "/orders", "This session's orders.", {}),
    Endpoint("cancel_order", "DELETE", "/orders/{order_id}", "Cancel an order.",
             {"order_id": {"type": "string"}}, ("order_id",)),
    Endpoint("export_catalog", "GET", "/catalog/export", "The whole catalog as CSV.", {}),
)

_local: ThreadedServer | None = None
_local_lock = threading.Lock()


def local_service_url() -> str:
    """URL of the process-wide self-hosted store (started on first call, stopped at exit)."""
    global _local
    with _local_lock:
        if _local is None:
            _local = ThreadedServer().start()
            atexit.register(_local.stop)
        return _local.url


# --- tasks -------------------------------------------------------------------------------------
def _products(category: str | None = None) -> list[dict[str, Any]]:
    return [p for _, p in sorted(CATALOG.items()) if category is None or p["category"] == category]


def make_task(rng: random.Random, kind: str) -> dict[str, Any]:
    if kind == "cheapest":
        category = rng.choice(CATEGORIES)
        target = min(_products(category), key=lambda p: (p["price_cents"], p["sku"]))
        search = {"category": category}
        question = f"Order {{q}} of the cheapest product in the {category} category."
    elif kind == "budget":
        category = rng.choice(CATEGORIES)
        prices = sorted({p["price_cents"] for p in _products(category)})
        limit = rng.choice(prices[1:-1]) / 100
        target = max((p for p in _products(category) if p["price_cents"] <= limit * 100),
                     key=lambda p: (p["price_cents"], p["sku"]))
        search = {"category": category, "max_price": limit}
        question = (f"Order {{q}} of the most expensive {category} product that costs at most "
                    f"${limit:.2f}.")
    elif kind == "by_name":
        target = rng.choice(_products())
        search = {"query": target["name"]}
        question = f"Please order {{q}} of the '{target['name']}'."
    else:
        raise ValueError(f"unknown HttpApi task kind {kind!r}")
    quantity = rng.randint(1, min(3, target["stock"]))
    gold = [ToolCall("search_products", search),
            ToolCall("place_order", {"sku": target["sku"], "quantity": quantity})]
    return {"category": kind, "question": question.format(q=quantity),
            "ground_truth": [c.to_dict() for c in gold],
            "expected_state": {"orders": [{"sku": target["sku"], "quantity": quantity}]}}


class HttpApiEnv(ToolEnv):
    """Shopping over a real HTTP API.

    Args:
        base_url: the running store service; None serves the shipped app in-process.
        latency_ms: ask the service to delay each response (timeout tests).
        retries: retries on connection errors (never on HTTP errors or timeouts).
        max_response_bytes: response size cap; longer bodies are cut and marked.
        connect_timeout: seconds to establish a connection.
    """

    system_prompt = SYSTEM_PROMPT
    default_max_turns = 8
    KINDS = ("cheapest", "budget", "by_name")

    def __init__(self, *, base_url: str | None = None, latency_ms: float = 0.0,
                 retries: int = 2, max_response_bytes: int = 65536,
                 connect_timeout: float = 2.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base_url = base_url.rstrip("/") if base_url else None
        self.latency_ms = latency_ms
        self.retries = retries
        self.max_response_bytes = max_response_bytes
        self.connect_timeout = connect_timeout
        self.session = ""
        self.final_state: dict[str, Any] = {}
        self._http: httpx.AsyncClient | None = None
        self._http_loop: asyncio.AbstractEventLoop | None = None

    make_tasks = make_tasks_by_kind(make_task, name="http_api", prefix="http")

    def setup(self, row: dict[str, Any]) -> None:
        self.session = uuid.uuid4().hex
        self.final_state = {}

    def episode_tools(self) -> list[Tool]:
        return [Tool.from_schema(ep.schema(), self._endpoint_fn(ep)) for ep in ENDPOINTS]

    # --- HTTP ------------------------------------------------------------------------------
    def _url(self) -> str:
        if self.base_url is None:
            self.base_url = local_service_url()
        return self.base_url

    def _client(self) -> httpx.AsyncClient:
        """One client per event loop (httpx clients must not cross loops)."""
        loop = asyncio.get_running_loop()
        if self._http is None or self._http_loop is not loop:
            self._http = httpx.AsyncClient(
                base_url=self._url(),
                transport=httpx.AsyncHTTPTransport(retries=self.retries),
                timeout=httpx.Timeout(self.tool_timeout, connect=self.connect_timeout))
            self._http_loop = loop
        return self._http

    def _endpoint_fn(self, ep: Endpoint):
        async def call(**arguments: Any) -> str:
            return await self.request(ep, arguments)

        return call

    async def request(self, ep: Endpoint, arguments: dict[str, Any]) -> str:
        """Call one endpoint; returns the body text, raises ToolFailure on HTTP errors."""
        client = self._client()
        path = ep.path.format(**{p: quote(str(arguments[p]), safe="") for p in ep.path_params})
        rest = {k: v for k, v in arguments.items() if k not in ep.path_params}
        headers = {"X-Session": self.session}
        if self.latency_ms:
            headers["X-Delay-Ms"] = str(self.latency_ms)
        kwargs: dict[str, Any] = {"json": rest} if ep.method in ("POST", "PUT") else {
            "params": rest}
        chunks: list[bytes] = []
        size, cut = 0, False
        try:
            async with client.stream(ep.method, path, headers=headers, **kwargs) as response:
                async for chunk in response.aiter_bytes():
                    room = self.max_response_bytes - size
                    if len(chunk) > room:
                        chunks.append(chunk[:room])
                        cut = True
                        break
                    chunks.append(chunk)
                    size += len(chunk)
        except httpx.TimeoutException as exc:
            raise ToolFailure("timeout", f"{ep.method} {path} timed out "
                                         f"({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise ToolFailure("http_error", f"{ep.method} {path} failed: "
                                            f"{type(exc).__name__}: {exc}",
                              infra=True) from exc  # unreachable: not the policy's fault
        text = b"".join(chunks).decode("utf-8", errors="replace")
        if response.status_code >= 400:
            raise ToolFailure("http_error", f"HTTP {response.status_code}: {text[:200]}")
        if cut:
            text += f"...[response cut at {self.max_response_bytes} bytes]"
        return text

    async def aevaluate(self) -> bool:
        orders_ep = next(ep for ep in ENDPOINTS if ep.name == "list_orders")
        try:
            orders = json.loads(await self.request(orders_ep, {}))["orders"]
        except (ToolFailure, ValueError, KeyError):
            self.final_state = {"orders": None}
            return False
        self.final_state = {"orders": [{"sku": o["sku"], "quantity": o["quantity"]}
                                       for o in orders]}
        return self.final_state == self.row.get("expected_state")

    def state_snapshot(self) -> dict[str, Any]:
        return dict(self.final_state)

    def oracle_action(self) -> str:
        gold = self.row["ground_truth"]
        if self.turn < len(gold):
            call = gold[self.turn]
            return self.render_calls([ToolCall(call["name"], call["arguments"])])
        return "Your order is placed."

    async def aclose(self) -> None:
        client, self._http = self._http, None
        if client is not None:
            await client.aclose()

    def close(self) -> None:
        client, loop = self._http, self._http_loop
        if client is not None and loop is not None and not loop.is_closed():
            if loop is self._sync_loop:
                loop.run_until_complete(self.aclose())
            elif loop.is_running():
                loop.call_soon_threadsafe(lambda: loop.create_task(client.aclose()))
        self._http = None
        super().close()
