"""The queue contract: the Celery app, the tasks, the job workflow and the client."""
