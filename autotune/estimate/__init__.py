"""Estimate the memory of one training step without a GPU and without real weights.

The real step runs under ``FakeTensorMode`` on fake CPU tensors, with the model built inside the
fake mode: no tensor holds data, so a model far larger than RAM can be estimated in seconds.
Its modules, top down: ``fits`` (``estimate_report``: the asked micro-batch and the largest that
fits a device memory with headroom), ``calibration`` (a search's measured peak correcting the
estimate), ``trace`` (``estimate_step``: one step traced, its peak by kind), ``ranks`` (one rank
of a job traced under a fake process group), ``tracker`` (the live tensor bytes by kind);
``__main__`` is the child process ``api.fit`` runs it in.
"""
