"""The front: the command line and the handler of every command.

* :mod:`~workbench.front.cli`: the parser of ``python -m workbench`` and its entry point;
* :mod:`~workbench.front.planning`: ``plan``, ``check`` and ``simulate``;
* :mod:`~workbench.front.profiling`: ``profile`` and ``profile-info``;
* :mod:`~workbench.front.running`: ``run`` (a plan on torch.distributed against its prediction);
* :mod:`~workbench.front.studies`: ``reproduce`` and ``largest``;
* :mod:`~workbench.front.demo`: ``demo`` (``make demo``).

Handlers are imported when their command runs, so that ``--help`` stays quick.
"""
