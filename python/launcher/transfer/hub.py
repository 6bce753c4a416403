"""Models and datasets from the Hugging Face hub: fetched once, on the controller, then staged to every node.

A job spec's ``stage.model.hub: ORG/NAME`` (or ``stage.dataset_dir.hub``, a dataset repo holding
``dataset_info.json``) names a hub repo and ``revision`` (default ``main``). Before any node is asked
(docs/launcher.md "Models and data from the hub"):

1. the revision is resolved to its commit with the real ``huggingface_hub`` client (``HF_ENDPOINT`` names
   another hub; the token comes from ``HF_TOKEN`` or the token file ``hf auth login`` writes, read here and
   handed to the client only: never printed, logged, recorded or sent to a node);
2. a snapshot of that commit already complete here (``<cache root>/hub/<type>s--ORG--NAME/<commit>/``) is
   used as it is; otherwise ``snapshot_download`` fetches it into a hidden partial folder beside it, renamed
   to the commit's name only once every file is there (an interrupted fetch leaves nothing under a final
   name);
3. the folder is then a controller source like any other: manifest, only differing files sent, verified on
   every node (:mod:`launcher.staging`). The nodes stay offline (``HF_HUB_OFFLINE=1``): the training YAML
   names the node folder the snapshot is staged to.

A gated repo without a token, a refused token, an unknown repo or revision and an unreachable hub are one line
each (:func:`fetch`). The provenance (repo, type, revision, commit, endpoint) is kept beside the snapshot
(``<commit>.json``) and goes into the run record with the staged folder.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.exceptions import ConfigurationError, JobFailedError
from launcher.validation.cache import cache_root

if TYPE_CHECKING:
    from collections.abc import Callable

    from launcher.spec.jobspec import StageSource

HUB_DIR = "hub"  # under the launcher's cache root
PARTIAL_PREFIX = ".partial-"
DEFAULT_REVISION = "main"
# the hub's answer to a token it does not accept (huggingface_hub.utils._http reads the same text)
INVALID_CREDENTIALS = "Invalid credentials in Authorization header"
TOKEN_ENV = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
)  # huggingface_hub's order (runner.HUB_TOKEN_ENV drops them)
NO_TOKEN = "no token"  # noqa: S105 - where a token came from when there is none, not a secret


@dataclass(frozen=True)
class HubSnapshot:
    """One fetched snapshot: where it is here and what it is."""

    repo: str
    repo_type: str  # model | dataset
    revision: str  # as the job spec names it
    commit: str  # what it resolved to
    endpoint: str
    path: Path

    def provenance(self) -> dict[str, str]:
        """What the run record keeps (no token, no controller path)."""
        return {k: v for k, v in asdict(self).items() if k != "path"}


def hub_root() -> Path:
    """The controller folder of fetched snapshots."""
    return cache_root() / HUB_DIR


def repo_folder(repo: str, repo_type: str) -> Path:
    """``<hub root>/models--ORG--NAME`` (the hub cache's naming)."""
    return hub_root() / f"{repo_type}s--{repo.replace('/', '--')}"


def endpoint() -> str:
    """The hub the controller asks: ``$HF_ENDPOINT`` or huggingface_hub's default."""
    from huggingface_hub import constants  # noqa: PLC0415 - the client is imported only when a job uses it

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def token_and_source() -> tuple[str | None, str]:
    """The controller's hub token (huggingface_hub's own lookup) and where it came from: named, never
    shown."""
    from huggingface_hub import constants, get_token  # noqa: PLC0415

    token = get_token()
    if token is None:
        return None, NO_TOKEN
    env = next((name for name in TOKEN_ENV if os.environ.get(name)), None)
    return token, env or f"the token file {constants.HF_TOKEN_PATH}"


def provenance_of(folder: str | Path) -> dict[str, Any] | None:
    """The provenance kept beside a snapshot folder fetched here, or None (not a hub snapshot)."""
    side = Path(f"{folder}.json")
    if not side.is_file():
        return None
    data = json.loads(side.read_text())
    return data if isinstance(data, dict) else None


def _http_why(err: Exception, repo: str, token_from: str, url: str) -> tuple[str, bool] | None:
    """The line of an HTTP error the hub answered (None: not one)."""
    from huggingface_hub import errors  # noqa: PLC0415

    if not isinstance(err, errors.HfHubHTTPError) or err.response is None:
        return None
    status = err.response.status_code
    if status == 401 and err.response.headers.get("X-Error-Message") == INVALID_CREDENTIALS:
        return f"the hub refused the token from {token_from} (invalid credentials): renew it", True
    if isinstance(err, errors.RepositoryNotFoundError):
        seen = "" if token_from == NO_TOKEN else f" the token from {token_from} sees"
        return f"{repo}: no such repo on the hub{seen} (check the id; private repos need a token)", True
    return f"{repo}: the hub {url} answered HTTP {status}; nothing was downloaded", False


def _why(err: Exception, repo: str, revision: str, token_from: str, url: str) -> tuple[str, bool]:
    """The one line of a failed hub call and whether it is bad input (else the hub or the way to it)."""
    import httpx  # noqa: PLC0415
    from huggingface_hub import errors  # noqa: PLC0415

    line: tuple[str, bool] | None = None
    if isinstance(err, errors.GatedRepoError):
        line = (
            f"{repo} is gated on the hub and the controller has no token: accept its licence on the hub, "
            "then set HF_TOKEN (or run `hf auth login`) on the controller"
            if token_from == NO_TOKEN
            else f"{repo} is gated on the hub and the token from {token_from} has no access to it: accept "
            "its licence on the hub with that token's account",
            True,
        )
    elif isinstance(err, errors.RevisionNotFoundError):
        line = f"{repo}: no revision {revision!r} on the hub (a branch, tag or commit of the repo)", True
    elif isinstance(err, errors.OfflineModeIsEnabled):
        line = "HF_HUB_OFFLINE is set on the controller: unset it there to fetch from the hub", True
    elif isinstance(err, (httpx.TransportError, errors.LocalEntryNotFoundError)):
        what = type(err.__cause__ or err).__name__
        line = f"hub unreachable at {url} ({what}): nothing was downloaded", False
    else:
        line = _http_why(err, repo, token_from, url)
    if line is None:
        raise err
    return line


def _check_dataset(folder: Path, key: str, spec_path: Path, where: str, what: str) -> None:
    """A dataset repo staged as ``dataset_dir`` holds LLaMA-Factory's ``dataset_info.json`` at its top."""
    if key == "dataset_dir" and not (folder / "dataset_info.json").is_file():
        raise ConfigurationError.at(
            spec_path, where, f"{what}: no dataset_info.json at the repo's top", "hub"
        )


def _fail(where: str, spec_path: Path, line: str, bad_input: bool) -> Exception:
    if bad_input:
        return ConfigurationError.at(spec_path, where, line, "hub")
    return JobFailedError(f"{spec_path}: {where}: {line}")


def fetch(
    spec_path: Path,
    key: str,
    source: StageSource,
    *,
    say: Callable[[str], object] | None = None,
) -> HubSnapshot:
    """Resolve and fetch the hub repo ``source`` names (once: a complete snapshot here is reused); one line
    (:class:`ConfigurationError`, or :class:`JobFailedError` for an unreachable or failing hub) when it
    cannot be had."""
    from huggingface_hub import HfApi, snapshot_download  # noqa: PLC0415

    assert source.hub is not None
    repo, revision = source.hub, source.revision or DEFAULT_REVISION
    repo_type = "dataset" if key == "dataset_dir" else "model"
    where = f"stage.{key}.hub"
    url = endpoint()
    token, token_from = token_and_source()
    t0 = time.monotonic()
    try:
        info = HfApi(endpoint=url).repo_info(
            repo, repo_type=repo_type, revision=revision, token=token or False
        )
    except Exception as err:  # classified into one line, else re-raised
        raise _fail(where, spec_path, *_why(err, repo, revision, token_from, url)) from None
    commit = str(info.sha)
    folder = repo_folder(repo, repo_type)
    final = folder / commit
    snap = HubSnapshot(repo, repo_type, revision, commit, url, final)
    if final.is_dir() and provenance_of(final) is not None:
        if say:
            say(f"hub: {repo}@{revision} is {commit[:12]}, held here ({final}): not fetched again")
        return snap
    folder.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f"{PARTIAL_PREFIX}{commit[:12]}-", dir=folder))
    try:
        snapshot_download(
            repo,
            repo_type=repo_type,
            revision=commit,
            local_dir=partial,
            token=token or False,
            endpoint=url,
        )
        # the client's own bookkeeping (download metadata, tree listing) is not the repo's: not staged
        shutil.rmtree(partial / ".cache", ignore_errors=True)
        _check_dataset(partial, key, spec_path, where, f"{repo}@{commit[:12]}")
        if final.exists():  # a stale leftover without its provenance
            shutil.rmtree(final)
        partial.rename(final)
        Path(f"{final}.json").write_text(json.dumps(snap.provenance(), indent=1) + "\n")
    except ConfigurationError:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    except Exception as err:  # classified into one line, else re-raised
        shutil.rmtree(partial, ignore_errors=True)
        raise _fail(where, spec_path, *_why(err, repo, revision, token_from, url)) from None
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if say:
        say(f"hub: {repo}@{revision} is {commit[:12]}: fetched in {time.monotonic() - t0:.1f} s to {final}")
    return snap


# one fetch per source and process: stage_items is asked more than once per run
_FETCHED: dict[tuple[str, str, str], HubSnapshot] = {}


def snapshot_for(spec_path: Path, key: str, source: StageSource) -> HubSnapshot:
    """:func:`fetch`, once per repo, type and revision in this process."""
    k = (str(source.hub), key, source.revision or DEFAULT_REVISION)
    if k not in _FETCHED:
        _FETCHED[k] = fetch(spec_path, key, source, say=lambda line: print(line, file=sys.stdout, flush=True))
    return _FETCHED[k]
