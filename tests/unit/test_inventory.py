"""Controller-side inventory check: unknown hosts and bad inventories are named before any node is touched.

These run the real ``ansible-inventory`` of the controller's venv on small inventories written per test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.exceptions import ConfigurationError
from launcher.spec.inventory import check_hosts, inventory_names
from launcher.spec.jobspec import JobSpec
from launcher.spec.jobspec_load import parse_job_spec

INVENTORY = """\
all:
  children:
    trainers:
      hosts:
        host1: {ansible_host: 10.0.0.11}
        host2: {ansible_host: 10.0.0.12}
    spare:
      hosts:
        host3: {ansible_host: 10.0.0.13}
"""
JOB = Path("/jobs/job.yaml")


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "hosts.yml"
    path.write_text(INVENTORY)
    return path


def spec(hosts: object) -> JobSpec:
    return parse_job_spec({"name": "a", "train_config": "t.yaml", "hosts": hosts}, JOB)


def test_names_of_hosts_and_groups(inventory: Path) -> None:
    hosts, groups = inventory_names(inventory)
    assert hosts == {"host1", "host2", "host3"}
    assert {"trainers", "spare"} <= groups


@pytest.mark.parametrize(
    "hosts", ["trainers", "trainers,spare", ["host1", "host3"], "host*", "trainers:!host2"]
)
def test_known_hosts_groups_and_patterns_pass(inventory: Path, hosts: object) -> None:
    check_hosts(spec(hosts), inventory, JOB)


@pytest.mark.parametrize(
    ("hosts", "named"),
    [
        (["host1", "host9"], "hosts: host9: no such host in the inventory"),
        ("trainers,gpu_nodes", "hosts: gpu_nodes: no such host or group in the inventory"),
    ],
)
def test_unknown_name_is_named_with_job_and_inventory(inventory: Path, hosts: object, named: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        check_hosts(spec(hosts), inventory, JOB)
    message = str(err.value)
    assert message.startswith(f"{JOB}: {named}")
    assert str(inventory) in message and "\n" not in message


def test_malformed_yaml_inventory_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.yml"
    bad.write_text("all:\n  children: [trainers\n")
    with pytest.raises(ConfigurationError) as err:
        inventory_names(bad)
    assert str(err.value).startswith(f"{bad}: ")
    assert "\n" not in str(err.value)


def test_missing_inventory_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"nope\.yml: inventory not found"):
        check_hosts(spec("trainers"), tmp_path / "nope.yml", JOB)


def test_yaml_that_is_not_an_inventory_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "list.yml"
    bad.write_text("- host1\n- host2\n")
    with pytest.raises(ConfigurationError, match=r"list\.yml: \(file\): not a usable inventory: "):
        inventory_names(bad)
