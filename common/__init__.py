"""The domain, no Celery: schemas, settings, the Redis store, devices, models, datasets, training,
profiling, estimation, selection and the job planner."""
