from fastapi import Depends, FastAPI

from stormguard.asgi import ConcurrencyMiddleware, IdempotencyMiddleware, RateLimitMiddleware, Rule
from stormguard.fastapi import install, stormguard_limit

STORE = "memory://"  # or "redis://127.0.0.1:6379/0" so every worker shares the limits

app = FastAPI()
install(app)  # refusals as bare RFC 9457 problem documents

# Per route: 10 searches a minute per API key, quota headers on every answer.
search_limit = stormguard_limit("10/minute", key="header:X-API-Key", store=STORE)


@app.get("/search", dependencies=[Depends(search_limit)])
async def search(q: str = "") -> dict[str, str]:
    return {"q": q}


@app.post("/payments", status_code=201)
async def pay(payment: dict[str, int]) -> dict[str, int]:
    return {"charged": payment["amount"]}


# Whole app (outermost last): shed load, limit per client and globally, then
# execute each keyed POST once per tenant.
app.add_middleware(IdempotencyMiddleware, store=STORE, scope="header:X-API-Key")
app.add_middleware(
    RateLimitMiddleware,
    rules=[
        Rule("100/minute", key="header:X-API-Key"),
        Rule("1000/second", key="global"),
    ],
    store=STORE,
    headers="both",
    on_store_error="local",
)
app.add_middleware(ConcurrencyMiddleware, limit=100, per_client=20, key="header:X-API-Key")

if __name__ == "__main__":  # python examples/fastapi_app.py
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=8000)
