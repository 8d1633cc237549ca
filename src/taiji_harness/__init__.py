"""The harness shared by taiji's tests and benchmarks (not part of the ``taiji`` distribution: it
lives beside it under src/ and is importable from a checkout's editable install, ``make setup``).

- ``testing``: ranks as threads against a real store (``run_threads``), real jobs via `taiji run`
  (``taiji_run``), the helper scripts of tests/scripts (``load_script``), the elastic-invariant
  audits (``run_elastic``, ``check_invariants``), process-tree and socket inspection, ``HostsJob``;
- ``bench``: the benchmarks' processes (``Session``, ``run_to_end``, ``run_launcher``,
  ``run_workers``), repetitions, statistics and the JSON contract of
  docs/design.md#performance-targets (``contract_row``, ``print_result``);
- ``results``: the benchmarks' results as data (benchmarks/results/<benchmark>.json), which the
  docs' Benchmarks page is rendered from;
- ``netns``: emulated hosts (network namespaces) for the many-host tests and benchmarks;
- ``injector``: failures injected into real communicators of ranks run as threads.
- ``streams``: ``make test``'s two streams side by side (the tests that mostly wait beside the rest).
"""
