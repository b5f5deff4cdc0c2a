"""The ``openrlhf`` backend (:mod:`~drmas.workers.openrlhf.backend`) and what it knows of OpenRLHF: the pure
conversion, placement and options (:mod:`~drmas.workers.openrlhf.seam`), the pinned API contract and its check
(:mod:`~drmas.workers.openrlhf.api`), CPU mode (:mod:`~drmas.workers.openrlhf.cpu_compat`) and the weight-sync
check (:mod:`~drmas.workers.openrlhf.sync_check`). Nothing is imported here: importing a submodule must not
import OpenRLHF, DeepSpeed or vLLM."""
