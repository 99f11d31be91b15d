"""Aggregators: the weighted mean (the summing aggregator), the clipped and robust means,
differential privacy around a summing aggregator (with its accountant), secure aggregation
(its server half, the device's part and the protocol), and the attacks they are tested with."""
