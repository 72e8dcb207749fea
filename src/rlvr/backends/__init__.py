"""Where the rollout side runs when it is not a thread of the trainer's process: `ray` (rollout and
reward workers as Ray actors). The builder hands a backend the functions its workers build with."""
