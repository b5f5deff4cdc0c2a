"""Fixtures of the real-OpenRLHF tests (run from .venv-openrlhf, scripts/setup_openrlhf_env.sh; .ci/run).

Here nothing may be skipped: a session that collected this folder fails when any test skipped (a missing
OpenRLHF, DeepSpeed or Ray would otherwise pass silently). One Ray session (logical GPUs, fractional CPUs:
the CI machine has 2 cores) serves every test that needs one."""
from __future__ import annotations

import pytest

from drmas.workers.openrlhf import cpu_compat

cpu_compat.apply()  # CPU mode's measures, before any test module imports OpenRLHF (a no-op with CUDA)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter is not None else 0
    if skipped and session.exitstatus == 0:
        reporter.write_line(f"[integration_openrlhf] {skipped} test(s) skipped: a skip is a failure here (-rs lists "
                            "the reasons)", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the session: 2 logical GPUs (OpenRLHF's actors each ask for a GPU share), CPUs as
    the machine has; OpenRLHF's actor groups take fractional CPU shares of their bundles."""
    ray = pytest.importorskip("ray")
    ray.init(num_gpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}})
    yield ray
    ray.shutdown()
