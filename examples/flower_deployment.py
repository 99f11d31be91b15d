"""
A deployment with Flower: what the operator prepares and what each device holds
===============================================================================

``fedcf.flower`` is a Flower app: a ServerApp that runs the estimator's own round loop with
Flower messages as its client work, and a ClientApp on each node (a SuperNode) that holds that
node's users' ratings. This tutorial prepares a two-device deployment with TLS and node
authentication, shows what lands where, and fits in this process the model the deployment
would train, bit for bit. Needs ``pip install "fedcf[flower]"``.

Starting the processes themselves (a SuperLink, two SuperNodes, ``flwr run``) takes a minute;
the user guide's Flower page walks through it, and ``python scripts/flower_deploy.py
--device-data`` does it end to end.
"""

import json
import tempfile
from pathlib import Path

from fedcf.benchmarks import flower_deploy
from fedcf.flower import fit_in_process

folder = Path(tempfile.mkdtemp(prefix="fedcf_deploy_"))

# %%
# What the operator prepares
# --------------------------
# ``--prepare`` writes a throw-away certificate authority and the SuperLink's certificate,
# a key pair per SuperNode, each device's own ratings file and the public catalog, the Flower
# app with its run config, and the ``flwr`` connection; it prints the commands that start it all.
# With ``--warm`` each SuperNode runs with ``--isolation process`` beside one long-lived
# ``python -m fedcf.flower.warm`` process that answers all its messages (no process start per
# message).
flower_deploy.main(["--prepare", "--device-data", "--warm", "--nodes", "2", "--folder",
                    str(folder)])

for path in sorted(p for p in folder.rglob("*") if p.is_file()):
    print(f"{path.relative_to(folder)}  ({path.stat().st_size:,} bytes)")

# %%
# What a device holds, and what the server sends it
# -------------------------------------------------
# Each device keeps its users' ratings in its own file; the server never names them. The
# server's first message carries the public catalog; the device maps its items into it and
# leaves out (and logs) ratings of other items. The node's only configuration is its own:
# where its data is, and, if its owner wants, its privacy rules (``min-cohort``, ``threshold``,
# ``noise-multiplier``, ...), which no server message can change.
device = (folder / "devices" / "device0" / "ratings.csv").read_text().splitlines()
print(device[0], f"... {len(device) - 1} ratings on device 0")
config = (folder / "app" / "pyproject.toml").read_text()
print(config[config.index("[tool.flwr.app.config]"):].strip())

# %%
# The model the deployment trains
# -------------------------------
# Clients' random streams depend only on (seed, round, user) and the server aggregates in a
# fixed order, so the deployment fits the same model as this in-process fit with the run's
# parameters and data: ``scripts/flower_deploy.py`` checks the item factors bit for bit.
raw = next(line.split("=", 1)[1].strip() for line in config.splitlines()
           if line.startswith("fedcf-params"))
params = json.loads(json.loads(raw))  # a TOML string holding the estimator's JSON parameters
data = {"dataset": "synthetic", "synthetic-users": 200, "synthetic-items": 60,
        "synthetic-ratings": 4000}
model, recon_eval, seconds = fit_in_process(params, data, 0.1)
print(f"in process: {model.n_rounds} rounds in {seconds:.2f} s; federated ReconEval {recon_eval}")
