"""Which process of a run this is: process 0, the chief, alone writes the run's files.

    if is_chief(): ...                 # files.py, rundir.py and plots.py write on the chief only
    count, index = process_count(), process_index()

One process unless several train as one (harness/processes.py joins them and sets `PROCESS`). Nothing
imported here, so that every module that writes can ask.
"""

PROCESS = dict(count=1, index=0)  # set when processes.join() joins several processes


def process_count():
    """How many processes train together (1 unless JAX_* variables or TF_CONFIG name several)."""
    return PROCESS["count"]


def process_index():
    """This process's place among them, 0 .. process_count() - 1."""
    return PROCESS["index"]


def is_chief():
    """Whether this process writes the run's files (checkpoints, metrics, config.json): process 0."""
    return PROCESS["index"] == 0
