"""The hosts' room of launch/: what runs on a job's other hosts, and how the launcher reaches them.

- ``agent`` (`taiji join`): one more host's agent, starting and reaping its workers on the
  controller's signed orders;
- ``agent_channel``: the job-store keys an agent and the controller talk through; ``remote``: the
  driver's side of them (the other hosts it addresses); ``tether``: the TCP line whose closing
  tells at once that the controller or an agent is gone;
- ``drain`` (`taiji drain`): a preemption notice to this host's agents;
- ``slurm``, ``slurm_task``: `srun`'s tasks (`taiji run --slurm`, `taiji join --slurm`);
- ``ray``: a Ray cluster's nodes as the job's hosts (`taiji run --ray`).

Imports between launch/'s rooms run one way. The job's room (launch/'s top level: run, driver,
takeover, ...) imports this one: its driver addresses the agents through ``remote`` and
``agent_channel``. The live scheduler's room (launch/sched/) imports it too: its Ray pool connects
through ``ray.nodes`` and places ``ray.agent``'s actor. This room imports neither: what an agent
needs of the job's room, taking the job over when its controller dies (which builds a driver), is
handed to it by the entry point (launch/cli.py, the one part that opens every room's doors).

The scheduler's own Ray parts (launch/sched/ray_pool.py, ray_jobs.py, ray_actor.py) stay in the
scheduler's room: they are a kind of its job hosts, built on launch/sched/hosts.py's launcher
helpers, so here they would have this room import the scheduler's while the scheduler imports this
one. tests/unit/test_architecture.py checks the rooms and their doors.
"""
