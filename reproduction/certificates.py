"""The certificates that keep rows current across a refactor: results/certify/certificates.json, which
`python reproduce.py --certify` (reproduction/certify.py) writes and the Results table reads.

    certified_as("611b428454b9", job="translation")  ->  "f699987112ac"

A certificate says that code with one fingerprint gives, bit for bit, the numbers of code with another
(for each job's rows); equivalence is transitive, so `certified_as` follows certificates to their end.
No Keras: the tables read it for every run of every row.
"""

import functools
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDER = os.path.join("results", "certify")
CERTIFICATES = os.path.join(FOLDER, "certificates.json")
# The groups of rows a certificate covers one by one, each by the steps that run its paths: a change that moves
# the analyses' numbers on purpose keeps the translation rows current where their steps' outputs are the same.
JOBS = ("translation", "bert", "analysis")


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
