"""Algorithms: the federated estimators (FedRecon explicit and implicit, FedAvg, FURL, FedMF,
PFedRec, FedNCF), their client programs and client-side phase objects (client update,
reconstruction, support/query split, item space), and learned round hyperparameters."""
