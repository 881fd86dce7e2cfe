"""One local Ray cluster for every test of this folder: a head node with one CPU and two
simulated worker nodes with two CPUs each (ray.cluster_utils.Cluster: separate raylets on this
machine). Starting it takes a while on a loaded machine, so the tests share it; it is torn down
with the session, whatever the tests did."""

import os

import pytest


@pytest.fixture(scope="session")
def ray_cluster():
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": False,
        "_system_config": {"metrics_report_interval_ms": 100000}})
    try:
        nodes = [cluster.add_node(num_cpus=2, resources={"sim_node_%d" % i: 1})
                 for i in range(2)]
        ray.init(address=cluster.address, log_to_driver=True,
                 runtime_env={"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", ""),
                                           "OMP_NUM_THREADS": "1"}})
        cluster.wait_for_nodes()
        yield cluster, nodes
    finally:
        ray.shutdown()
        cluster.shutdown()
