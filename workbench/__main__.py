import sys

from workbench.front import is_out_of_memory

try:
    from workbench.front.cli import main
except (MemoryError, ImportError, OSError) as e:    # a memory cap refused even the command line's imports
    if not is_out_of_memory(e):
        raise
    sys.stderr.write("error: out of memory: this process may not use enough memory to start (a memory cap, "
                     "ulimit -v); nothing was written. Raise the cap\n")
    raise SystemExit(3)

raise SystemExit(main())
