"""The Celery app: configuration, queues and routes.

Queues: `server` (proxy training, scaled by adding server workers), `device.<id>` (one per
device, concurrency 1) and `control` (the light job workflow).
"""

from __future__ import annotations

from celery import Celery

from edgetrain.common.settings import get_settings

SERVER_QUEUE = "server"
CONTROL_QUEUE = "control"


def device_queue(device_id: str) -> str:
    return f"device.{device_id}"


def broker_url(redis_url: str) -> str:
    """kombu spells a Unix-socket Redis URL redis+socket://."""
    return "redis+socket://" + redis_url.removeprefix("unix://") if redis_url.startswith("unix://") else redis_url


def create_app(redis_url: str) -> Celery:
    settings = get_settings()
    url = broker_url(redis_url)
    transport = {"visibility_timeout": settings.visibility_timeout_s}
    app = Celery("edgetrain", broker=url, backend=url, include=["edgetrain.tasks.device", "edgetrain.tasks.server", "edgetrain.tasks.workflow"])
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_transport_options=transport,
        result_backend_transport_options=transport,
        broker_connection_retry_on_startup=True,
        result_expires=7 * 24 * 3600,
        task_track_started=True,
        worker_send_task_events=True,
        task_send_sent_event=True,
        task_default_queue=CONTROL_QUEUE,
        task_routes={
            "edgetrain.estimate_relation_vector": {"queue": SERVER_QUEUE},
            "edgetrain.train_proxy": {"queue": SERVER_QUEUE},
            "edgetrain.pretrain": {"queue": SERVER_QUEUE},
            "edgetrain.advance_job": {"queue": CONTROL_QUEUE},
        },
    )
    return app


app = create_app(get_settings().redis_url)
