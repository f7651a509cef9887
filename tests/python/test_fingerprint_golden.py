"""The config fingerprint of every kind of Config a user can write, against a recorded golden.

Ranks compare the fingerprint before each collective, and ranks of two dynamiq versions can run
together only while it is unchanged; the wire goldens (tests/golden/wire.txt) hold a few of them.
This file holds one per case below: every mode (auto included) on every topology, and every
field of every mode changed alone to a value a user could pass. It was recorded before the codec
parameters moved into the codecs' folders (issue 40), so that move, and any later one, must leave
every value as it was. DYNAMIQ_UPDATE_GOLDEN=1 rewrites the file: only for a deliberate change of
the fingerprint, said in CHANGELOG.md.
"""
import json
import os
import pathlib

import pytest

import dynamiq

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "golden" / "fingerprints.txt"


def _cases():
    cases = []
    bounded = {"error_bound": 1e-3}
    for topo in ("ring", "butterfly", "twostep", "hierarchical"):
        extra = {"local_size": 2} if topo == "hierarchical" else {}
        cases.append({"mode": "none", "topology": topo, **extra})
        cases.append({"mode": "lossless", "topology": topo, **extra})
        cases.append({"mode": "dynamiq", "topology": topo, "bits": 5.0, **extra})
        cases.append({"mode": "bitsplit", "topology": topo, "bits": 4, **extra})
        cases.append({"mode": "bitsplit", "topology": topo, "bits": 5, **extra})
        cases.append({"mode": "bounded", "topology": topo, **bounded, **extra})
        cases.append({"mode": "auto", "topology": topo, "bits": 5.0, **extra})
    dq = {"mode": "dynamiq", "bits": 5.0}
    for change in ({"bits": 4.0}, {"bits": 3.0}, {"bits": 8.0}, {"bits": 5.000000001}, {"seed": 7},
                   {"seed": 2**63}, {"widths": (2, 4)}, {"widths": (1, 2, 4, 8, 16)}, {"allocator": "exact"},
                   {"rounding": "independent"}, {"rounding": "correlated"}, {"group_size": 32},
                   {"group_size": 8}, {"supergroup_size": 512}, {"eps": (-1, -1, 0.2, 0.1)},
                   {"eps": (0.0, 0.0, 0.0, 0.0)}, {"uniform_levels": True}, {"hierarchical_scales": False},
                   {"block_bytes": 65536}, {"min_compress_numel": 0}, {"min_compress_numel": 1024},
                   {"window_bytes": 1 << 20}, {"max_collective_bytes": 0},
                   {"max_collective_bytes": 64 << 20}, {"host_staging": True}):
        cases.append({**dq, **change})
    bs = {"mode": "bitsplit", "bits": 4}
    for change in ({"bits": 2}, {"bits": 3}, {"bits": 8}, {"rounding": "nearest"}, {"rounding": "stochastic"},
                   {"group_size": 64}, {"spike_reserve": True}, {"spike_reserve": False}, {"log_scales": True},
                   {"seed": 3}, {"topology": "twostep", "bits": 2}):
        cases.append({**bs, **change})
    for change in ({"error_bound": 1e-5}, {"error_bound": 0.5}, {"error_bound_rel": 1e-3},
                   {"error_bound_rel": 1.0}, {"error_bound": 1e-3, "seed": 9}):
        cases.append({"mode": "bounded", **change})
    cases.append({"mode": "lossless", "seed": 11})
    cases.append({"mode": "lossless", "block_bytes": 1 << 20})
    cases.append({"mode": "none", "min_compress_numel": 0})
    for change in ({"auto_lossy": "bitsplit", "bits": 4}, {"auto_bandwidth": 1.25e8}, {"auto_latency": 1e-4},
                   {"auto_bandwidth": 1e9, "auto_latency": 0.0}, {"bits": 4.0}, {"rounding": "independent"}):
        cases.append({"mode": "auto", "bits": 5.0, **change})
    for change in ({"local_size": 4}, {"intra_mode": "lossless"}, {"local_size": 1}):
        cases.append({"mode": "dynamiq", "bits": 5.0, "topology": "hierarchical", **change})
    return cases


def _key(case):
    return json.dumps(case, sort_keys=True)


def _fingerprints():
    return {_key(c): "%016x" % dynamiq.Config(**c)._to_cpp().fingerprint() for c in _cases()}


def test_fingerprints_match_the_golden():
    got = _fingerprints()
    assert len(got) == len(_cases()), "two cases are the same"
    if os.environ.get("DYNAMIQ_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text("# config (json) fingerprint (tests/python/test_fingerprint_golden.py; "
                          "DYNAMIQ_UPDATE_GOLDEN=1 rewrites)\n" +
                          "".join(f"{k} {v}\n" for k, v in sorted(got.items())))
    want = {}
    for line in GOLDEN.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        k, v = line.rsplit(" ", 1)
        want[k] = v
    assert sorted(got) == sorted(want), "the cases and the golden's lines differ"
    changed = [k for k in got if got[k] != want[k]]
    assert not changed, f"{len(changed)} fingerprints changed, e.g. {changed[:3]}"


def test_cases_differ_where_the_wire_differs():
    # equal configurations (up to the rank-local window_bytes and host_staging) fingerprint
    # alike, and every two that differ fingerprint differently
    by_fp = {}
    for c in _cases():
        cfg = dynamiq.Config(**c)
        wire = cfg.replace(window_bytes=dynamiq.Config().window_bytes, host_staging=False,
                           rounding=cfg.effective_rounding)
        by_fp.setdefault(cfg._to_cpp().fingerprint(), set()).add(wire)
    collide = [v for v in by_fp.values() if len(v) > 1]
    assert not collide, f"configurations that put different bytes on the wire collide: {collide[:1]}"
    assert len(by_fp) == len({w for v in by_fp.values() for w in v})


@pytest.mark.parametrize("case", [{"mode": "dynamiq"}, {"mode": "bitsplit"}])
def test_a_mode_default_fingerprints_like_its_explicit_value(case):
    # the defaults of each mode are part of the golden through the explicit cases
    cfg = dynamiq.Config(**case)
    explicit = dynamiq.Config(**case, bits=cfg.bits)
    assert cfg._to_cpp().fingerprint() == explicit._to_cpp().fingerprint()
