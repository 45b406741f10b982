"""The long-lived processes: Celery workers, the local cluster, Flower, the exporter, heartbeats and
logs."""
