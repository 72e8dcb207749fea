"""The one place that reads the config: the parts a run is built from (`build`: model, policy,
engine, task, verifier, loss, optimizer), their assembly with the frozen plans of the run's steps
(`components`), and a training run end to end (`run.train`: build, then the loop in its run
directory)."""
