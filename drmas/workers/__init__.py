"""Execution: the backend contract (:mod:`drmas.workers.base`), one worker group (:mod:`~drmas.workers.policy`),
its mini-batch plan (:mod:`~drmas.workers.minibatch`) and the backends (:mod:`~drmas.workers.local`,
:mod:`~drmas.workers.ray_backend`, :mod:`drmas.workers.openrlhf`). Nothing is imported here: a backend's library
(Ray, OpenRLHF) is imported only when a run builds that backend (``drmas.backends``)."""
