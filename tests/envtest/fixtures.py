"""pytest fixture ``kube_api``: a real kube-apiserver (+ etcd) for the session.

Use it from a test module or conftest with::

    from tests.envtest.fixtures import kube_api  # noqa: F401

or, from the ROOT conftest.py only, ``pytest_plugins = ["tests.envtest.fixtures"]``.

Behaviour:
* binaries missing -> runs ``tests/envtest/build.sh`` (cold build: minutes);
* no ``go`` on PATH and binaries missing -> ``pytest.skip`` with a loud
  message, except when ``CI=true``: then the test FAILS (CI must not silently
  skip the contract tests);
* a build or start-up failure always fails (with the build / server log).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.envtest.cluster import BUILD_SCRIPT, KubeAPIServer, bin_dir_from_build_script


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def ensure_binaries() -> str:
    """Return the bin dir, building it if needed; skip/fail per module doc."""
    bin_dir = bin_dir_from_build_script()
    if (bin_dir / "kube-apiserver").exists() and (bin_dir / "etcd").exists():
        return str(bin_dir)
    if shutil.which("go") is None:
        msg = (
            "!!! kube-apiserver/etcd for the contract tests are not built and "
            f"'go' is not on PATH, so {BUILD_SCRIPT} cannot build them into "
            f"{bin_dir}. Install Go (>= 1.26) and re-run, or run build.sh by hand. !!!"
        )
        if _in_ci():
            pytest.fail("CI=true: refusing to skip. " + msg, pytrace=False)
        pytest.skip(msg)
    print(
        f"\nenvtest: building kube-apiserver and etcd into {bin_dir} (cold build takes several minutes)...",
        file=sys.stderr,
        flush=True,
    )
    res = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.fail(
            f"{BUILD_SCRIPT} failed with exit {res.returncode}:\n{res.stderr[-6000:]}\n{res.stdout[-2000:]}",
            pytrace=False,
        )
    return res.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def kube_api() -> Iterator[KubeAPIServer]:
    """A started :class:`~tests.envtest.cluster.KubeAPIServer` (admin token,
    ``server_url``, ``ca_file``, ``kubeconfig``, ``api_client()``,
    ``create_namespace()``, ``service_account_token()``)."""
    server = KubeAPIServer(ensure_binaries())
    server.start()
    try:
        yield server
    finally:
        server.stop()
