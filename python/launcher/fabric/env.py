"""Each node's RCCL/NCCL/Gloo environment, derived from its fabric facts; overrides and agreement checked.

The facts come from preflight's probe (``launcher/node/probe_net.py``, ``net``): the interfaces with their
addresses (``ip -j addr``), the RDMA ports (``/sys/class/infiniband``: state, link layer, GID table with
types), whether ``libibverbs`` is installed. Derived per node:

- ``NCCL_SOCKET_IFNAME`` and ``GLOO_SOCKET_IFNAME``: the interface that carries the node's ``train_address``
  (a wrong name hangs the start: AMD's Megatron-LM guide, "ensure the correct network interface is set").
- ``NCCL_IB_HCA``: the ACTIVE RDMA ports, exact (``=dev:port,...``); ``NCCL_IB_GID_INDEX``: the RoCEv2
  GID index of those ports (AMD's multi-node guide: 3 on its reference setup; read from the GID table, not
  assumed).
- no usable RDMA (no active port, or no libibverbs, which RCCL loads at run time and silently falls back to
  TCP sockets without): ``NCCL_IB_DISABLE=1``, the transport is sockets and says so.

The inventory's ``mift_node_env`` and the job spec's ``env`` override the derived values (in that order); a
name that does not exist on a node, or a value that must be the same on every node and is not, is refused in
one line naming the node, before anything starts. A multi-node job whose transport is sockets where RDMA is
expected (``fabric.transport``) fails or warns by ``fabric.socket_fallback``; where RDMA is expected and
predicted on every node, what RCCL/NCCL chooses at run time is judged too (:mod:`launcher.fabric.runtime`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.exceptions import ConfigurationError
from launcher.fabric.runtime import DEBUG_ENV, TransportCheck, hidden_by, not_judged_notes

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from launcher.spec.jobspec import FabricOptions

SOCKET_IFNAME_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
HCA_VAR = "NCCL_IB_HCA"
GID_VAR = "NCCL_IB_GID_INDEX"
IB_DISABLE_VAR = "NCCL_IB_DISABLE"
FABRIC_VARS = (*SOCKET_IFNAME_VARS, HCA_VAR, GID_VAR, IB_DISABLE_VAR)
# one connection between two nodes uses each side's value: these must be the same on every node
MUST_AGREE = (GID_VAR, IB_DISABLE_VAR)
ROCE_V2 = "RoCE v2"
IPV4_MAPPED = "0000:0000:0000:0000:0000:ffff:"


@dataclass(frozen=True)
class NodeFabric:
    """What a node's facts say about its fabric."""

    host: str
    interface: str | None  # the interface that carries train_address (None: none does)
    interfaces: tuple[str, ...]
    devices: tuple[str, ...]  # every RDMA device
    hcas: tuple[str, ...]  # the ACTIVE ports, "dev:port"
    down: tuple[str, ...]  # ports not ACTIVE, "dev:port STATE"
    gid_indexes: Mapping[str, int]  # "dev:port" -> its RoCEv2 GID index (Ethernet ports)
    libibverbs: bool
    why_socket: str = ""  # why RDMA is not usable ("" when it is)

    @property
    def transport(self) -> str:
        """Return ``rdma`` when the node has an active RDMA port RCCL can use, else ``socket``."""
        return "socket" if self.why_socket else "rdma"

    @property
    def gid_index(self) -> int | None:
        """Return the RoCEv2 GID index of the active ports (None: InfiniBand or no RDMA)."""
        found = {self.gid_indexes[h] for h in self.hcas if h in self.gid_indexes}
        return min(found) if found else None


def roce_v2_index(gids: Sequence[Mapping[str, Any]]) -> int | None:
    """Return the lowest GID index of type RoCE v2 that carries an IPv4 address (else any RoCE v2 one)."""
    v2 = [g for g in gids if str(g.get("type") or "").strip() == ROCE_V2 and isinstance(g.get("index"), int)]
    mapped = [g for g in v2 if str(g.get("gid", "")).startswith(IPV4_MAPPED)]
    pick = mapped or v2
    return min(int(g["index"]) for g in pick) if pick else None


def node_fabric(host: str, train_address: str, net: Mapping[str, Any]) -> NodeFabric:
    """Return the fabric of ``host`` from its probe's ``net`` facts."""
    ifaces = [i for i in net.get("interfaces") or [] if isinstance(i, dict)]
    carrying = next((str(i["name"]) for i in ifaces if train_address in (i.get("addrs") or [])), None)
    ports = [p for p in net.get("rdma") or [] if isinstance(p, dict)]
    hcas, down, gid_indexes = [], [], {}
    for port in ports:
        name = f"{port.get('device')}:{port.get('port')}"
        if str(port.get("state", "")).upper() == "ACTIVE":
            hcas.append(name)
        else:
            down.append(f"{name} {port.get('state') or 'unknown'}")
        if str(port.get("link_layer", "")).lower() == "ethernet":
            index = roce_v2_index(port.get("gids") or [])
            if index is not None:
                gid_indexes[name] = index
    libibverbs = bool(net.get("libibverbs"))
    if not ports:
        why = "no RDMA device (/sys/class/infiniband is empty)"
    elif not hcas:
        why = f"no RDMA port is ACTIVE ({', '.join(down)})"
    elif not libibverbs:
        why = "libibverbs is not installed (RCCL loads it at run time)"
    else:
        why = ""
    return NodeFabric(
        host=host,
        interface=carrying,
        interfaces=tuple(str(i["name"]) for i in ifaces),
        devices=tuple(sorted({str(p.get("device")) for p in ports})),
        hcas=tuple(hcas),
        down=tuple(down),
        gid_indexes=gid_indexes,
        libibverbs=libibverbs,
        why_socket=why,
    )


