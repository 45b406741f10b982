"""The job path: a job's and its parts' state, the typed part events and their transition, the planner,
its effects, admission and reports."""
