"""Type stubs of stepwise's native module (see the docstrings for examples)."""

from os import PathLike
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union, final, overload

Record = Dict[str, Any]
#: A device as PyTorch spells it: "auto", "cpu", "cuda", "cuda:1", a CUDA index or a torch.device.
Device = Union[str, int, Any]
#: A dtype as PyTorch spells it (torch.bfloat16, "bfloat16", "float32") or stepwise's ("auto",
#: "f32", "bf16", "bf16-weights"); float16 is refused with the reason.
Dtype = Union[str, Any]
#: Records: a list or iterable of dicts, one dict, or a path to a file of them (any format).
Records = Union[Iterable[Record], Record, str, "PathLike[str]"]
"""A record: stepwise's own (`id`, `question`, `steps`, `gold_answer`, `scores`, ...) or any
format stepwise reads (TRL, Math-Shepherd, PRM800K, ProcessBench, OmegaPRM, RLHFlow)."""

__version__: str
cuda_available: bool
#: Tokens one forward pass of scoring (or of log-probabilities) takes unless `max_batch_tokens`
#: says otherwise: the default of every `max_batch_tokens` argument, and of the command line's
#: `--max-batch-tokens`.
DEFAULT_MAX_BATCH_TOKENS: int

def cli(argv: Sequence[str]) -> int:
    """Run the `stepwise` command line on `argv` (the program's name first) in this process: its
    exit status. The `stepwise` command that `pip install` puts on the PATH calls this."""

class StepwiseError(Exception):
    """An error from stepwise, with the message that names the file, record or field at fault."""

def read(source: Union[str, "PathLike[str]", Iterable[Record], Record], format: Optional[str] = None) -> List[Record]:
    """Records from a file (JSONL, JSON, Parquet; any format, detected) or from records in
    memory, as stepwise's own records."""

def read_problems(path: Union[str, "PathLike[str]"]) -> List[Dict[str, Any]]:
    """Problems from a file as `generate`/`search`/`rl` read them (GSM8K's, MATH-500's files as
    they are): dicts with `id`, `question` and `answer` (None when absent)."""

def write(records: Records, path: Union[str, "PathLike[str]"], format: str = "stepwise") -> int:
    """Write records as `format` (JSONL, `.json` or `.parquet` by the name). Returns the count."""

def step_pairs(
    records: Records,
    layout: str = "stepwise",
    chosen_min: float = 0.5,
    dataset: str = "",
    separator: str = "\n",
    complete_with: Any = None,
    samples: int = 8,
    seed: int = 0,
    check_rollouts: int = 0,
    progress: Union[bool, Callable[[int, int], Any], None] = None,
) -> List[Dict[str, Any]]:
    """Step-level preference pairs (Step-DPO) from step-labelled records or a file: a right next
    step against a wrong one after the same sound prefix. `layout`: "stepwise", "step-dpo" or
    "trl" (DPOTrainer's prompt/chosen/rejected). `complete_with` (a Policy): a wrong step with no
    right step beside it is paired with the first step of the first of `samples` continuations
    from its prefix that reaches the gold answer (Step-DPO's rectification; chosen_source
    "sampled"); with `check_rollouts`, only one whose own continuations reach it at least
    `chosen_min` of the time."""

def convert(records: Records, format: str) -> List[Record]:
    """Records converted to `format`'s records, in memory."""

def to_arrow_ipc(records: Records, format: str = "trl") -> bytes:
    """Records as an Arrow IPC stream in `format`'s columns (what `to_hf` builds on)."""

def from_arrow_ipc(data: bytes, format: Optional[str] = None) -> List[Record]:
    """The records of an Arrow IPC stream, as stepwise's records."""

@overload
def grade(given: Union[str, float], gold: Union[str, float], mode: str = "lenient") -> bool: ...
@overload
def grade(given: Union[List[Union[str, float]], Tuple[Union[str, float], ...]], gold: Union[str, float, Sequence[Union[str, float]]], mode: str = "lenient") -> List[bool]: ...
def extract_answer(text: str) -> Optional[str]:
    """The final answer in a solution's text (`\\boxed{}`, "The answer is", `####`), or None."""

