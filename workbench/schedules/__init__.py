"""Pipeline schedules: the order in which each device runs its operations, and what that order does over time.

A plan's ``schedule`` is ``periodic`` (start times that repeat every period) or a flushed schedule (GPipe,
1F1B and torch's multi-stage schedules: micro-batches, then a flush). This package builds, orders and
simulates them; :mod:`workbench.planners` choose the plans, :mod:`workbench.verify` judges them and
:mod:`workbench.runtime` runs them.

* :mod:`~workbench.schedules.ops`: the op record every schedule produces (stage, kind, micro-batch, time);
* :mod:`~workbench.schedules.registry`: every schedule a plan can name, what it is (periodic or flushed, its
  layout, its order's source, its engine), derived from :mod:`workbench.methods`: every module asks it;
* :mod:`~workbench.schedules.builder` places the operations of a periodic plan for a fixed allocation and
  finds its least period under the memory limit (:mod:`~workbench.schedules.builder_host`: with offloaded
  activations on the host link);
* :mod:`~workbench.schedules.torch_orders`: torch's multi-stage schedules, their order read from torch's own
  classes, and :mod:`~workbench.schedules.order_memory`: each device's peak read off an order;
* :mod:`~workbench.schedules.simulate` runs a plan event by event into a :class:`~workbench.model.trace.Trace`
  (:mod:`~workbench.schedules.simulate_memory`: its memory rows; :mod:`~workbench.schedules.simulate_orders`:
  a flushed schedule given as an order per device);
* :mod:`~workbench.schedules.program`: every schedule's per-device order (a periodic plan unrolled, a flushed
  schedule's flushes), the programs a run executes, and their abstract replay.
"""
