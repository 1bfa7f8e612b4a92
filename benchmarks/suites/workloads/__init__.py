"""The contest suite's workloads (``run.py contest --workload NAME``): what is trained, and by whom.

A workload is two modules. ``NAME.py``, read by the suite (it imports no MXNet):
``NAME`` (the results' name and ``run.py``'s alias), ``CONTEST`` (a
:class:`harness.contest.Contest`: the contenders' labels, the reference, the cells'
fields), ``ALL_CONTENDERS`` (and ``EXTRA_CONTENDERS``, run only when named),
``MODES``, ``CELLS``, ``parse_cells``, ``samples(mode, cell)``, ``CELLS_HELP``,
``targets(rows)`` and ``VERDICT`` (or ``verdict(check)``); and where it needs them,
``OPTIONS`` (switches of its own), ``contenders(names, mode, mxoid_root, named)`` (those
it leaves out, and why), ``configure(plan, args, mode)``, ``passes(run)`` (its own work
after the contest: the fields it adds to the report, and its processes), ``run_targets
(rows, fields, mode)``, ``tables(data)`` (its Markdown after the contest's table),
``CHECK_FIELDS`` and ``SETTINGS``. ``NAME_contenders.py``, run in the workers
(:mod:`harness.worker`): ``CONTENDERS`` (name -> ``f(spec, iterator, init, clock)``
returning the final parameters) and ``prepare(spec)``.
"""
