"""The fabric between nodes: each node's RCCL/NCCL/Gloo environment from its facts, node and link acceptance.

- :mod:`launcher.fabric.env`: the interface that carries ``train_address``, the active RDMA ports and the
  RoCEv2 GID index (preflight's probe, ``net``) become ``NCCL_SOCKET_IFNAME``, ``GLOO_SOCKET_IFNAME``,
  ``NCCL_IB_HCA``, ``NCCL_IB_GID_INDEX``; overrides are checked against each node; a fall-back to sockets
  where RDMA is expected fails or warns (``fabric.socket_fallback``).
- :mod:`launcher.fabric.runtime`: what RCCL/NCCL chose at run time (``Using network X``), judged while a run
  is followed: a node on sockets where RDMA was expected fails the run or is one warning line.
- :mod:`launcher.fabric.parsers`: ``ibv_devinfo``, ``rdma link``, ``amd-smi`` text outputs.
- :mod:`launcher.fabric.accept`: per-node acceptance lines (ports, GID indexes, ECC, PCIe, firmware).
- :mod:`launcher.fabric.links`: the all-reduce bandwidth of every pair of nodes and the ring, its table and
  cache (per boot and node set), the measured inter-node bandwidth for the planner.
"""
