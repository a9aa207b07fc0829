"""Run the whole test suite once per installed Keras backend (jax, tensorflow, torch).

Keras picks its backend once per process, so each backend gets its own pytest process:

    python tests/run_all_backends.py            # extra arguments go to pytest, e.g. -k schedules

A backend whose package is not installed is reported and skipped; at least one must be installed.
Exit status 0 only if every backend's run passed. The last line sums the counts of all runs.
"""

import importlib.util
import os
import re
import subprocess
import sys

BACKENDS = {"jax": "jax", "tensorflow": "tensorflow", "torch": "torch"}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def installed_backends():
    return [name for name, module in BACKENDS.items() if importlib.util.find_spec(module) is not None]


def main(argv):
    backends = installed_backends()
    missing = sorted(set(BACKENDS) - set(backends))
    if missing:
        print(f"not installed, skipped: {', '.join(missing)} (see the README, 'Backends')")
    if not backends:
        print("no Keras backend is installed: pip install -r requirements.txt", file=sys.stderr)
        return 2
    totals = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    failed_backends = []
    for backend in backends:
        print(f"\n===== KERAS_BACKEND={backend} =====", flush=True)
        env = dict(os.environ, KERAS_BACKEND=backend)
        proc = subprocess.Popen([sys.executable, "-m", "pytest", "tests", "-p", "no:cacheprovider", *argv],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        summary = ""
        for line in proc.stdout:
            print(line, end="", flush=True)
            if re.search(r"\d+ (passed|failed|error)", line):
                summary = line
        if proc.wait() != 0:
            failed_backends.append(backend)
        for key, pattern in (("passed", r"(\d+) passed"), ("failed", r"(\d+) failed"),
                             ("skipped", r"(\d+) skipped"), ("errors", r"(\d+) errors?")):
            match = re.search(pattern, summary)
            totals[key] += int(match.group(1)) if match else 0
    print(f"\nbackends run: {', '.join(backends)}; failed: {', '.join(failed_backends) or 'none'}")
    print(f"{totals['passed']} passed, {totals['failed'] + totals['errors']} failed, {totals['skipped']} skipped")
    return 1 if failed_backends else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
