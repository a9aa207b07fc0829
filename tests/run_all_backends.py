"""Run the whole test suite once per installed Keras backend (jax, tensorflow, torch).

Keras picks its backend once per process, so each backend gets its own pytest process:

    python tests/run_all_backends.py            # extra arguments go to pytest, e.g. -k schedules
    python tests/run_all_backends.py --jobs 1   # one backend at a time, its output as it comes

`--jobs N` (default 3) runs up to N backends side by side, each with max(1, cores / N) threads for its
kernels (the OpenMP, TensorFlow and XLA thread pools). Much of a test waits on a process it started, or is
single-threaded (tracing, compiling, Python), so on 2 cores three processes side by side finish sooner than
two. On a 2-core AMD EPYC host, alone, with a cold jax compilation cache (as in CI): two at a time took
2,299 s (tensorflow 2,013 s beside jax 2,171 s, then torch 286 s), three at a time 1,999 s and 2,069 s in
two runs (torch 454-472 s, tensorflow 1,945-1,955 s, jax 1,998-2,069 s). Splitting each backend's files
over more processes (seven, three at a time) took 1,977 s: no gain, so a backend's tests stay in one
process. Those times are of an earlier layout, in which tensorflow's process held reproduce.py --smoke.
With the tests that run once spread over the three processes (docs/testing.md), three at a time took
1,710 s (tensorflow 1,710 s, jax 1,700 s, torch 1,220 s), on the same host, alone, with an empty cache
folder (XDG_CACHE_HOME). Each backend's output is
printed whole when it ends (with `--jobs 1`, as it comes). A backend whose package is not installed is
reported and skipped; at least one must be installed. Exit status 0 only if every backend's run passed. The
last line sums the counts of all runs.
"""

import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time

# In this order when --jobs is below 3: tensorflow and jax side by side first, torch (which holds
# reproduce.py --smoke) in the first place that frees.
BACKENDS = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from reproduction.runner import thread_env  # noqa: E402  (cores / jobs threads for each backend side by side)
COUNTS = (("passed", r"(\d+) passed"), ("failed", r"(\d+) failed"), ("skipped", r"(\d+) skipped"),
          ("errors", r"(\d+) errors?"))


def installed_backends():
    return [name for name, module in BACKENDS.items() if importlib.util.find_spec(module) is not None]


def split_jobs(argv):
    """(`--jobs N` taken out of argv, the rest for pytest)."""
    argv, jobs = list(argv), 3
    for flag in ("--jobs", "-j"):
        if flag in argv:
            i = argv.index(flag)
            try:
                jobs = int(argv[i + 1])
            except (IndexError, ValueError):
                jobs = 0
            if jobs < 1:
                sys.exit(f"run_all_backends.py: {flag} needs a positive integer, e.g. {flag} 1")
            del argv[i:i + 2]
    return jobs, argv


def start(backend, argv, jobs):
    """pytest on `backend` in its own process, one of `jobs` side by side: its output to this terminal (one job)
    or to a temporary file."""
    live = jobs == 1
    out = None if live else tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "tests", "-p", "no:cacheprovider", *argv], cwd=ROOT,
                            env=dict(os.environ, KERAS_BACKEND=backend, **(thread_env(jobs) if jobs > 1 else {})),
                            text=True,
                            stdout=subprocess.PIPE if live else out, stderr=subprocess.STDOUT)
    return proc, out, time.time()


def finish(backend, proc, out, started):
    """Wait for one backend's run and print its output (unless it went to the terminal already); returns
    (exit code, the pytest summary line)."""
    summary = ""
    if out is None:
        print(f"\n===== KERAS_BACKEND={backend} =====", flush=True)
        for line in proc.stdout:
            print(line, end="", flush=True)
            summary = line if re.search(r"\d+ (passed|failed|error)", line) else summary
        code = proc.wait()
    else:
        code = proc.wait()
        out.seek(0)
        text = out.read()
        out.close()
        print(f"\n===== KERAS_BACKEND={backend} ({time.time() - started:.0f} s) =====\n{text}", end="", flush=True)
        summary = next((line for line in reversed(text.splitlines()) if re.search(r"\d+ (passed|failed|error)", line)), "")
    return code, summary


def main(argv):
    jobs, argv = split_jobs(argv)
    backends = installed_backends()
    missing = sorted(set(BACKENDS) - set(backends))
    if missing:
        print(f"not installed, skipped: {', '.join(missing)} (see the README, 'Backends')")
    if not backends:
        print("no Keras backend is installed: pip install -r requirements.txt", file=sys.stderr)
        return 2
    totals = dict.fromkeys(("passed", "failed", "skipped", "errors"), 0)
    failed_backends, waiting, running = [], list(backends), {}
    if jobs > 1:
        print(f"running {', '.join(backends)}, {jobs} at a time; each backend's output follows when it ends", flush=True)
    while waiting or running:
        while waiting and len(running) < jobs:
            backend = waiting.pop(0)
            running[backend] = start(backend, argv, jobs)
        done = next((b for b, (proc, _, _) in running.items() if proc.poll() is not None), None) if jobs > 1 \
            else next(iter(running))
        if done is None:
            time.sleep(1)
            continue
        code, summary = finish(done, *running.pop(done))
        if code != 0:
            failed_backends.append(done)
        for key, pattern in COUNTS:
            match = re.search(pattern, summary)
            totals[key] += int(match.group(1)) if match else 0
    print(f"\nbackends run: {', '.join(backends)}; failed: {', '.join(failed_backends) or 'none'}")
    print(f"{totals['passed']} passed, {totals['failed'] + totals['errors']} failed, {totals['skipped']} skipped")
    return 1 if failed_backends else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
