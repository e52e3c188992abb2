"""The checker: is a plan valid? It re-derives everything a plan records and lists every rule it breaks.

Nothing here builds, simulates or runs a plan: the checker reads docs/model.md on its own and shares no
code with what it judges (the schedule builder and the simulators are in :mod:`workbench.schedules`).

* :mod:`~workbench.verify.check` re-checks a plan against the validity rules of docs/model.md ("Plan"),
  rules 0 to 8, with its own re-derivation of memory (:mod:`~workbench.verify.check_memory`), of activation
  policies (:mod:`~workbench.verify.check_policies`) and of flushed schedules
  (:mod:`~workbench.verify.check_flushed`: a replay of their layout, order, period and memory).
"""
