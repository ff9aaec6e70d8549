"""Following the event stream in order: the fast path (an ordered push consumer).

The recorder, `kfactory run` and `kfactory events tail` all read `KF_EVENTS` this way:
no acks, flow control for back-pressure, and a consumer that is re-created by the client
after any gap, so messages arrive once each and in stream order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy

from bus.connection import jetstream
from bus.subjects import STREAM

Handler = Callable[[Msg], Awaitable[None]]


class Following:
    """A live ordered subscription; `stop()` ends it."""

    def __init__(self, subscription: object) -> None:
        self._subscription = subscription

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self._subscription.unsubscribe()  # type: ignore[attr-defined]


async def follow(
    nc: Client,
    subject: str,
    handler: Handler,
    *,
    start_sequence: int | None = None,
    new_only: bool = False,
    pending_msgs: int = 512 * 1024,
    pending_bytes: int = 256 * 1024 * 1024,
) -> Following:
    """Deliver every message of KF_EVENTS on `subject` to `handler`, in stream order:
    from `start_sequence`, or only those published from now (`new_only`), else all."""
    if start_sequence is not None:
        policy, config = (
            DeliverPolicy.BY_START_SEQUENCE,
            ConsumerConfig(opt_start_seq=start_sequence),
        )
    else:
        policy, config = (DeliverPolicy.NEW if new_only else DeliverPolicy.ALL), None
    subscription = await jetstream(nc).subscribe(
        subject,
        stream=STREAM,
        ordered_consumer=True,
        deliver_policy=policy,
        config=config,
        idle_heartbeat=2.0,
        cb=handler,
        pending_msgs_limit=pending_msgs,
        pending_bytes_limit=pending_bytes,
    )
    return Following(subscription)


__all__ = ["Following", "Msg", "follow"]
