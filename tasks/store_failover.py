"""The store's failovers, as jobs see them: behind Redis Sentinel, once the master has moved,
every unfinished job gets an event saying so (once, from whichever control worker notices
first), so `edgetrain status` tells what happened to the Redis its work went through."""

from __future__ import annotations

import logging

from edgetrain.common.jobs.state import EventKind
from edgetrain.common.store import Store

logger = logging.getLogger(__name__)


def note_failover(store: Store) -> str | None:
    """Record a failover of the store since the last look in every unfinished job's events;
    returns what was recorded, None when the master has not moved (or there is no Sentinel)."""
    moved = store.monitoring.note_master()
    if moved is None:
        return None
    previous, current = moved
    message = (f"the store failed over: Redis Sentinel promoted {current} to master after {previous} stopped answering; "
               "the work went on")  # fmt: skip
    jobs = sorted(store.monitoring.unfinished_jobs())
    for job_id in jobs:
        store.jobs.event(job_id, EventKind.store_failover, message)
    logger.warning("%s (%d unfinished jobs told)", message, len(jobs))
    return message
