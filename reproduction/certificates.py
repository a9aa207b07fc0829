"""The certificates that keep rows current across a refactor: results/certify/certificates.json, which
`python reproduce.py --certify` (reproduction/certify.py) writes and the Results table reads.

    certified_as("611b428454b9", job="translation")  ->  "f699987112ac"

A certificate says that code with one fingerprint gives, bit for bit, the numbers of code with another
(for each job's rows); equivalence is transitive, so `certified_as` follows certificates to their end.
No Keras: the tables read it for every run of every row.
"""

import functools
import hashlib
import importlib.metadata
import json
import os
import platform

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDER = os.path.join("results", "certify")
CERTIFICATES = os.path.join(FOLDER, "certificates.json")
# The groups of rows a certificate covers one by one, each by the steps that run its paths: a change that moves
# the analyses' numbers on purpose keeps the translation rows current where their steps' outputs are the same.
JOBS = ("translation", "bert", "analysis")
LIBRARIES = ("keras", "jax", "jaxlib", "tensorflow", "torch", "numpy", "sacrebleu", "sacremoses", "sentencepiece",
             "tokenizers", "scipy", "h5py")


# --- records: the outputs of the check on a code, one a host ------------------------------------------------

def processor():
    """(model name, features): this host's processor and a digest of its instruction-set flags. Two hosts of
    one model name may still sum in another order (results/protocols.md, 2026-12-07, later)."""
    model, flags = platform.processor() or platform.machine(), ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            info = f.read()
        model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), model)
        flags = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("flags")), "")
    except OSError:
        pass
    return model, hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest()[:6]


def environment():
    """What outputs depend on besides the code: the host's processor (its kernels and their sums), Python
    and the libraries' versions."""
    model, features = processor()
    libraries = {}
    for name in LIBRARIES:
        try:
            libraries[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            libraries[name] = None
    host = f"{platform.machine()} {model} ({features}), {os.cpu_count()} cores"
    key = "-".join(part for part in "".join(c.lower() if c.isalnum() else " "
                                            for c in f"{model} {features} {os.cpu_count()}").split())
    return dict(host=host, key=key, python=platform.python_version(), libraries=libraries)


def record_path(root, fingerprint, key):
    return os.path.join(root, FOLDER, f"{fingerprint}-{key}.json")


def records(root, fingerprint):
    """The recorded outputs of `fingerprint`, one a host, oldest first."""
    folder = os.path.join(root, FOLDER)
    found = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.startswith(f"{fingerprint}-") and name.endswith(".json"):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                found.append(json.load(f))
    return sorted(found, key=lambda r: r["recorded"])


# --- certificates ---------------------------------------------------------------------------------------------


def certificates(root=ROOT):
    """{fingerprint: certificate} of results/certify/certificates.json (read again only when it changed: the
    tables ask for every run of every row)."""
    path = os.path.join(root, CERTIFICATES)
    if not os.path.exists(path):
        return {}
    stat = os.stat(path)
    return dict(_read_certificates(path, stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=8)
def _read_certificates(path, mtime_ns, size):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def certified_as(fingerprint, root=ROOT, job=None):
    """The fingerprint of the code whose numbers code `fingerprint` gives for the rows of `job` (of JOBS; None:
    for every job alike): the one its certificate names (results/certify/certificates.json), followed through
    that code's own certificate and so on (equivalence is transitive), or itself."""
    held = certificates(root)

    def step(fp, name):
        certificate = held.get(fp, {})
        jobs = certificate.get("jobs") or dict.fromkeys(JOBS, certificate.get("equivalent_to", fp))
        return jobs.get(name, fp)

    def follow(fp, name):
        seen = {fp}
        while step(fp, name) not in seen:
            fp = step(fp, name)
            seen.add(fp)
        return fp

    if job is not None:
        return follow(fingerprint, job)
    same = {follow(fingerprint, name) for name in JOBS}
    return same.pop() if len(same) == 1 else fingerprint