def derived_env(fabric: NodeFabric, *, force_socket: bool = False) -> dict[str, str]:
    """Return the NCCL/Gloo variables a node's facts give (the interface, HCAs, GID index or sockets)."""
    env: dict[str, str] = {}
    if fabric.interface:
        env = dict.fromkeys(SOCKET_IFNAME_VARS, fabric.interface)
    if fabric.transport == "socket" or force_socket:
        env[IB_DISABLE_VAR] = "1"
        return env
    env[HCA_VAR] = "=" + ",".join(fabric.hcas)
    if fabric.gid_index is not None:
        env[GID_VAR] = str(fabric.gid_index)
    return env


def _names(value: str) -> tuple[bool, bool, list[str]]:
    """Split an NCCL list (``^`` excludes, ``=`` exact, else prefixes): (exclude, exact, names)."""
    exclude = value.startswith("^")
    value = value.removeprefix("^")
    exact = value.startswith("=")
    value = value.removeprefix("=")
    return exclude, exact, [n.strip() for n in value.split(",") if n.strip()]


def missing_interface(var: str, value: str, interfaces: Sequence[str]) -> str | None:
    """Return the first name in ``value`` that matches no interface of the node (None: all match).

    ``NCCL_SOCKET_IFNAME`` takes prefixes (``=``: exact names, ``^``: names to leave out, not checked);
    ``GLOO_SOCKET_IFNAME`` takes exact names.
    """
    exclude, exact, names = _names(value)
    if exclude:
        return None
    exact = exact or var == "GLOO_SOCKET_IFNAME"
    for name in names:
        if not any(i == name if exact else i.startswith(name) for i in interfaces):
            return name
    return None


def missing_hca(value: str, devices: Sequence[str]) -> str | None:
    """Return the first device in an ``NCCL_IB_HCA`` value that the node lacks (None: all present)."""
    exclude, exact, names = _names(value)
    if exclude:
        return None
    for name in names:
        device = name.split(":", 1)[0]
        if not any(d == device if exact else d.startswith(device) for d in devices):
            return name
    return None


def rdma_expected(options: FabricOptions, fabrics: Sequence[NodeFabric], env_sets_hca: bool) -> bool:
    """Return True when the job's collectives should use RDMA (``fabric.transport``; ``auto``: some node
    has an active RDMA port, or the job's environment names HCAs)."""
    if options.transport != "auto":
        return options.transport == "rdma"
    return env_sets_hca or any(f.hcas for f in fabrics)


@dataclass(frozen=True)
class FabricPlan:
    """The per-node fabric environment of a job and what to tell the user about it."""

    envs: Mapping[str, Mapping[str, str]]  # host -> derived variables (before the overrides)
    fabrics: Mapping[str, NodeFabric]
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    # RDMA expected and predicted on every node of a multi-node job: the run asks RCCL/NCCL for its transport
    # line (debug_env, under the overrides) and judges it (launcher.fabric.runtime); None: not judged
    transport_check: TransportCheck | None = None
    debug_env: Mapping[str, str] = dataclasses.field(default_factory=dict)


def runtime_check(
    hosts: Sequence[str], overrides: Mapping[str, Mapping[str, str]], options: FabricOptions
) -> tuple[TransportCheck | None, list[str]]:
    """Return the run-time transport check of a job where RDMA is expected on every node, and its notes.

    The job's environment (``overrides``, every variable) wins over :data:`DEBUG_ENV`: a node whose
    environment hides the ``Using network`` line is not judged, said once; ``NCCL_IB_DISABLE=1`` there asks
    for sockets: nothing is judged.
    """
    if any((overrides.get(h) or {}).get(IB_DISABLE_VAR) == "1" for h in hosts):
        return None, [
            f"fabric: {IB_DISABLE_VAR}=1 in the job's env: the collectives' transport is not judged at run "
            "time (fabric.transport: socket says so without a check)"
        ]
    hidden = {h: why for h in hosts if (why := hidden_by({**DEBUG_ENV, **(overrides.get(h) or {})}))}
    return TransportCheck(options.transport, options.socket_fallback, hidden), not_judged_notes(hidden)


