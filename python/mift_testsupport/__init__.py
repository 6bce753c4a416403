"""Test support shared by ``tests/``, ``bench/`` and the molecule helpers of mi300x-finetune.

One importable place for what the suites need around the code under test:

* :mod:`mift_testsupport.paths`: the repository, the rig script, the rig's state folder.
* :mod:`mift_testsupport.proc`: ``run`` (subprocess with the output in the failure) and the Ansible CLIs.
* :mod:`mift_testsupport.rig`: one test-rig instance (``Rig``), ``rig_instance``, ``leftovers``, rig ids.
* :mod:`mift_testsupport.provision`: the test-double variables, the tiny model, ``provision.yml`` on a rig.
* :mod:`mift_testsupport.image`: the provisioned host image (``rig image save``) made once per CI run.
* :mod:`mift_testsupport.launcher`: ``python -m launcher`` as a subprocess, with a private runs folder.
* :mod:`mift_testsupport.trainers`: which training processes a node runs; waiting until none is left.
* :mod:`mift_testsupport.cluster`: a provisioned rig plus the launcher and job specs for the tiny model.
* :mod:`mift_testsupport.cli`: the launcher CLI in-process with an Ansible runner that must not be called.
* :mod:`mift_testsupport.fixtures`: the pytest fixtures (a plugin loaded by ``tests/conftest.py``).
"""

from __future__ import annotations
