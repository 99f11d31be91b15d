"""The benchmark scripts, installed as ``fedcf.benchmarks`` (run by ``fedcf benchmark``)."""
