"""The live cluster scheduler's processes: ``taiji sched`` (cli), its daemon, the agents on other
hosts, the signed request channel and where jobs run (hosts). Its decisions are pure, in
:mod:`taiji.sched.scheduler`."""
