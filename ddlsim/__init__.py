"""ddlsim: predict and search distributed deep-learning training strategies.

Layers, each importing only those below it::

    service     the command line, the REST API, the job worker, the dashboard
    workflows   the use cases: predict, search (and verify), execute, profile, validate
    search      strategy spaces and the search algorithms
    simulator   replay, GNN and blend cost models; their training and evaluation
    profiler    graph capture, kernel and collective profiling, the emulated cluster
    executor    a strategy applied to real torch.distributed training, measured
    data        specs, the graph format, the store, the shipped datasets
"""
