"""The task sections of the schema (`task.<name>.*`): one frozen dataclass per task, a docstring
under each field (docs/config.md is generated from them)."""

from __future__ import annotations

from dataclasses import dataclass

from rlvr.config.ranges import ranged


@dataclass(frozen=True)
class CountdownTaskConfig:
    """Knobs of `rlvr.tasks.countdown.Countdown` (null = the class's own default)."""

    num_count: int | None = ranged(None, "[2, 8]")
    """How many numbers per problem (3 or 4 are the useful settings)."""
    max_number: int | None = ranged(None, "[1, 1e6]")
    """Numbers are drawn from 1..max_number."""
    allow_division: bool | None = None
    """Allow exact integer division."""
    ordered: bool = True
    """Prompts list the numbers in the order the generating expression uses them. True here (the
    class's own default is False): the packaged warm start was trained on ordered prompts."""
    show_work: bool | None = None
    """Completions list steps `5*2=10,10+3=13` instead of a bare expression."""
    sampling: str | None = None
    """Training problems as the generator draws them (`draws`) or uniform over problem keys (`keys`,
    like the held-out set)."""
    partial_credit: str | None = None
    """0.1 for any parseable wrong answer (`parse`, d1/TinyZero) or only one over the given numbers
    (`numbers`)."""
    buckets: str | None = None
    """Difficulty buckets as sources, `COUNT:LOW-HIGH` each (numbers per problem, target range),
    comma-separated, e.g. `3:1-20,4:21-99`; empty = one source of `num_count` numbers."""


@dataclass(frozen=True)
class ArithmeticTaskConfig:
    """Knobs of `rlvr.tasks.arithmetic.Arithmetic` (null = the class's own default)."""

    digits: str | None = None
    """Digit counts of the operands, one source each, comma-separated (`2,3,4`)."""


@dataclass(frozen=True)
class CountShapesTaskConfig:
    """Knobs of `rlvr.tasks.visual.shapes.CountShapes` (null = the class's own default)."""

    min_shapes: int | None = ranged(None, "[1, 16]")
    """Fewest shapes in a picture (1..16)."""
    max_shapes: int | None = ranged(None, "[1, 16]")
    """Most shapes in a picture (min_shapes..16): a difficulty knob."""
    colours: int | None = ranged(None, "[1, 3]")
    """Colours in use, from red, green, blue (1..3): 1 = count every shape; more = find the asked colour."""
    size: int | None = ranged(None, "[16, 1024]", "pixels")
    """Picture side in pixels."""


@dataclass(frozen=True)
class Sudoku4TaskConfig:
    """Knobs of `rlvr.tasks.sudoku.Sudoku4` (null = the class's own default)."""

    min_blanks: int | None = ranged(None, "[1, 12]")
    """Fewest blank cells of a puzzle (1..12)."""
    max_blanks: int | None = ranged(None, "[1, 12]")
    """Most blank cells of a puzzle (min_blanks..12)."""


@dataclass(frozen=True)
class FileTaskConfig:
    """Knobs shared by the file tasks (`rlvr.tasks.files.FileTask`; null = the class's own default)."""

    path: str | None = None
    """JSONL / Parquet file or HF `save_to_disk` directory (required)."""
    prompt_key: str | None = None
    """Field holding the prompt."""
    answer_key: str | None = None
    """Field holding the reference answer (math_file)."""
    tests_key: str | None = None
    """Field holding the tests (code_file)."""
    system_prompt: str | None = None
    """System message (chat templates) or prefix."""
    prompt_template: str | None = None
    """Format string with {prompt}."""
    max_prompt_length: int | None = ranged(None, ">= 0", "0 = keep all")
    """Drop longer prompts (tokens), 0 = keep all."""
    heldout_path: str | None = None
    """Separate evaluation file, empty = hash split of `path`."""
    split: str | None = None
    """HF datasets directory: split name."""
    heldout_split: str | None = None
    """HF datasets directory: the split held out (e.g. `test`), read from `heldout_path` when set, else
    from `path`; empty = `split` of `heldout_path`, or the hash split of `path`."""


@dataclass(frozen=True)
class MathFileTaskConfig(FileTaskConfig):
    """Knobs of `rlvr.tasks.files.MathFileTask` (null = the class's own default)."""

    math_timeout_s: float | None = ranged(None, "> 0", "seconds")
    """Time limit of one equivalence check."""
    solution_key: str | None = None
    """Field holding a worked solution (for SFT), empty = none."""
    strict: bool | None = None
    """Read the final answer only from `\\boxed{}`, `<answer>…</answer>` or `#### X` (the class's
    default); false adds the lenient fallbacks ("the answer is X", the last number)."""


@dataclass(frozen=True)
class ImageQATaskConfig(MathFileTaskConfig):
    """Knobs of `rlvr.tasks.visual.image_qa.ImageQATask` (null = the class's own default)."""

    max_pixels: int | None = ranged(None, ">= 1", "pixels")
    """Largest image (width × height) a row may name; a larger one is refused before training."""
    max_images: int | None = ranged(None, ">= 1")
    """Most images one row may name."""


@dataclass(frozen=True)
class CodeFileTaskConfig(FileTaskConfig):
    """Knobs of `rlvr.tasks.files.CodeFileTask` (null = the class's own default)."""

    all_or_nothing: bool | None = None
    """Reward 1 only if every test passes (otherwise the fraction passed)."""
    sandbox_workers: int | None = ranged(None, ">= 1")
    """Programs run at once."""
    wall_s: float | None = ranged(None, "> 0", "seconds")
    """Wall-clock limit per program."""
    memory_mb: int | None = ranged(None, ">= 16", "MiB")
    """Address-space limit per program."""
    isolation: str | None = None
    """Sandbox isolation: auto | bwrap | unshare | none."""


