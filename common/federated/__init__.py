"""Federated fine-tuning: one model trained in rounds by a heterogeneous, power-capped fleet.

spec.py: the federated job spec; partition.py: seeded IID, label-shard and Dirichlet splits of a
dataset over the devices; plan.py: each device's (b, f*_b) under its cap and its local work per
round (time-balanced or equal steps); rounds.py: local training, FedAvg (FedProx's proximal
term as an option) and evaluation of the global model; simulate.py: a fleet of twins in one
process, for `edgetrain evaluate`.
"""
