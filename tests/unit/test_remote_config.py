"""``hr.Remote`` and ``Options(remote=...)``: validation, and no Ray without a Remote."""

import math
import subprocess
import sys
from pathlib import Path

import pytest

import headrace as hr

ROOT = Path(__file__).resolve().parents[2]


def test_validation():
    with pytest.raises(ValueError, match="max_workers"):
        hr.Remote(max_workers=-1)
    with pytest.raises(ValueError, match="workers"):
        hr.Remote(workers=3, max_workers=2)
    with pytest.raises(ValueError, match="cost_per_worker_hour"):
        hr.Remote(cost_per_worker_hour=-1.0)
    with pytest.raises(ValueError, match="threshold"):
        hr.Remote(threshold=1.5)
    with pytest.raises(ValueError, match="headrace.Remote"):
        hr.Options(remote="auto")  # type: ignore[arg-type]


@pytest.mark.parametrize(("kw", "error", "named"), [
    ({"resources": {"CPU": 1}}, ValueError, "num_cpus"),  # Ray: CPUs only as num_cpus
    ({"resources": {"GPU": 1}}, ValueError, "GPU"),
    ({"resources": {"x": -1}}, ValueError, "'x': -1"),
    ({"resources": {"x": math.inf}}, ValueError, "'x': inf"),
    ({"resources": {"x": 0.00001}}, ValueError, "0.0001"),  # under Ray's unit
    ({"resources": {"x": "1"}}, TypeError, "resources"),
    ({"resources": {1: 1.0}}, TypeError, "resource names"),
    ({"resources": ["cpu_node"]}, TypeError, "resources"),
    ({"num_cpus": math.inf}, ValueError, "num_cpus=inf"),
    ({"num_cpus": math.nan}, ValueError, "num_cpus=nan"),
    ({"num_cpus": "1"}, TypeError, "num_cpus='1'"),
    ({"max_workers": 1.5}, TypeError, "max_workers=1.5"),
    ({"max_workers": True}, TypeError, "max_workers=True"),
    ({"workers": 2.5}, TypeError, "workers=2.5"),
    ({"window": 2.5}, TypeError, "window=2.5"),
    ({"window": 0}, ValueError, "window=0"),
    ({"threshold": math.nan}, ValueError, "threshold=nan"),
    ({"cost_per_worker_hour": math.nan}, ValueError, "cost_per_worker_hour=nan"),
    ({"local_cost_per_hour": math.inf}, ValueError, "local_cost_per_hour=inf"),
    ({"address": 123}, TypeError, "address=123"),
    ({"required": "yes"}, TypeError, "required='yes'"),
])
def test_values_that_can_never_work_fail_at_construction(kw, error, named):
    # they used to pass here and fail in a proxy thread (logged, local-only even with
    # required=True) or mid-iteration with an unrelated TypeError
    with pytest.raises(error, match=named.replace("(", r"\(").replace(".", r"\.")):
        hr.Remote(**kw)


def test_values_ray_accepts_pass():
    hr.Remote(resources={"cpu_node": 0.0001, "other": 0, "n": 2}, num_cpus=0.5, max_workers=0,
              workers=0, window=1, threshold=0.5, cost_per_worker_hour=0,
              local_cost_per_hour=3)


def test_remote_needs_worker_processes_or_threads():
    with pytest.raises(ValueError, match="num_workers >= 1"):
        hr.DataLoader(list(range(4)), num_workers=0, options=hr.Options(remote=hr.Remote()))


def test_nothing_of_ray_is_imported_without_a_remote():
    code = ("import sys, headrace as hr\n"
            "l = hr.DataLoader(list(range(8)), batch_size=4, num_workers=1)\n"
            "assert len(list(l)) == 2\n"
            "print('ray' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin"})
    assert out.stdout.strip() == "False", out.stderr


def test_numbers_of_other_types_are_kept_as_pythons_own():
    # Ray type-checks num_cpus as (int, float): NumPy's numbers passed the checks here and
    # failed in a proxy thread at run time
    from fractions import Fraction

    import numpy as np

    r = hr.Remote(num_cpus=np.float32(1.5), max_workers=np.int64(3), workers=np.int32(2),
                  window=np.int64(10), threshold=Fraction(1, 20),
                  cost_per_worker_hour=np.float64(0.5), resources={"cpu_node": np.float32(1)})
    assert type(r.num_cpus) is float and r.num_cpus == 1.5
    assert (type(r.max_workers), type(r.workers), type(r.window)) == (int, int, int)
    assert type(r.threshold) is float and type(r.cost_per_worker_hour) is float
    assert r.resources == {"cpu_node": 1.0} and type(r.resources["cpu_node"]) is float


TOTALS = {"CPU": 4.0, "cpu_node": 200.0, "memory": 8e9, "object_store_memory": 2e8,
          "node:127.0.0.1": 1.0, "node:__internal_head__": 1.0}
"""``ray.cluster_resources()`` of a head and two CPU nodes."""


def test_a_worker_the_cluster_cannot_hold_is_named():
    from headrace.remote.config import unplaceable

    assert unplaceable(hr.Remote(resources={"cpu_node": 1}), TOTALS) is None
    assert unplaceable(hr.Remote(resources={"cpu_node": 0}, num_cpus=4), TOTALS) is None
    why = unplaceable(hr.Remote(resources={"cpu_nodes": 1}), TOTALS)
    assert why is not None
    assert "'cpu_nodes', which no node has (did you mean 'cpu_node'?)" in why
    assert why.endswith("live nodes have in all: CPU 4, cpu_node 200")  # no bytes, no node:*
    why = unplaceable(hr.Remote(num_cpus=6, resources={"cpu_node": 300, "gpu_box": 1}), TOTALS)
    assert why is not None
    assert "Remote(num_cpus) asks for more CPU than the nodes have in all (4)" in why
    assert "{'cpu_node': 300}) asks for more cpu_node than the nodes have in all (200)" in why
    assert "'gpu_box', which no node has;" in why  # nothing close to suggest