def split_steps(text: str, separator: str = "\n") -> List[str]:
    """A solution's text split into steps at `separator` (trimmed, empty ones dropped)."""

def step_rewards(
    response: Union[Sequence[int], int],
    step_scores: Sequence[float],
    step_ends: Sequence[int],
    credit: str = "return_to_go",
    outcome: Optional[float] = None,
) -> List[float]:
    """Per-token rewards: each step's reward at the token ending it (`credit`: `return_to_go` or
    `min`), the outcome at the last token, zero elsewhere."""

def openrlhf_rewards(
    queries: Sequence[str],
    prompts: Optional[Sequence[str]] = None,
    labels: Optional[Sequence[Optional[str]]] = None,
    prm: Optional["PRM"] = None,
    separator: str = "\n\n",
    aggregate: str = "min",
    outcome_weight: float = 1.0,
    mode: str = "lenient",
) -> Dict[str, Any]:
    """OpenRLHF's rewards for prompt + response queries, as `stepwise serve`'s /get_reward."""

@final
class PRM:
    """A process reward model (or ORM, or log-ratio verifier), local or behind servers."""

    def __new__(
        cls,
        source: Union[str, "PathLike[str]"],
        layout: str = "auto",
        device: Optional[Device] = None,
        max_batch_tokens: int = ...,
        dtype: Optional[Dtype] = None,
        api_key: Optional[str] = None,
        served_model: Optional[str] = None,
        protocol: str = "stepwise",
        server_tokenizer: Optional[Union[str, "PathLike[str]"]] = None,
    ) -> "PRM": ...
    def score(self, question: str, steps: Sequence[str]) -> List[float]:
        """Every step's score (probability the step is good) of one solution."""
    def score_batch(self, items: Sequence[Union[Dict[str, Any], Tuple[str, Sequence[str]]]]) -> List[List[float]]:
        """Every step's score of each `{"question", "steps"}` dict or `(question, steps)` pair."""
    def score_records(
        self,
        records: Records,
        name: str = "prm",
        batch_size: int = 64,
        on_error: str = "raise",
        progress: Union[bool, Callable[[int, int], Any], None] = None,
        output: Union[str, "PathLike[str]", None] = None,
    ) -> List[Record]:
        """Records with every step scored under `scores[name]`, `batch_size` at a time (against
        servers, two batches in flight a server). A record it cannot score: `on_error="raise"`
        raises `StepwiseError` naming it, with the records scored before it on the error's
        `records`; `"skip"` leaves it unscored (the reason in `meta["score_errors"][name]`) and
        warns with the count. `output` (`.jsonl`): each scored record appended as it comes, a
        call made again after an interruption scoring only the rest. `progress`: None or False
        (silent), True (a tqdm bar, or lines on the `stepwise` logger) or a callable
        `f(done, total)`."""
    @property
    def device(self) -> str: ...
    @property
    def layout(self) -> str: ...

