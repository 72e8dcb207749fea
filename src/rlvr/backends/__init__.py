"""Where the rollout side runs when it is not a thread of the trainer's process: `ray` (rollout and
reward workers as Ray actors). The builder hands a backend the functions its workers build with."""


def ray_rollouts(backend: str, ray_learners: int) -> bool:
    """`trainer.backend=ray` puts the rollout side on Ray actors, unless Ray starts the learners
    (`trainer.ray_learners`): then each learner rank samples its share itself, as under torchrun."""
    return backend == "ray" and not ray_learners
