"""The spine of a federated run.

``module`` (the Lightning glue: a round is one training step) → ``round`` (sampling, dispatch, the
distributed exchange) → ``local`` (a client's local steps, evaluation) → ``aggregation`` (streaming
weighted sums); ``types`` holds what travels between them, ``state`` the client state store,
``checkpoint`` fingerprints and atomic writes, ``metrics`` the task metrics, ``distributed`` the
process-group collectives. Nothing here imports ``strategies`` or ``callbacks`` at module level except
``module``, the top of the spine, which defaults to FedAvg.
"""
