"""Fixtures the integration modules share: the one Slurm cluster of the two Slurm e2e modules."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from mift_testsupport.fixtures import rig_ready_or_skip
from mift_testsupport.image import SYSTEMD
from mift_testsupport.rig import rig_id_from_env
from mift_testsupport.slurm import SlurmRig, slurm_rig

if TYPE_CHECKING:
    from collections.abc import Iterator

SLURM_RIG_ID = rig_id_from_env("SLURM_E2E_RIG_ID", 9)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmRig]:
    """3 hosts of rig ``SLURM_E2E_RIG_ID`` (9) from the systemd-mode image sharing ``/srv/mift<id>-shared``,
    Slurm provisioned on them once for the session (test_slurm_e2e.py, test_slurm_login_e2e.py)."""
    rig_ready_or_skip(systemd=SYSTEMD)
    with slurm_rig(SLURM_RIG_ID, tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster
