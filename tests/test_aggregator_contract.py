"""Every aggregator and the in-process executors against the contracts in fedcf.testing."""

from fedcf.federated import (
    CoordinateMedian,
    DifferentialPrivacy,
    DPGaussianMean,
    FoolsGoldMean,
    ItemNormalizedMean,
    LocalExecutor,
    NormClippedMean,
    SecureAggregation,
    TrimmedMean,
    WeightedMean,
)
from fedcf.federated.aggregators.attacks import AttackedExecutor
from fedcf.testing import AggregatorContract, ExecutorContract, contract_population  # noqa: F401


def _example():
    """examples/custom_phases.py, imported (its classes are a user's new phases)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "custom_phases.py"
    spec = importlib.util.spec_from_file_location("custom_phases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXAMPLE = _example()


class TestWeightedMean(AggregatorContract):
    make = staticmethod(WeightedMean)


class TestNormClippedMean(AggregatorContract):
    make = staticmethod(lambda: NormClippedMean(0.05))


class TestNormClippedMeanMedian(AggregatorContract):
    make = staticmethod(lambda: NormClippedMean("median", multiple=2.0))


class TestDPGaussianMean(AggregatorContract):
    # seeded noise: the contract compares two computations of the same round
    make = staticmethod(lambda: DPGaussianMean(0.1, 0.8, delta=1e-4, insecure_seeded_noise=True))


class TestDPGaussianMeanCapped(AggregatorContract):
    make = staticmethod(lambda: DPGaussianMean(0.1, target_epsilon=5.0, delta=1e-4,
                                               insecure_seeded_noise=True,
                                               weight_cap=4))


class TestItemNormalizedMean(AggregatorContract):
    make = staticmethod(lambda: ItemNormalizedMean(0.5))


class TestTrimmedMean(AggregatorContract):
    make = staticmethod(lambda: TrimmedMean(0.2, row_clip=0.1))


class TestCoordinateMedian(AggregatorContract):
    make = staticmethod(CoordinateMedian)


class TestFoolsGoldMean(AggregatorContract):
    make = staticmethod(FoolsGoldMean)


class TestSecureAggregation(AggregatorContract):
    make = staticmethod(lambda: SecureAggregation(value_bound=10.0))


class TestSecureAggregationWithDP(AggregatorContract):
    make = staticmethod(lambda: DifferentialPrivacy(SecureAggregation(value_bound=10.0), 0.1,
                                                    0.8, delta=1e-4))


class TestSecureAggregationWithDistributedDP(AggregatorContract):
    make = staticmethod(lambda: DifferentialPrivacy(SecureAggregation(value_bound=10.0), 0.1,
                                                    0.8, delta=1e-4, noise="distributed"))


class TestLocalExecutor(ExecutorContract):
    make = staticmethod(LocalExecutor)


class TestHonestAttackedExecutor(ExecutorContract):  # no malicious client: the local outputs
    make = staticmethod(lambda: AttackedExecutor("sign_flip", fraction=0.0))


class TestExampleShrunkMean(AggregatorContract):  # a user's aggregator: one class
    make = staticmethod(lambda: EXAMPLE.ShrunkMean(5.0))


class TestExampleTimedExecutor(ExecutorContract):  # a user's executor: one class
    make = staticmethod(EXAMPLE.TimedExecutor)


def test_the_contract_checks_name_what_failed_and_refuse_an_instance():
    """check_aggregator names the failing check as an AssertionError (pytest's own Failed is
    not an Exception), and an aggregator passed instead of a function that makes one is a
    TypeError saying what to pass."""
    import pytest

    from fedcf.testing import check_aggregator

    class Unchecked(WeightedMean):
        def __init__(self, shrink=1.0):
            self.shrink = shrink

    with pytest.raises(AssertionError, match="test_set_params_is_checked_when_bound failed"):
        check_aggregator(Unchecked)
    with pytest.raises(TypeError, match="make must be a function"):
        check_aggregator(WeightedMean())
