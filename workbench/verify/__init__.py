"""Is a plan valid, what does it do over time: the checker, the schedule builder and the simulator.

* :mod:`~workbench.verify.check` re-checks a plan against the validity rules of docs/model.md ("Plan"),
  with its own re-derivation of memory (:mod:`~workbench.verify.check_memory`), of activation policies
  (:mod:`~workbench.verify.check_policies`) and of flushed schedules (:mod:`~workbench.verify.check_flushed`:
  a replay of their order, period and memory);
* :mod:`~workbench.verify.schedule` builds the periodic schedule of a fixed allocation and its best
  period under memory (:mod:`~workbench.verify.schedule_host`: with offloaded activations);
* :mod:`~workbench.verify.simulate` runs a plan event by event (periodic, or flushed as GPipe and
  1F1B) into a :class:`~workbench.model.trace.Trace` (:mod:`~workbench.verify.simulate_memory`: its
  memory rows; :mod:`~workbench.verify.simulate_orders`: torch's multi-stage schedules, in torch's order).
"""
