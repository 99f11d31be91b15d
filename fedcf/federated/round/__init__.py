"""The round: the contracts every phase object honours, the phases of one round (select, client
work, aggregate, server update), the loop that composes them, the divergence guard and its
blame, checkpoints, the fixed-order reduction of partial sums, and the server optimizers.
Nothing here knows an algorithm, an aggregator or an executor by name."""
