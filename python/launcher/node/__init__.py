"""The node programs: what the launcher runs on the nodes, with their own ``python3`` (standard library only).

Shipped as one file, ``mift_node-<hash>.pyz`` (a zipapp built by :mod:`launcher.nodeprogram`),
and run as ``python3 mift_node.pyz PROGRAM ARGS...`` (the programs: :data:`launcher.node.__main__.PROGRAMS`).
The controller imports :mod:`launcher.node.contract` (and :mod:`launcher.node.stage`'s hashing) from here: one
contract module for both halves. Inside the zipapp the package is named ``mift_node``; its modules import each
other package-relative only.
"""
