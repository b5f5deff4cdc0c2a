"""The ``openrlhf`` backend (:mod:`~drmas.workers.openrlhf.backend`) and what it knows of OpenRLHF. Nothing is
imported here: importing a submodule must not import OpenRLHF, DeepSpeed or vLLM."""
