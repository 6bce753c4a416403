"""The fixtures every suite can use come from the test-support package (python/mift_testsupport)."""

from __future__ import annotations

pytest_plugins = ("mift_testsupport.fixtures", "mift_testsupport.case_cpu")
