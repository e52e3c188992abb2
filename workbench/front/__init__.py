"""The front: the command line and the handler of every command.

* :mod:`~workbench.front.cli`: the parser of ``python -m workbench`` and its entry point;
* :mod:`~workbench.front.planning`: ``plan``, ``check`` and ``simulate``;
* :mod:`~workbench.front.profiling`: ``profile`` and ``profile-info``;
* :mod:`~workbench.front.running`: ``run`` (a plan on torch.distributed against its prediction);
* :mod:`~workbench.front.studies`: ``reproduce`` and ``largest``;
* :mod:`~workbench.front.demo`: ``demo`` (``make demo``).

Handlers are imported when their command runs, so that ``--help`` stays quick.
"""

import errno

__all__ = ["is_out_of_memory"]

#: what the dynamic loader says when a memory cap refuses to map a library (an ImportError, not a MemoryError)
_LOADER_OUT_OF_MEMORY = ("failed to map segment", "cannot allocate memory")


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is the process running out of memory: a ``MemoryError``, an ``OSError``
    ENOMEM, or an import whose library a memory cap kept from loading (``ulimit -v``: numpy's import then fails
    with "failed to map segment").

    >>> is_out_of_memory(MemoryError()), is_out_of_memory(ImportError("x.so: failed to map segment from shared object"))
    (True, True)
    >>> is_out_of_memory(ValueError("bad"))
    False
    """
    seen = 0
    while exc is not None and seen < 20:
        if isinstance(exc, MemoryError) or (isinstance(exc, OSError) and exc.errno == errno.ENOMEM):
            return True
        if isinstance(exc, (ImportError, OSError)) and any(s in str(exc).lower() for s in _LOADER_OUT_OF_MEMORY):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False

