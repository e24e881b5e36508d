"""Training jobs: ``hora job``, a local-first runner of the SageMaker script-mode contract."""