@final
class Studio:
    """A labelling studio: a project in a SQLite database, served in the background for people
    to label in the browser (docs/studio.md)."""

    def __new__(
        cls,
        db: Union[str, "PathLike[str]"],
        records: Optional[Union[Iterable[Record], str, "PathLike[str]"]] = None,
        *,
        project: str = "default",
        policy: str = "uniform",
        overlap: int = 1,
        stop_at_first_bad: bool = False,
        blind: bool = False,
        qc_every: int = 10,
        code: bool = False,
        seed: int = 0,
        serve: bool = True,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> "Studio": ...
    @property
    def url(self) -> Optional[str]:
        """Where it is served (``http://127.0.0.1:PORT``), or None when not serving."""
    def add_records(self, records: Union[Iterable[Record], str, "PathLike[str]"], gold: bool = False) -> int:
        """Add records (any format stepwise reads, or a file), all or none; how many were new."""
    def add_user(self, name: str, role: str, password: str) -> None:
        """Create an account (or set its role and password): labeller, reviewer or admin."""
    def ratings(self, format: str = "stepwise", include_unlabelled: bool = False) -> List[Record]:
        """The labels as records of ``format`` (PRM800K: one per labeller and record)."""
    def dashboard(self) -> Dict[str, Any]:
        """Progress and agreement: Fleiss' κ, first-error agreement, per-labeller figures."""
    @property
    def guidelines(self) -> str:
        """The labellers' guidelines ("" when none), shown before each one's first record."""
    @guidelines.setter
    def guidelines(self, text: str) -> None: ...
    def unassigned(self) -> List[Record]:
        """The records nobody has been given yet."""
    def next_generation(self, records: Records) -> int:
        """Rank ``unassigned()`` again, scored by a new PRM; returns the new generation."""
    def close(self) -> None:
        """Stop serving; saved ratings stay in the database."""
    def __enter__(self) -> "Studio": ...
    def __exit__(self, *args: Any) -> bool: ...

@final
class Policy:
    """A policy that writes solutions step by step: local, or behind servers."""

    def __new__(
        cls,
        source: Union[str, "PathLike[str]"],
        temperature: float = 0.7,
        top_p: float = 1.0,
        max_tokens: int = 512,
        separator: str = "\n",
        prompt: str = "text",
        device: Optional[Device] = None,
        dtype: Optional[Dtype] = None,
        api_key: Optional[str] = None,
        served_model: Optional[str] = None,
        server_tokenizer: Optional[Union[str, "PathLike[str]"]] = None,
    ) -> "Policy": ...
    def continue_from(
        self, question: str, prefix: Sequence[str] = ..., n: int = 1, until: str = "end", seed: int = 0
    ) -> List[Dict[str, Any]]:
        """`n` continuations (`text`, `steps`, `finished`, `tokens`, `token_ids`)."""
    def continue_all(self, asks: Sequence[Dict[str, Any]], until: str = "end") -> List[List[Dict[str, Any]]]:
        """Many asks (`question`, and optionally `prefix`, `n`, `seed`) in one call, decoded
        together on a local engine that batches; each ask's continuations as `continue_from`
        gives them."""
    def generate(self, question: str, n: int = 1, seed: int = 0) -> List[List[str]]:
        """`n` whole solutions, each as its list of steps."""
    def loglikelihood(
        self, question: str, options: Sequence[str], prefix: Sequence[str] = ..., end: bool = False
    ) -> List[float]:
        """Each option's log-probability as the text after `question` and the steps `prefix`, laid
        out as this policy lays a solution out (with `end`, the end token after it too): one
        forward pass over every option locally, echoed log-probabilities from a server."""
    def load_adapter(self, name: str, path: Union[str, "PathLike[str]"], replace: bool = False) -> None:
        """Serve the PEFT LoRA adapter in `path` (a folder or a Hub id) as `name` on this local
        policy, unmerged beside the others; `replace=True` puts new weights under a served name."""
    def unload_adapter(self, name: str) -> None:
        """Stop serving the adapter `name` (views made with it keep it while they live)."""
    @property
    def adapters(self) -> Dict[str, Path]:
        """The adapters served on this policy's model, `{name: folder}`."""
    @property
    def adapter(self) -> Optional[str]:
        """The adapter this view samples with (`None`: the base model)."""
    def with_adapter(self, name: Optional[str]) -> "Policy":
        """This policy sampling and weighing with its served adapter `name` (`None`: the base)."""

def annotate(
    records: Records,
    policy: Any,
    method: str = "mc",
    rollouts: int = 8,
    seed: int = 0,
    output: Optional[Union[str, "PathLike[str]"]] = None,
    judge: Any = None,
    judge_samples: int = 4,
    judge_format: str = "critique",
    judge_verdict: str = "votes",
    search_limit: int = 0,
    separator: str = "\n",
    code_problems: Optional[Union[str, "PathLike[str]"]] = None,
    code_timeout: float = 10.0,
    progress: Union[bool, Callable[[int, int], Any], None] = None,
    on_error: str = "raise",
) -> List[Record]:
    """Label every step: `mc`, `binary_search`, `omegaprm`, `judge` or `consensus`; resumable to
    `output`. With `code_problems` (HumanEval/MBPP JSONL) steps are lines of code, labelled by
    running the problem's tests. `progress`: a tqdm bar where tqdm is installed, else lines on the
    `stepwise` logger (None/True), nothing (False), or a callable `f(done, total)`. A record whose
    labelling fails (no gold answer, too long for the policy): `on_error="raise"` raises
    `StepwiseError` naming it, the records labelled before it on the error's `records`; `"skip"`
    returns it unlabelled, the reason in `meta["annotate_error"]`, and warns with the count.
    `judge_verdict="likelihood"`: the judge's likeliest verdict (format index or quote; a local
    checkpoint, or a served one given `server_tokenizer`) instead of the vote over
    `judge_samples` sampled answers."""

def rooms(count: int, seed: int = 0) -> List[Record]:
    """`count` rooms worlds (a text world with an exact oracle) as problems, the world in
    `meta.world`: the agent domain's built-in environment."""

def play(
    problems: Union[Iterable[Union[str, Record]], str, "PathLike[str]"],
    policy: Any,
    env: Any = None,
    n: int = 1,
    max_actions: int = 30,
    seed: int = 0,
    output: Optional[Union[str, "PathLike[str]"]] = None,
    separator: str = "\n",
    progress: Union[bool, Callable[[int, int], Any], None] = None,
    step_timeout: float = 60.0,
) -> List[Record]:
    """Play each problem `n` times with `policy` in `env` (None or "rooms": the built-in world; else
    a class whose objects have `reset(problem) -> str` and `step(action) -> (observation, done,
    success)`, optionally `fork()` and `judge(action)`). Each step is an action with the
    environment's answer in `observation`; `correct` is the outcome, `meta.end` how it ended. An
    environment that raises, or whose `reset`/`step`/`fork` runs past `step_timeout` seconds
    (stopped by a `TimeoutError` raised in it; `float("inf")` waits forever), ends that trajectory
    (`meta.error`), never the call. Resumable to `output`."""

def label_actions(
    records: Records,
    problems: Union[Iterable[Union[str, Record]], str, "PathLike[str]"],
    method: str = "oracle",
    env: Any = None,
    policy: Any = None,
    rollouts: int = 8,
    values: str = "prm",
    gamma: float = 1.0,
    lam: float = 0.5,
    max_actions: int = 30,
    seed: int = 0,
    output: Optional[Union[str, "PathLike[str]"]] = None,
    separator: str = "\n",
    progress: Union[bool, Callable[[int, int], Any], None] = None,
    step_timeout: float = 60.0,
) -> List[Record]:
    """Label each action of trajectories: `oracle` (the environment's verdicts), `mc` (`policy`
    plays on `rollouts` times from the state after each action), `binary` (binary search for the
    first action after which none of `rollouts` reaches the goal; later actions unlabelled) or
    `td` (TD(lambda) returns from `scores[values]`, no rollouts; the GAE progress in each label's
    `source.progress`). Resumable to `output`."""

def rl(
    policy: Union[str, "PathLike[str]"],
    problems: Union[Iterable[Record], str, "PathLike[str]"],
    out: Union[str, "PathLike[str]"],
    reward: str = "outcome",
    updates: int = 100,
    prompts: int = 8,
    group_size: int = 8,
    epochs: int = 1,
    minibatch_size: int = 32,
    grad_accum: int = 1,
    lr: float = 1e-5,
    kl: float = 0.04,
    clip: float = 0.2,
    credit: str = "return_to_go",
    temperature: float = 1.0,
    max_tokens: int = 256,
    separator: str = "\n",
    chat: bool = False,
    layout: str = "auto",
    prime_beta: float = 0.05,
    prime_lr: Optional[float] = None,
    prime_filter: Tuple[float, float] = ...,
    eval_problems: Optional[Union[Iterable[Record], str, "PathLike[str]"]] = None,
    eval_every: int = 10,
    eval_samples: int = 4,
    checkpoint_every: int = 10,
    seed: int = 0,
    device: Optional[Device] = None,
    trainer: str = "auto",
    max_batch_tokens: int = ...,
    lora_rank: int = 0,
    lora_alpha: Optional[float] = None,
    lora_targets: str = "all-linear",
    progress: Union[bool, Callable[[int, int], Any], None] = None,
) -> List[Dict[str, Any]]:
    """Single-turn RL (GRPO, PPO-clip, KL to the start) as `stepwise rl`: `reward` is
    `"outcome"`, `"orm:DIR"`, `"prm:DIR"` or `"prime"` (`prime_filter` defaults to (0.2, 0.8)). The policy, optimiser and
    `rl_log.jsonl` go to `out`; a call on the same `out` resumes. `trainer` is `"auto"` (the
    packed engine's on a GPU, and on the CPU for a pretrained policy, hidden size 512 or more;
    candle's f32 autograd for a small one), `"packed"` or `"autograd"`. Returns each update's log;
    `kl=0` without PRIME trains with no reference (neither loaded nor run; no `kl` in the log).
    `lora_rank` trains LoRA adapters (`lora_alpha`, default 2 × rank; `lora_targets`, projections
    or `"all-linear"`) on the frozen policy: `out` holds the merged policy and PEFT's adapter files."""

def download(id: str) -> str:
    """Download the Hugging Face model `id` (`ORG/NAME`, optionally `@REVISION`) into the local
    Hugging Face cache, only what stepwise reads, as `stepwise download`; returns its snapshot
    folder. For a PEFT adapter, its base too when that is a model id."""

def merge_adapter(
    adapter: Union[str, "PathLike[str]"],
    out: Union[str, "PathLike[str]"],
    base: Optional[Union[str, "PathLike[str]"]] = None,
) -> str:
    """Merge the PEFT LoRA adapter `adapter` (a folder with `adapter_config.json` and
    `adapter_model.safetensors`, or its model id) onto its base, or onto `base` (for an adapter
    whose `base_model_name_or_path` is a folder of another machine), into the new folder `out`:
    PEFT's `merge_and_unload()` and `save_pretrained()`. `PRM` and `Policy` take the adapter
    itself. Returns `out`."""

def dpo(
    policy: Union[str, "PathLike[str]"],
    pairs: Union[Records, str, "PathLike[str]"],
    out: Union[str, "PathLike[str]"],
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    rpo_alpha: float = 0.0,
    epochs: int = 1,
    batch_size: int = 16,
    minibatch_size: int = 8,
    lr: float = 1e-6,
    warmup_ratio: float = 0.1,
    weight_decay: float = 0.0,
    max_grad_norm: float = 1.0,
    eval_pairs: Optional[Union[Records, str, "PathLike[str]"]] = None,
    chosen_min: float = 0.5,
    separator: str = "\n",
    chat: bool = False,
    checkpoint_every: int = 50,
    seed: int = 0,
    device: Optional[Device] = None,
    trainer: str = "auto",
    max_batch_tokens: int = ...,
    lora_rank: int = 0,
    lora_alpha: Optional[float] = None,
    lora_targets: str = "all-linear",
    progress: Union[bool, Callable[[int, int], Any], None] = None,
) -> List[Dict[str, Any]]:
    """DPO as `stepwise dpo` on preference `pairs`: `step_pairs` rows in any layout (Step-DPO),
    a file of them, or step-labelled records (mined here). `label_smoothing` is conservative
    DPO's ε; `rpo_alpha` weighs the chosen completions' NLL added to the loss (RPO). The policy, optimiser and `dpo_log.jsonl` go to `out`; a call on the same `out`
    resumes. Returns each optimiser step's log (`train`/`eval`: `loss`, `accuracy`, `margin`,
    `chosen_reward`, `rejected_reward`, `chosen_logp`, `rejected_logp`). `lora_rank` trains LoRA
    adapters on the frozen policy, as `rl`."""

def agent_rl(
    policy: Union[str, "PathLike[str]"],
    problems: Union[Iterable[Union[str, Record]], str, "PathLike[str]"],
    out: Union[str, "PathLike[str]"],
    reward: str = "goal",
    env: Any = None,
    goal_weight: float = 1.0,
    updates: int = 16,
    worlds: int = 4,
    group_size: int = 8,
    epochs: int = 1,
    minibatch_size: int = 32,
    lr: float = 1e-5,
    kl: float = 0.04,
    clip: float = 0.2,
    credit: str = "min_so_far",
    temperature: float = 1.0,
    max_tokens: int = 24,
    max_actions: int = 30,
    silent: bool = False,
    separator: str = "\n",
    layout: str = "auto",
    prime_beta: float = 0.05,
    prime_lr: Optional[float] = None,
    prime_filter: Tuple[float, float] = ...,
    eval_problems: Optional[Union[Iterable[Union[str, Record]], str, "PathLike[str]"]] = None,
    eval_every: int = 10,
    eval_samples: int = 4,
    checkpoint_every: int = 10,
    seed: int = 0,
    step_timeout: float = 60.0,
    device: Optional[Device] = None,
    trainer: str = "auto",
    max_batch_tokens: int = ...,
    lora_rank: int = 0,
    lora_alpha: Optional[float] = None,
    lora_targets: str = "all-linear",
    progress: Union[bool, Callable[[int, int], Any], None] = None,
) -> List[Dict[str, Any]]:
    """RL for an agent (GRPO over its own trajectories in `env`, the loss on its actions only):
    `reward` is `"goal"` (outcome-only), `"oracle"` (the environment's verdict on every action),
    `"prm:DIR"` (a PRM's score of every action), a process reward with the goal's advantage
    added at `goal_weight` and credited by `credit` (`"min_so_far"`, `"own"`, `"progress"`,
    `"return_to_go"`), or `"prime"` (the goal plus an implicit PRM learning online from it). The policy, optimiser and `rl_log.jsonl` go to `out`; a call on the
    same `out` resumes. `device` and `trainer` as `rl`'s (a pretrained policy trains on the
    packed engine's trainer, a small one with candle's autograd). `lora_rank` trains LoRA adapters
    on the frozen policy, as `rl`. Returns each update's log."""

def train_prm(
    records: Union[Iterable[Record], str, "PathLike[str]"],
    out: Union[str, "PathLike[str]"],
    base: Optional[Union[str, "PathLike[str]"]] = None,
    config: Optional[str] = None,
    tokenizer: Optional[Union[str, "PathLike[str]"]] = None,
    outcome: bool = False,
    head: Optional[str] = None,
    target: str = "promise",
    steps: int = 500,
    lr: Optional[float] = None,
    batch_size: int = 16,
    grad_accum: int = 1,
    valid_fraction: float = 0.1,
    valid_records: Union[Iterable[Record], str, "PathLike[str]", None] = None,
    patience: int = 0,
    seed: int = 0,
    max_len: int = 512,
    separator: str = "\n",
    neutral: str = "good",
    last_step_only: bool = False,
    stop_at_first_bad: bool = False,
    beta: float = 1.0,
    reference_logprob: Optional[float] = None,
    last_tokens: Optional[int] = None,
    device: Optional[Device] = None,
    trainer: str = "auto",
    max_batch_tokens: int = ...,
    lora_rank: int = 0,
    lora_alpha: Optional[float] = None,
    lora_targets: str = "all-linear",
    progress: Union[bool, Callable[[int, int], Any], None] = None,
) -> Dict[str, Any]:
    """Train a PRM (or, with `outcome=True`, an ORM; `head="log-ratio"`: an implicit PRM) into the
    Hugging Face folder `out`, as `stepwise train-prm`; a folder with a run's state continues it.
    `device="cuda"` trains on a GPU (every head). `trainer="packed"` trains on the packed
    engine on the CPU too (bf16 autocast, activations kept within half the free memory, recomputed past it); `"autograd"` is
    candle's f32 autograd (the CPU only); `"auto"` is packed on a GPU and for a pretrained `base` (hidden size 512 or more) on the CPU,
    autograd for the small shapes. The run ends with its best validation's weights. `valid_records` validates on a fixed held-out
    set instead of `valid_fraction` of `records`. `lr` defaults to 1e-5 to fine-tune a pretrained
    `base` (hidden size 512 or more, TRL's `PRMConfig` default) and to 1e-3 for a small base or
    a `config` shape. `lora_rank` trains LoRA adapters and the head on the frozen `base` (the
    packed trainer): `out` holds the merged model and PEFT's adapter files. Returns steps, loss,
    tokens, tokens/s, the device and the final validation's metrics."""

def search(
    problems: Union[Sequence[Union[str, Dict[str, Any]]], str, Dict[str, Any], "PathLike[str]"],
    policy: Any,
    prm: PRM,
    method: str = "beam",
    n: int = 8,
    width: int = 4,
    aggregation: str = "min",
    max_steps: int = 40,
    lookahead: int = 1,
    threshold: float = 0.5,
    max_resamples: int = 4,
    resample_budget: int = 16,
    seed: int = 0,
    name: str = "prm",
    output: Optional[Union[str, "PathLike[str]"]] = None,
    threads: int = 2,
    separator: str = "\n",
    code_problems: Optional[Union[str, "PathLike[str]"]] = None,
    code_timeout: float = 10.0,
    progress: Union[bool, Callable[[int, int], Any], None] = None,
    on_error: str = "raise",
) -> List[Record]:
    """Step-level search guided by `prm`: `bon`, `beam`, `dvts`, `lookahead`, `resample`. With
    `code_problems`, `problems` are task ids and `correct` comes from the tests. A problem whose
    search fails: `on_error="raise"` raises naming it (the records before it on the error's
    `records`), `"skip"` returns a record without steps, the reason in `meta["search_error"]`."""

def run_tests(
    problems: Union[str, "PathLike[str]"],
    samples: Records,
    timeout: float = 10.0,
    threads: Optional[int] = None,
    insecure_sandbox: bool = False,
    on_error: str = "raise",
    output: Optional[Union[str, "PathLike[str]"]] = None,
) -> List[Record]:
    """Run human-eval samples (`task_id`, `completion`) or stepwise records against the tests of
    `problems` (HumanEval/MBPP JSONL) in the sandbox; each comes back with `passed`, `result`,
    `tests_passed` and `tests_run`. A sample that is not a program of the problems:
    `on_error="raise"` names it and runs nothing, `"skip"` returns it with `passed` None and
    `error`. With `output` (a `.jsonl` path) the graded samples are appended as they are run and
    a call with the same arguments after an interruption runs only the rest."""

def generative_scores(
    policy: Any,
    items: Sequence[Union[Dict[str, Any], Tuple[str, Sequence[str]]]],
    samples: int = 4,
    seed: int = 0,
    likelihood: bool = True,
    tools: Optional[str] = None,
) -> List[List[float]]:
    """Each step's mean verdict over `samples` verification chains (a `\\boxed{correct|incorrect}`
    verdict per step, ThinkPRM's format) written by `policy`: the verdict word's probability
    P(correct) / (P(correct) + P(incorrect)) with `likelihood` where the policy gives
    log-probabilities (a local `stepwise.Policy`), else 1 or 0; 0.5 where no chain judges it.
    `tools="python"`: a chain may check a step in a ```python block, run in the sandbox, its
    output shown to it before it goes on (GenPRM's code verification)."""

def judge_scores(
    policy: Any,
    items: Sequence[Union[Dict[str, Any], Tuple[str, Sequence[str]]]],
    format: str = "index",
    likelihood: bool = True,
    samples: int = 4,
    seed: int = 0,
) -> List[List[float]]:
    """Each step's score by a judge that answers right after a solution with its first wrong
    step (`format="index"`: its index, -1 for none; `"quote"`: the step copied out), such as the
    lab's `RUN/judge` as a `stepwise.Policy`: the probability of the verdicts that put the first
    error after the step, read by likelihood in one forward pass (a local `stepwise.Policy`, or a
    served one given `server_tokenizer`: each answer's log-probabilities come back echoed, as vLLM
    and `stepwise serve` give them), or with `likelihood=False` the share of `samples` sampled
    answers."""

def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of a problem with `n` samples, `c` of them passing."""

def lab_run(preset: str = "quick", seed: int = 1, out: Optional[str] = None, sets: Sequence[str] = ..., domain: Optional[str] = None) -> Dict[str, Any]:
    """Run the built-in lab; returns metrics.json as a dict."""
