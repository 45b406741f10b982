"""The CLI's commands that do work: data fetch, the demo, devices, doctor, evaluate, profile, Redis
ACLs."""
