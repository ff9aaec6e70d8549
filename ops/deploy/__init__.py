"""Deployment files: a 3-node JetStream cluster, systemd units, the environment file.

`cluster.toml` describes the cluster; `render.py` turns it and the run folder's
credentials into nats-server configurations (`kfactory deploy`), so the users and their
permissions are always those of `ops/accounts.py`, never a copy that can drift.
`swarm.toml` is the example swarm file of `kfactory up` (`ops/swarm_file.py`).

`systemd/` holds the units: `kfactory-nats@NODE` (a node's or a leaf's rendered
configuration), `kfactory-server`, `kfactory-actor@ROLE` and `kfactory-swarm` (`kfactory
up`); the last three read `/etc/kfactory/kfactory.env`, whose shipped copy
(`kfactory.env`) shows every variable the code reads. tests/test_deploy_files.py checks
that `systemd-analyze verify` accepts the units, that their commands and options exist,
and that the environment file names exactly the variables the code reads.
"""
