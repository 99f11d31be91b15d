"""Executors: where a cohort's client work runs besides this process (``LocalExecutor`` is the
round's own): Ray shards that hold the population. An executor carries the aggregator's client
job (``SecureJob``) to its clients and knows nothing else of secure aggregation."""
