"""taiji's cluster scheduler: trace-driven models, workloads, an event-driven simulator and
policies (docs/design.md#cluster-scheduler, docs/reference/scheduler-model.md).

- :mod:`taiji.sched.model` — application ground truth from Pollux's measured traces (step time by
  placement and batch, statistical efficiency from the gradient noise scale), goodput, Pollux's
  throughput model, taiji's allreduce model and the paper family's parameter-server time.
- :mod:`taiji.sched.workload` — Pollux workload CSVs and a seeded Philly-shaped generator.
- :mod:`taiji.sched.cluster` — hosts, allocations, the capacity check, placement helpers.
- :mod:`taiji.sched.policy` — the ``Policy`` protocol and the ``JobView`` a policy is shown.
- :mod:`taiji.sched.sim` — the simulator (see its docstring).
- :mod:`taiji.sched.policies` — FIFO, elastic DRF, Tiresias, Optimus, a Pollux-like optimiser, SRTF.
- :mod:`taiji.sched.fidelity` — our baselines against Pollux's published average JCTs.

The shipped trace data (``taiji/sched/data``) is Apache-2.0, from the Pollux artifact; see the
README there.
"""
