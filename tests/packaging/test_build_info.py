"""krug.info's reading of krugrun's build report (python/krug/info.py)."""

from krug import info


def test_nccl_version_code_is_horovods_encoding():
    assert info.nccl_version_code("    [X] NCCL (2.28.9 (loaded: 2.30.7))\n") == 22809
    assert info.nccl_version_code("    [X] NCCL (2.9.0 (loaded: none))\n") == 20900
    assert info.nccl_version_code("    [X] NCCL (2.8.4 (loaded: 2.8.4))\n") == 2804
    assert info.nccl_version_code("    [ ] NCCL (nccl.h not found)\n    [X] MPI\n") == 0
