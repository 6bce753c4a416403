"""pytest fixtures for tests on the project's test rig (a plugin: ``tests/conftest.py`` loads it).

A test asks for hosts with ``rig_factory`` (function scope) or ``rig_module_factory`` (module scope)::

    def test_something(rig_factory):
        rig = rig_factory(rig_id=3, hosts=2, profiles={2: "mi250x"})
        assert rig.ssh(1, "hostname").stdout.strip() == "host1"

Whatever happens in the test, every instance the factory brought up is torn down (``rig down --purge``).
A suite that needs provisioned hosts takes them from the provisioned image with
:func:`mift_testsupport.image.provisioned_rig` in its own fixture (the launcher e2e and faults suites do).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager

import pytest

from mift_testsupport.rig import Rig, not_ready_reason, rig_instance

RigFactory = Callable[..., Rig]


def rig_ready_or_skip(*, systemd: bool = False) -> None:
    """Skip when the rig cannot run here at all (not root); fail when ``rig setup`` was not run."""
    reason = not_ready_reason(systemd=systemd)
    if reason is None:
        return
    verdict, why = reason
    if verdict == "skip":
        pytest.skip(why)
    pytest.fail(why)


@contextmanager
def _factory() -> Iterator[RigFactory]:
    with ExitStack() as stack:

        def make(
            rig_id: int,
            hosts: int,
            *,
            systemd: bool = False,
            profiles: Mapping[int, str] | None = None,
            image: str | None = None,
        ) -> Rig:
            rig_ready_or_skip(systemd=systemd)
            return stack.enter_context(
                rig_instance(rig_id, hosts, systemd=systemd, profiles=profiles, image=image)
            )

        yield make


@pytest.fixture
def rig_factory() -> Iterator[RigFactory]:
    """``rig_factory(rig_id, hosts, systemd=, profiles=, image=) -> Rig``; torn down after the test."""
    with _factory() as make:
        yield make


@pytest.fixture(scope="module")
def rig_module_factory() -> Iterator[RigFactory]:
    """Like ``rig_factory`` but torn down after the module (for slow converge-once tests)."""
    with _factory() as make:
        yield make
