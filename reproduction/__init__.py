"""The reproduction of the papers' claims and its verification: what `reproduce.py` runs, on top of the
scripts. No training run imports this package (tests/test_module_graph.py); train_nmt.py and
pretrain_bert.py import it inside their --sweep branch alone. Outside the code fingerprint
(harness/rundir.py): nothing here can move a run's numbers.

    experiments.py   the Results table's experiments as data: their runs (specs with a seeds axis), the
                     rows that judge them, their results/ folders and figures; the fair-test protocols of
                     results/protocols.md as stages; the scripts' sweeps
    runner.py        each run a Ray task in a process of its own, on a local instance or a cluster, started
                     and taken in by one loop (`drive`)
    worker.py        one run's process (python -m reproduction.worker JOB DIR FLAGS)
    sweeps.py        a sweep's runs as tasks, and its tables and figures
    campaign.py      reproduce.py's plan, its runs in stages, publishing into results/, the verdicts
    tables.py        the README's Results table and the results pages, from results/: every rule
                     (`python results/tables.py`)
    certify.py       reproduce.py --certify: the numerics check that keeps rows current across a refactor
                     (its steps, their outputs, the measured code taken out of git)
    changes.py       which fingerprinted statements changed since a measured code, and whether the check ran them
    certificates.py  the outputs the check recorded on each host, and the certificates it writes, which the
                     tables read
"""
