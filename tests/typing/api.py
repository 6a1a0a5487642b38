"""Typing checks of the public API: checked by mypy --strict (make types), never run."""

from __future__ import annotations

import asyncio
import random

import httpx
import requests

import stormguard
from stormguard.httpx import RetryTransport
from stormguard.requests import RetryAdapter


@stormguard.retry
def bare(x: int) -> str:
    return str(x)


@stormguard.retry(on=(OSError, TimeoutError), attempts=3, backoff=stormguard.EqualJitter(1, 5))
def configured(x: int, *, y: str = "") -> list[int]:
    return [x]


@stormguard.retry(on=lambda exc: isinstance(exc, OSError), deadline=5.0)
async def coroutine(x: int) -> float:
    await asyncio.sleep(0)
    return float(x)


def use() -> None:
    text: str = bare(1)
    numbers: list[int] = configured(2, y="z")
    value: float = asyncio.run(coroutine(3))
    policy = stormguard.RetryPolicy(attempts=2, backoff=stormguard.DecorrelatedJitter(0.1, 2))
    policy = policy.replace(max_wait=5)
    delay: float = stormguard.FullJitter().delay(1, random.Random(0))
    client = httpx.Client(transport=RetryTransport(policy=policy, idempotency_keys=True))
    aclient = httpx.AsyncClient(transport=RetryTransport(httpx.AsyncHTTPTransport()))
    session = requests.Session()
    session.mount("https://", RetryAdapter(policy=policy, pool_maxsize=4))
    hook_records: list[stormguard.RetryRecord] = []
    stormguard.retry(on_retry=hook_records.append)(bare)
    reason: str = stormguard.GiveUpReason.DEADLINE
    print(text, numbers, value, delay, client, aclient, reason)


def use_retrying() -> int:
    for attempt in stormguard.retrying(on=OSError, attempts=3):
        with attempt:
            number: int = attempt.number
            return number
    return 0


async def use_async_retrying() -> None:
    async for attempt in stormguard.retrying(on=(OSError,), deadline=1.0):
        with attempt:
            await asyncio.sleep(0)


@stormguard.retry(on=OSError, reraise=True, retry_if=lambda exc: None, deadline=None)
def reraising(x: int) -> int:
    return x


def use_retry_if() -> None:
    def not_bad_credentials(response: object) -> bool | None:
        return None

    RetryTransport(retry_if=not_bad_credentials)
    RetryAdapter(retry_if=not_bad_credentials)
    record = stormguard.RetryRecord(1, 0.5, "status 429", True, 0.5, 0.5, "GET /")
    body: str | None = record.body
    quota: stormguard.Quota | None = record.quota
    print(reraising(1), body, quota)


async def use_async_with_attempt() -> None:
    async for attempt in stormguard.retrying(on=OSError, reraise=True):
        async with attempt:
            await asyncio.sleep(0)
