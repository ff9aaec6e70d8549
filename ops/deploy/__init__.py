"""Deployment files: a 3-node JetStream cluster, leaf nodes for GPU hosts, systemd units.

`cluster.toml` describes the cluster; `render.py` turns it and the run folder's
credentials into nats-server configurations (`kfactory deploy`), so the users and their
permissions are always those of `ops/accounts.py`, never a copy that can drift.
"""
