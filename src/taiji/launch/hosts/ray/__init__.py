"""`taiji run --ray`: a Ray cluster's nodes as a job's other hosts.

``nodes``: the flags, the checks and the placing of one agent actor per node (the job's host
provider); ``agent``: that actor, which runs `taiji join` on its node; ``gang``: a job's first
hosts placed all at once (one placement group). Ray is imported only when ``--ray`` is given. The
live scheduler's Ray pool (launch/sched/ray_*.py) connects through ``nodes`` and places ``agent``.
"""
