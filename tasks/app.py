"""The Celery app. It is created bare on import (tasks register on it) and configured from
settings by the process's entry point (`configure`); producers that only send tasks, such as
the client, use an app of their own (`producer_app`), which imports no task module. Until it is
configured the app neither sends nor consumes (NotConfigured): Celery's own default broker
(amqp://localhost) would take the messages of a script that forgot to configure it."""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu import Connection

from edgetrain.common.redis_address import sentinel_address
from edgetrain.common.settings import Settings

from .contract import CONTROL_QUEUE, FIXED_ROUTES, TaskName
from .signing import enable_signing, signing_config
from .tls import tls_config
from .transport import reuse_redis_clients

TASK_MODULES = (
    "edgetrain.tasks.workflow",
    "edgetrain.tasks.federated",
    "edgetrain.tasks.server",
    "edgetrain.tasks.device",
    "edgetrain.tasks.federated_work",
)


class NotConfigured(RuntimeError):
    """The Celery app was used to send or consume before it was configured from the settings."""


class EdgeTrainCelery(Celery):
    """A Celery app that connects to a broker only once one is configured (NotConfigured)."""

    def _connection(self, url: str | None, *args: Any, **kwargs: Any) -> Connection:
        """Every broker connection (to send, to consume, for remote control) is made here."""
        if url is None:
            raise NotConfigured(
                f"the Celery app {self.main!r} is not configured, so it has no broker: configure it from the settings "
                "(EDGETRAIN_REDIS_URL) with edgetrain.tasks.context.init(edgetrain.common.settings.get_settings()), "
                "or send through EdgeTrainClient(EDGETRAIN_REDIS_URL)"
            )
        return super()._connection(url, *args, **kwargs)


app = EdgeTrainCelery("edgetrain", set_as_current=False)


def broker_url(redis_url: str) -> str:
    """The broker's (and result backend's) URL for `redis_url`: kombu spells a Unix-socket
    Redis URL redis+socket://, and a Sentinel address one sentinel:// URL per sentinel."""
    if (sentinels := sentinel_address(redis_url)) is not None:
        return sentinels.celery_url()
    return "redis+socket://" + redis_url.removeprefix("unix://") if redis_url.startswith("unix://") else redis_url


# kombu's wait before retry n is interval_start + n * interval_step, at most interval_max (s): about 30 s in all
PATIENT_PUBLISH = {"max_retries": 12, "interval_start": 0.1, "interval_step": 0.5, "interval_max": 4.0}


def celery_config(settings: Settings) -> dict[str, Any]:
    """Every Celery setting edgetrain relies on, the same in every process of a cluster."""
    url = broker_url(settings.redis_url)
    transport: dict[str, Any] = {"visibility_timeout": settings.visibility_timeout_s}
    if (sentinels := sentinel_address(settings.redis_url)) is not None:
        transport["master_name"] = sentinels.master_name
    return {
        "broker_url": url,
        "result_backend": url,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "worker_max_memory_per_child": settings.worker_max_memory_mb * 1024 or None,  # KiB of peak RSS (ru_maxrss)
        "broker_transport_options": transport,
        "result_backend_transport_options": transport,
        "broker_connection_retry_on_startup": True,
        "broker_channel_error_retry": True,  # an error reply (a full Redis) makes the worker reconnect, not stop
        "worker_consumer": "edgetrain.tasks.consumer:Consumer",  # drops malformed messages, waits out a full Redis
        "result_expires": 7 * 24 * 3600,
        "task_track_started": True,
        "task_store_errors_even_if_ignored": True,
        "worker_send_task_events": True,
        "task_send_sent_event": False,  # Flower learns of a task when a worker receives it, under its label
        "task_default_queue": CONTROL_QUEUE,
        "task_routes": {task.value: {"queue": queue} for task, queue in FIXED_ROUTES.items()},
        "task_annotations": time_limits(settings),
        **signing_config(settings),
        **tls_config(settings.redis_url),
    }


def time_limits(settings: Settings) -> dict[str, dict[str, int]]:
    """Hard and soft time limits (s) per task kind: the soft one raises inside the task, so it
    fails with the reason; the hard one ends its pool process."""

    def limits(hard_s: int) -> dict[str, int]:
        return {"time_limit": hard_s, "soft_time_limit": max(1, hard_s - min(60, hard_s // 10))}

    kinds = {
        TaskName.plan_submitted: settings.control_time_limit_s,
        TaskName.advance_job: settings.control_time_limit_s,
        TaskName.advance_page: settings.control_time_limit_s,
        TaskName.estimate_relation_vector: settings.control_time_limit_s,
        TaskName.profile_device: settings.profile_time_limit_s,
        TaskName.finetune: settings.training_time_limit_s,
        TaskName.train_proxy: settings.training_time_limit_s,
        TaskName.pretrain: settings.training_time_limit_s,
        TaskName.federated_advance: settings.control_time_limit_s,
        TaskName.federated_train: settings.training_time_limit_s,
        TaskName.federated_aggregate: settings.training_time_limit_s,
        TaskName.federated_cleanup: settings.control_time_limit_s,
    }
    return {task.value: limits(hard_s) for task, hard_s in kinds.items()}


def configure(settings: Settings, task_modules: tuple[str, ...] = TASK_MODULES) -> Celery:
    """Configure the worker app from `settings` and import the task modules it runs. A worker
    sends its tasks patiently, as its store writes (common/store/connection.py): a Redis restart
    holds a send up instead of failing the task that sends."""
    reuse_redis_clients()
    app.conf.update(celery_config(settings), task_publish_retry_policy=PATIENT_PUBLISH, include=list(task_modules))
    enable_signing(app, settings)
    app.loader.import_default_modules()
    return app


def producer_app(settings: Settings) -> Celery:
    """An app that sends tasks by name (no task module imported, so no PyTorch)."""
    reuse_redis_clients()
    producer = Celery("edgetrain-producer", set_as_current=False)
    producer.conf.update(celery_config(settings))
    enable_signing(producer, settings)
    return producer
