"""Deployments: a run turned into a scheduler's own objects (Swarm, Kubernetes, Slurm)."""
