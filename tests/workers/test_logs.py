"""JSON log lines carry the job, device, task and task id of the Celery task that wrote them."""

import io
import json
import logging

from celery import Celery

from edgetrain.workers.processes.logs import JsonFormatter, TaskContext


def test_a_task_s_lines_name_its_job_device_task_and_id() -> None:
    app = Celery("logs-test", set_as_current=False)
    app.conf.task_always_eager = True
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(TaskContext())
    logger = logging.getLogger("edgetrain.test.logs")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    @app.task(name="edgetrain.finetune")
    def finetune(payload: dict) -> None:
        logger.info("step down to %d Hz", 76800000)
        try:
            raise RuntimeError("lost")
        except RuntimeError:
            logger.exception("failed")

    try:
        result = finetune.apply(args=[{"job_id": "3f2a9c", "device_id": "nano-1"}], task_id="task-1")
        logger.warning("outside any task")
    finally:
        logger.removeHandler(handler)
    assert result.successful()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines[0] | {"time": None, "process": None} == {
        "time": None, "process": None, "level": "INFO", "logger": "edgetrain.test.logs", "message": "step down to 76800000 Hz",
        "job_id": "3f2a9c", "device_id": "nano-1", "task_name": "edgetrain.finetune", "task_id": "task-1",
    }  # fmt: skip
    assert lines[1]["task_id"] == "task-1" and "RuntimeError: lost" in lines[1]["exception"]
    assert "job_id" not in lines[2] and "task_id" not in lines[2] and lines[2]["message"] == "outside any task"


def test_celery_s_own_lines_about_a_task_name_it_and_a_device_worker_names_its_device() -> None:
    record = logging.LogRecord("celery.worker.strategy", logging.INFO, __file__, 1, "Task %(name)s[%(id)s] received", None, None)
    record.data = {"id": "task-2", "name": "edgetrain.profile_device"}
    TaskContext(device_id="nano-7").filter(record)
    line = json.loads(JsonFormatter().format(record))
    assert (line["task_id"], line["task_name"], line["device_id"]) == ("task-2", "edgetrain.profile_device", "nano-7")


def test_celery_s_own_lines_about_a_task_name_its_job_from_its_arguments() -> None:
    record = logging.LogRecord("celery.worker.strategy", logging.INFO, __file__, 1, "Task received", None, None)
    record.data = {"id": "task-3", "name": "edgetrain.finetune[3f2a9c/nano-1]",
                   "args": "[{'job_id': '3f2a9c', 'device_id': 'nano-1', 'lr': {'rule': 'sqrt'}, 'seed': None}]"}  # fmt: skip
    TaskContext().filter(record)
    assert (record.job_id, record.device_id, record.task_name, record.task_id) == ("3f2a9c", "nano-1", "edgetrain.finetune", "task-3")
    shortened = logging.LogRecord("celery.app.trace", logging.INFO, __file__, 1, "Task succeeded", None, None)
    shortened.data = {"id": "task-4", "name": "edgetrain.finetune", "args": "[{'job_id': '3f2a9c', 'devi...'"}
    TaskContext().filter(shortened)
    assert (shortened.job_id, shortened.task_id) == (None, "task-4")
