"""AMD's signing key is accepted only with a pinned fingerprint (roles/rocm: mift_openpgp, mift_pgp_key).

Keys are TEST DOUBLES made by gpg (tests/fixtures/openpgp_TEST_DOUBLE/README.md gives gpg's own fingerprints).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KEYS = REPO / "tests" / "fixtures" / "openpgp_TEST_DOUBLE"
sys.path.insert(0, str(REPO / "plugins" / "module_utils"))

import mift_openpgp as pgp  # noqa: E402

RSA = "09822A98E31844A920B4B13416C6486A02181237"
ED = "A952596329A14D3BAC6EF182114EBE71F8595618"
AMD = "CA8BB4727A47B4D09B4EE8969386B48A1A693C5C"  # AMD's published fingerprint (the role's default)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("rsa2048_TEST_DOUBLE.asc", [RSA]),
        ("rsa2048_TEST_DOUBLE.gpg", [RSA]),
        ("ed25519_TEST_DOUBLE.asc", [ED]),
        ("two_keys_TEST_DOUBLE.asc", [RSA, ED]),
    ],
)
def test_fingerprints_are_the_ones_gpg_prints(name: str, expected: list[str]) -> None:
    assert pgp.primary_fingerprints((KEYS / name).read_bytes()) == expected


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "no OpenPGP public key block"),
        (b"<html>404 Not Found</html>", "no OpenPGP public key block"),
        (
            b"-----BEGIN PGP PUBLIC KEY BLOCK-----\n\n!!!!\n-----END PGP PUBLIC KEY BLOCK-----\n",
            "not valid base64",
        ),
    ],
)
def test_what_is_not_a_key_is_named(data: bytes, reason: str) -> None:
    with pytest.raises(pgp.KeyFileError, match=reason):
        pgp.primary_fingerprints(data)


def test_a_cut_key_is_refused() -> None:
    raw = pgp.dearmor((KEYS / "rsa2048_TEST_DOUBLE.asc").read_bytes())
    with pytest.raises(pgp.KeyFileError, match="cut short"):
        pgp.primary_fingerprints(raw[:100])


def test_fingerprints_are_compared_without_spaces_or_case() -> None:
    assert pgp.normalise("ca8b b472 7a47 b4d0 9b4e  e896 9386 b48a 1a69 3c5c") == AMD


def run_module(tmp_path: Path, key: str, allowed: list[str]) -> dict[str, object]:
    """Run the real module through ansible (localhost, no host needed) and return its result."""
    env = {
        **os.environ,
        # the collection mift.cluster as the checkout provides it (collections/)
        "ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections"),
        "ANSIBLE_LOCALHOST_WARNING": "0",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0",
    }
    args = json.dumps(
        {"path": str(KEYS / key), "allowed": allowed, "source": "http://mirror.test/rocm.gpg.key"}
    )
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible"),
            "localhost",
            "-c",
            "local",
            "-m",
            "mift.cluster.mift_pgp_key",
            "-a",
            args,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
        timeout=120,
    )
    # ad-hoc output: "localhost | FAILED! => {...}" / "localhost | SUCCESS => {...}"
    status, _, payload = proc.stdout.partition(" => ")
    result: dict[str, object] = json.loads(payload)
    result["failed"] = "FAILED!" in status
    return result


def test_module_refuses_a_key_with_the_wrong_fingerprint_in_one_line(tmp_path: Path) -> None:
    result = run_module(tmp_path, "rsa2048_TEST_DOUBLE.asc", [AMD])
    assert result["failed"] is True
    assert result["msg"] == (
        f"http://mirror.test/rocm.gpg.key: key fingerprint {RSA} is not an allowed one ({AMD}); "
        "refusing it (likely cause: a mirror or a man in the middle serves another key, or AMD "
        "rotated its key; fix: compare with AMD's published fingerprint and add the new one to "
        "rocm_apt_key_fingerprints)"
    )
    print(result["msg"])


def test_module_accepts_a_rotated_key_listed_next_to_the_old_one(tmp_path: Path) -> None:
    result = run_module(tmp_path, "ed25519_TEST_DOUBLE.asc", [AMD, ED.lower()])
    assert result["failed"] is False
    assert result["fingerprints"] == [ED]


def test_module_refuses_a_file_with_one_unlisted_key_among_listed_ones(tmp_path: Path) -> None:
    result = run_module(tmp_path, "two_keys_TEST_DOUBLE.asc", [RSA])
    assert result["failed"] is True
    assert f"key fingerprint {ED} is not an allowed one" in str(result["msg"])
