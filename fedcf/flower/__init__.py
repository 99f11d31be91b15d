"""fedcf's federated estimators as a Flower app (optional extra ``fedcf[flower]``): a ClientApp
whose nodes hold their users' ratings (and, for FURL and the sampled-negative models, their
users' rows) and send only sparse item-row deltas, and a ServerApp running the estimator's own
round loop over them (selection, any fedcf aggregator, server optimizer, checkpoints, federated
ReconEval). FedRecon is the default (run config ``fedcf-model``); the fitted model is an
ordinary ``.npz`` of the estimator.

- ``client_app`` / ``server_app``: the apps (``make_client_app`` / ``make_server_app`` build
  variants, e.g. with Flower mods or fixed settings);
- ``write_app(directory, **run_config)``: the project ``flwr run`` takes;
- ``fit_in_process``: the same fit without Flower (what a run must reproduce);
- ``wire``: exactly what crosses the wire, and the checks of every reply.
"""

from .app import client_app, make_client_app, make_server_app, server_app, write_app
from .directory import Directory, FlowerPopulation
from .reference import fit_in_process
from .server import FlowerExecutor, serve
from .settings import Settings

__all__ = ["Directory", "FlowerExecutor", "FlowerPopulation", "Settings", "client_app",
           "fit_in_process",
           "make_client_app", "make_server_app", "serve", "server_app", "write_app"]