@dataclass(frozen=True)
class AgentTaskConfig:
    """Knobs every agent task has (`rlvr.agents.task.AgentTask`; null = the class's own default)."""

    max_turns: int | None = ranged(None, ">= 1")
    """Most actions per episode (the single-turn ablation `tools: false` forces 1)."""
    max_total_tokens: int | None = ranged(None, ">= 1")
    """Longest kept sequence, prompt + actions + observations; an observation that would overflow
    is not appended (finish `token_budget`)."""
    tool_timeout_s: float | None = ranged(None, "> 0", "seconds")
    """Wall-clock limit of one tool call; past it the call is an error observation (`agent/tool_timeouts`)."""
    env_timeout_s: float | None = ranged(None, "> 0", "seconds")
    """Wall-clock limit of one `reset` or `step` of the environment (default 60); past it the episode
    ends as `env_error` (`agent/env_timeouts`) and the call is abandoned in its thread."""
    tools: bool | None = None
    """False: no tool, the model must answer in its first action (the ablation)."""
    train_drifted: bool | None = None
    """Train on trajectories whose kept ids differ from a re-render of the conversation (`agent/drifted`);
    default False: they stay out of the loss."""
    demo_tool_rate: float | None = ranged(None, "[0, 1]")
    """Share of scripted demonstrations (the SFT warm start) that use the tool; the others answer at once."""


@dataclass(frozen=True)
class CalculatorTaskConfig(AgentTaskConfig):
    """Knobs of `rlvr.agents.envs.calculator.Calculator` (null = the class's own default)."""

    digits_a: int | None = ranged(None, "[1, 18]")
    """Digits of the first factor."""
    digits_b: int | None = ranged(None, "[1, 18]")
    """Digits of the second factor."""
    tool_latency_s: float | None = ranged(None, ">= 0", "seconds")
    """The calculator answers this long after each call (a remote tool service's round trip; a wait
    that computes nothing, during which the asynchronous rollout side lends its core); default 0."""


@dataclass(frozen=True)
class GuessTaskConfig(AgentTaskConfig):
    """Knobs of `rlvr.agents.envs.guess.GuessNumber` (null = the class's own default)."""

    high: int | None = ranged(None, ">= 2")
    """The hidden number is drawn from 1..high."""
    min_high: int | None = ranged(None, ">= 2")
    """If set, each episode draws its range 1..H with H in min_high..high (the held-out split is then
    over (H, number) pairs)."""
    reward_decay: float | None = ranged(None, "[0, 1]")
    """A success after n guesses pays 1 - reward_decay·(n - 1) (at least 0)."""


@dataclass(frozen=True)
class LookupTaskConfig(AgentTaskConfig):
    """Knobs of `rlvr.agents.envs.lookup.Lookup` (null = the class's own default)."""

    keys: int | None = ranged(None, ">= 1")
    """Keys in the hidden table."""
    hops: int | None = ranged(None, ">= 1")
    """Lookups chained before the answer."""


@dataclass(frozen=True)
class CountdownPythonTaskConfig(AgentTaskConfig):
    """Knobs of `rlvr.tasks.countdown_python.CountdownPython` (null = the class's own default)."""

    num_count: int | None = ranged(None, "[2, 8]")
    """How many numbers per problem."""
    max_number: int | None = ranged(None, "[1, 1e6]")
    """Numbers are drawn from 1..max_number."""


@dataclass(frozen=True)
class TaskConfig:
    """The task: its name, the knobs every task has, and one section per task for its own knobs.

    Only the chosen task's section may be set; `rlvr config` fills it with the effective values
    and leaves the others null."""

    name: str = "countdown"
    """Task registry key (`rlvr.tasks.TASKS`)."""
    heldout_size: int = ranged(200, ">= 0")
    """Size of the fixed held-out evaluation set (every task; file tasks hold out this many rows
    by a hash of the prompt unless `heldout_path` is set)."""
    train_size: int = ranged(0, ">= 0", "0 = every draw from the whole task")
    """Training prompts: this many drawn once (seeded), every step's prompts then drawn from them with
    replacement, so prompts recur as over a dataset's epochs; 0 = the task's own draws."""
    countdown: CountdownTaskConfig | None = None
    """Knobs of task `countdown`."""
    sudoku4: Sudoku4TaskConfig | None = None
    """Knobs of task `sudoku4`."""
    arithmetic: ArithmeticTaskConfig | None = None
    """Knobs of task `arithmetic` (addition, one source per digit count)."""
    count_shapes: CountShapesTaskConfig | None = None
    """Knobs of task `count_shapes` (a vision-language model counts coloured shapes in a picture)."""
    math_file: MathFileTaskConfig | None = None
    """Knobs of task `math_file`."""
    image_qa: ImageQATaskConfig | None = None
    """Knobs of task `image_qa` (questions about images from a JSONL file, for vision-language models)."""
    code_file: CodeFileTaskConfig | None = None
    """Knobs of task `code_file`."""
    agent_calculator: CalculatorTaskConfig | None = None
    """Knobs of task `agent_calculator` (multi-turn, calculator tool)."""
    agent_guess: GuessTaskConfig | None = None
    """Knobs of task `agent_guess` (multi-turn, higher/lower feedback)."""
    agent_lookup: LookupTaskConfig | None = None
    """Knobs of task `agent_lookup` (multi-hop key-value lookup tool)."""
    agent_countdown_python: CountdownPythonTaskConfig | None = None
    """Knobs of task `agent_countdown_python` (Countdown with a sandboxed Python tool)."""
