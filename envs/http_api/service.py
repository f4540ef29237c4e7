"""The store service behind toolrl/HttpApi-v0: a small ASGI (Starlette) app.

Endpoints (JSON unless noted):

- ``GET /health``
- ``GET /products?category=&query=&max_price=``: search the catalog (sorted by SKU)
- ``GET /products/{sku}``
- ``POST /orders`` ``{"sku", "quantity"}``: place an order (stock is checked)
- ``GET /orders``, ``DELETE /orders/{order_id}``
- ``GET /catalog/export``: the whole catalog as CSV with long descriptions (a big response)

Orders and stock live per session (header ``X-Session``), so concurrent episodes never see each
other. ``X-Delay-Ms`` delays any response (tests of timeouts). Run it standalone with
``python -m toolrl.envs.http_api.service --port 0`` (prints the URL it listens on).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import socket
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

CATEGORIES = ("tools", "garden", "kitchen", "toys")
_ADJ = ["red", "steel", "mini", "pro", "quiet", "solar", "folding", "classic", "smart", "tiny"]
_NOUN = {"tools": ["hammer", "drill", "wrench", "saw", "level", "clamp"],
         "garden": ["hose", "rake", "shovel", "planter", "sprinkler", "trowel"],
         "kitchen": ["kettle", "whisk", "skillet", "grater", "blender", "ladle"],
         "toys": ["kite", "yo-yo", "robot", "puzzle", "top", "glider"]}
MAX_SESSIONS = 10_000


def make_catalog(seed: int = 0) -> dict[str, dict[str, Any]]:
    """The fixed product catalog: SKU -> product (prices in cents)."""
    rng = random.Random(f"store-catalog:{seed}")
    catalog: dict[str, dict[str, Any]] = {}
    for c, category in enumerate(CATEGORIES):
        adjectives = rng.sample(_ADJ, len(_NOUN[category]))
        for i, noun in enumerate(_NOUN[category]):
            sku = f"SKU-{c + 1}{i + 1:02d}"
            name = f"{adjectives[i]} {noun}"
            catalog[sku] = {"sku": sku, "name": name, "category": category,
                            "price_cents": rng.randint(3, 150) * 100 + rng.choice([0, 49, 99]),
                            "stock": rng.randint(3, 20),
                            "description": f"The {name}: " + " ".join(
                                rng.choice(_ADJ) for _ in range(60))}
    return catalog


CATALOG = make_catalog()


def public(product: dict[str, Any], stock: int | None = None) -> dict[str, Any]:
    return {"sku": product["sku"], "name": product["name"], "category": product["category"],
            "price": product["price_cents"] / 100,
            "stock": product["stock"] if stock is None else stock}


@dataclass
class Session:
    stock: dict[str, int] = field(default_factory=lambda: {k: p["stock"]
                                                           for k, p in CATALOG.items()})
    orders: dict[str, dict[str, Any]] = field(default_factory=dict)
    next_id: int = 1


def create_app() -> Starlette:
    """A fresh app with its own (empty) session store."""
    sessions: OrderedDict[str, Session] = OrderedDict()

    def session_of(request: Request) -> Session | None:
        key = request.headers.get("x-session")
        if not key:
            return None
        if key not in sessions:
            sessions[key] = Session()
            while len(sessions) > MAX_SESSIONS:
                sessions.popitem(last=False)
        sessions.move_to_end(key)
        return sessions[key]

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    async def delay(request: Request) -> None:
        try:
            ms = float(request.headers.get("x-delay-ms", "0"))
        except ValueError:
            ms = 0.0
        if ms > 0:
            await asyncio.sleep(min(ms, 60_000) / 1000)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def search(request: Request) -> Response:
        await delay(request)
        session = session_of(request)
        q = request.query_params
        category, query = q.get("category"), (q.get("query") or "").lower()
        try:
            max_price = float(q["max_price"]) if "max_price" in q else None
        except ValueError:
            return error(400, "max_price must be a number")
        found = [public(p, session.stock[k] if session else None)
                 for k, p in sorted(CATALOG.items())
                 if (not category or p["category"] == category)
                 and (not query or query in p["name"].lower())
                 and (max_price is None or p["price_cents"] <= round(max_price * 100))]
        return JSONResponse({"products": found})

    async def product(request: Request) -> Response:
        await delay(request)
        sku = request.path_params["sku"]
        if sku not in CATALOG:
            return error(404, f"no product {sku}")
        session = session_of(request)
        return JSONResponse(public(CATALOG[sku], session.stock[sku] if session else None))

    async def orders(request: Request) -> Response:
        await delay(request)
        session = session_of(request)
        if session is None:
            return error(400, "missing X-Session header")
        if request.method == "GET":
            return JSONResponse({"orders": list(session.orders.values())})
        try:
            body = await request.json()
        except ValueError:
            return error(400, "body must be JSON")
        sku, quantity = body.get("sku"), body.get("quantity")
        if sku not in CATALOG:
            return error(404, f"no product {sku}")
        if not isinstance(quantity, int) or isinstance(quantity, bool) or quantity < 1:
            return error(400, "quantity must be a positive integer")
        if session.stock[sku] < quantity:
            return error(409, f"only {session.stock[sku]} of {sku} in stock")
        session.stock[sku] -= quantity
        order_id = f"O-{session.next_id}"
        session.next_id += 1
        order = {"order_id": order_id, "sku": sku, "quantity": quantity,
                 "total": CATALOG[sku]["price_cents"] * quantity / 100}
        session.orders[order_id] = order
        return JSONResponse(order, status_code=201)

    async def cancel(request: Request) -> Response:
        await delay(request)
        session = session_of(request)
        if session is None:
            return error(400, "missing X-Session header")
        order = session.orders.pop(request.path_params["order_id"], None)
        if order is None:
            return error(404, f"no order {request.path_params['order_id']}")
        session.stock[order["sku"]] += order["quantity"]
        return JSONResponse({"cancelled": order["order_id"]})

    async def export(request: Request) -> Response:
        await delay(request)
        lines = ["sku,name,category,price,stock,description"]
        lines += [f"{p['sku']},{p['name']},{p['category']},{p['price_cents'] / 100:.2f},"
                  f"{p['stock']},{p['description']}" for _, p in sorted(CATALOG.items())]
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/csv")

    return Starlette(routes=[
        Route("/health", health),
        Route("/products", search),
        Route("/products/{sku}", product),
        Route("/orders", orders, methods=["GET", "POST"]),
        Route("/orders/{order_id}", cancel, methods=["DELETE"]),
        Route("/catalog/export", export),
    ])


app = create_app()


def bind(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening socket (port 0: a free port, no race between choosing and binding)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


class ThreadedServer:
    """The app served by uvicorn on a daemon thread (the env's self-hosted mode)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        self.sock = bind(host, port)
        self.url = f"http://{host}:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(create_app(), log_level="warning",
                                                    lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="toolrl-http-api", daemon=True)

    def start(self, timeout: float = 20.0) -> ThreadedServer:
        self.thread.start()
        self.thread.join(0)
        deadline = timeout
        while not self.server.started and deadline > 0 and self.thread.is_alive():
            self.thread.join(0.02)
            deadline -= 0.02
        if not self.server.started:
            raise RuntimeError(f"the store service did not start within {timeout} s")
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args = parser.parse_args(argv)
    sock = bind(args.host, args.port)
    print(f"listening on http://{args.host}:{sock.getsockname()[1]}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
