"""Named steps of the notification paths where chaos tests act: the seam of
:mod:`dfpubsub.testing.crash`.

``after_send`` and ``after_set_aside`` are df-notify's (an endpoint acknowledged a batch not
yet removed; entries were dead-lettered and removed), ``after_reserve`` and
``after_store_write`` a writer's whose queues live apart from its store (its notifications are
reserved and its store write not made yet; its store write is made and its notifications not
committed yet). Empty in production, so each step costs one dict lookup; a test arms a step
to kill the process at that moment.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["STEP_HOOKS", "STEPS", "step"]

#: The steps that can be armed.
STEPS = ("after_send", "after_set_aside", "after_reserve", "after_store_write")
#: What runs at each armed step.
STEP_HOOKS: dict[str, Callable[[], None]] = {}


def step(name: str) -> None:
    """Run what is armed at step ``name``, if anything."""
    action = STEP_HOOKS.get(name)
    if action is not None:
        action()