def resolve_fabric(  # noqa: PLR0912 - one pass over the checks, each one line
    hosts: Sequence[str],
    train_address: Mapping[str, str],
    probe: Mapping[str, Mapping[str, Any]],
    overrides: Mapping[str, Mapping[str, str]],
    options: FabricOptions,
) -> FabricPlan:
    """Derive every node's fabric environment and check it; raises ConfigurationError naming the node.

    Args:
        hosts: the job's hosts in rank order.
        train_address: host -> its ``train_address``.
        probe: host -> preflight's probe answer (its ``net``).
        overrides: host -> the variables set by the inventory (``mift_node_env``) and the job spec (``env``),
            merged.
        options: the job spec's ``fabric`` policy.
    """
    fabrics = {h: node_fabric(h, train_address[h], probe.get(h, {}).get("net") or {}) for h in hosts}
    socket_only = options.transport == "socket"  # the job asks for sockets: every node gets them
    derived = {h: derived_env(f, force_socket=socket_only) for h, f in fabrics.items()}
    warnings: list[str] = []
    notes: list[str] = []
    effective = {}

    def overrides_of(host: str) -> dict[str, str]:
        return {k: v for k, v in (overrides.get(host) or {}).items() if k in FABRIC_VARS}

    for host in hosts:
        given = overrides_of(host)
        effective[host] = {**derived[host], **given}
        fabric = fabrics[host]
        for var in SOCKET_IFNAME_VARS:
            value = given.get(var)
            missing = missing_interface(var, value, fabric.interfaces) if value is not None else None
            if missing is not None:
                raise ConfigurationError(
                    f"{host}: {var}={value}: no interface {missing!r} on {host} (it has "
                    f"{', '.join(fabric.interfaces) or 'none'}); fix env in the job spec or mift_node_env; "
                    "nothing was started"
                )
        if len(hosts) > 1 and fabric.interface is None and not all(v in given for v in SOCKET_IFNAME_VARS):
            warnings.append(
                f"{host}: no interface carries train_address {train_address[host]}: "
                f"{'/'.join(SOCKET_IFNAME_VARS)} not derived (set them in the job spec's env)"
            )
        hca = given.get(HCA_VAR)
        if hca is not None and fabric.devices:
            missing = missing_hca(hca, fabric.devices)
            if missing is not None:
                raise ConfigurationError(
                    f"{host}: {HCA_VAR}={hca}: no RDMA device {missing!r} on {host} (it has "
                    f"{', '.join(fabric.devices)}); nothing was started"
                )
        if fabric.down and fabric.hcas:
            warnings.append(f"{host}: RDMA port {fabric.down[0]}: left out of {HCA_VAR}")
        if len({fabric.gid_indexes[h] for h in fabric.hcas if h in fabric.gid_indexes}) > 1 and (
            GID_VAR not in given
        ):
            listing = ", ".join(
                f"{h} {fabric.gid_indexes[h]}" for h in fabric.hcas if h in fabric.gid_indexes
            )
            raise ConfigurationError(
                f"{host}: the RoCEv2 GID index differs between its ports ({listing}); set {GID_VAR} in the "
                "job spec's env; nothing was started"
            )
    sockets = [h for h in hosts if fabrics[h].transport == "socket"]
    env_sets_hca = any(HCA_VAR in (overrides.get(h) or {}) for h in hosts)
    expected = len(hosts) > 1 and rdma_expected(options, list(fabrics.values()), env_sets_hca)
    check, check_notes = runtime_check(hosts, overrides, options) if expected and not sockets else (None, [])
    notes.extend(check_notes)
    if len(hosts) > 1 and sockets:
        if expected:
            host = sockets[0]
            line = (
                f"{host}: collectives would fall back to TCP sockets where RDMA is expected "
                f"(fabric.transport: {options.transport}): {fabrics[host].why_socket}"
            )
            if options.socket_fallback == "fail":
                raise ConfigurationError(
                    f"{line}; provision the RDMA user space or set fabric.socket_fallback: warn (or "
                    "fabric.transport: socket); nothing was started"
                )
            warnings.append(f"{line} (fabric.socket_fallback: warn: every node uses sockets)")
            for other in hosts:  # one transport for the whole job: sockets on every node
                derived[other] = derived_env(fabrics[other], force_socket=True)
                effective[other] = {**derived[other], **overrides_of(other)}
        elif len(sockets) == len(hosts):
            iface = effective[hosts[0]].get("NCCL_SOCKET_IFNAME", "unset")
            notes.append(
                f"fabric: TCP sockets between the nodes ({fabrics[hosts[0]].why_socket} on {hosts[0]}; "
                f"NCCL_SOCKET_IFNAME={iface})"
            )
    first = hosts[0]
    for var in MUST_AGREE:
        ref = effective[first].get(var)
        for host in hosts[1:]:
            mine = effective[host].get(var)
            if mine != ref:
                raise ConfigurationError(
                    f"{host}: {var} is {mine or 'unset'} on {host} but {ref or 'unset'} on {first} (it must "
                    "be the same on every node; derived from each node's RDMA ports and GID table): set "
                    f"{var} in the job spec's env or fix the node; nothing was started"
                )
    return FabricPlan(
        envs=derived,
        fabrics=fabrics,
        warnings=tuple(warnings),
        notes=tuple(notes),
        transport_check=check,
        debug_env=DEBUG_ENV if check is not None else {},
    )
