"""The most a job spec or a task may ask for, so that one request cannot take a worker's
memory or the fleet's time without end. Every bound is a type used by the records that carry
it (common/schemas.py, common/payloads.py), so the client refuses a spec over a bound before
anything is enqueued and a worker refuses a raw task over it before doing anything.

How long a task may run is bounded separately, by the Celery time limits."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

MAX_BATCH_SIZE = 4096  # samples per step: far above what a Jetson's memory holds
MAX_BATCH_SIZES = 16  # batch sizes per job (each is profiled and trained on the proxy)
MAX_SEEDS = 16  # seeds per job (each multiplies the proxy runs)
MAX_SEED = 2**32 - 1  # what every random generator used accepts
MAX_SAMPLES = 10_000_000  # training budget per run (samples): 200 epochs of a 50 000-image set
MAX_PROFILE_BATCHES = 100  # warm-up or measured mini-batches per profiled (b, f) point
MAX_DEVICES = 10_000  # devices per job (a big job is planned in pages)
MAX_CAP_STEPS = 1000  # steps of a device's power cap schedule
MAX_NAME_CHARS = 256  # a model name, an artifact URL
MAX_PATH_CHARS = 1024  # a dataset path
MAX_EVENTS_KEPT = 2000  # the newest events kept in a job's log
STATUS_PARTS = 50  # parts `status` shows of a bigger job unless asked for others (and its newest events)
RECORDS_KEPT = 16  # parsed job records (and spec checks) a process keeps: each page step of a big job re-reads its job
MAX_NESTING = 32  # levels of lists and objects in a spec document (a job spec has 5)

BatchSize = Annotated[int, Field(gt=0, le=MAX_BATCH_SIZE)]
SampleCount = Annotated[int, Field(gt=0, le=MAX_SAMPLES)]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
ProfileBatches = Annotated[int, Field(le=MAX_PROFILE_BATCHES)]
