"""A real etcd + kube-apiserver for tests (no kubelet, no controller-manager).

See ``cluster.py`` for the process wrapper, ``fixtures.py`` for the pytest
fixture ``kube_api`` and ``build.sh`` for how the binaries are built.
"""
