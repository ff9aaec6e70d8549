"""The campaign a user asks for: decoded from TOML (or command-line flags) into typed
structs, so that a wrong field is named in the error.

A campaign's id (`CampaignSpec.campaign_id`) is its `name`, or else
`<problem>-<target>-<digest>`, the digest the first 8 hex digits of the sha256 of the
whole request (less a `[writer.agent]` table at its defaults, so a request from before that
table keeps its id): the same request always names the same campaign, so running the same
command again resumes it (work in flight is redelivered by the bus, the planner goes on
after the last closed generation, recorded LLM replies are reused). A campaign file's
seed and space files, and a problem file beside it, are made absolute when it is loaded
(`with_files_from`), so any actor on any host that shares the path finds them.
`budget.wall_time` counts active time: a gap before a resume is not counted.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any, Literal, get_args

import msgspec

from bus.subjects import MAX_CAMPAIGN_ID, check_campaign_id
from gpu_workers.targets import TARGET_MAP, TARGETS, target_of


class CampaignError(ValueError):
    """A campaign file or flag that cannot be used, with the field named."""


class Budget(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    candidates: int = 40
    wall_time: str = "30m"
    """Active time: the time the campaign was running (the gap before a resume is not
    counted). At the deadline no more is proposed and the campaign finishes."""
    stop_at_roofline: float = 0.95

    def wall_seconds(self) -> float:
        return parse_duration(self.wall_time, "budget.wall_time")


WriterKind = Literal["template", "llm", "evolve"]
WRITER_KINDS: tuple[str, ...] = get_args(WriterKind)


class Agent(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`[writer.agent]`: the bounds of one variation by the LLM agent operator (evolve
    campaigns whose writer has an endpoint)."""

    max_steps: int = 12
    """LLM turns before it gives up without a submission."""
    max_tokens: int = 200_000
    """Tokens (prompt and completion, as the endpoint counts them) over the whole variation."""
    wall_time: str = "10m"
    """Wall time of the whole variation, tool calls included."""

    def wall_seconds(self) -> float:
        return parse_duration(self.wall_time, "writer.agent.wall_time")


class Writer(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    kind: WriterKind = "template"
    base_url: str | None = None
    model: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 120.0
    attempts: int = 4
    backoff_s: float = 1.0
    agent: Agent = Agent()

    @property
    def has_endpoint(self) -> bool:
        """Whether an LLM can be asked: a `base_url` and a `model`."""
        return bool(self.base_url and self.model)


class Search(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    per_generation: int = 8
    seed: int = 1
    final_contenders: int = 4
    """The top kernels timed together in the final run once the search ends (fewer if
    fewer were timed); below 2, no final run."""


class Seed(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    sources: list[str] = []
    """Kernel files that enter generation 0 as they are; relative to the campaign file."""


class SpaceEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A `[[spaces]]` table: a jinja2 template (`*.j2`) or a macro kernel of the user's."""

    file: str
    params: dict[str, list[int | str | bool]]
    restrictions: list[str] = []
    name: str = ""
    best: dict[str, int | str | bool] = {}
    algorithm: str = ""


class CampaignSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    problem: str
    name: str = ""
    target: str = "cpu"
    shapes: list[list[int]] = []
    dtype: str = "fp32"
    budget: Budget = Budget()
    writer: Writer = Writer()
    search: Search = Search()
    seed: Seed = Seed()
    spaces: list[SpaceEntry] = []

    @property
    def campaign_id(self) -> str:
        """The same request always names the same campaign, so running it again resumes."""
        if self.name:
            return check_campaign_id(self.name, "campaign name")
        request = msgspec.to_builtins(self)
        if self.writer.agent == Agent():  # as before the table was added: the same id
            del request["writer"]["agent"]
        if self.search.final_contenders == Search().final_contenders:  # likewise
            del request["search"]["final_contenders"]
        digest = hashlib.sha256(msgspec.json.encode(request)).hexdigest()[:8]
        # A file's problem is named by NAME in path.py:NAME, so that the campaigns of the
        # problems of one file differ at a glance.
        named = self.problem.rpartition(":")[2] if ":" in self.problem else Path(self.problem).stem
        problem = re.sub(r"[^A-Za-z0-9_-]", "-", named)
        suffix = f"-{self.target.replace(':', '-')}-{digest}"
        return check_campaign_id(f"{problem[: MAX_CAMPAIGN_ID - len(suffix)]}{suffix}")

    def to_config(self) -> dict[str, Any]:
        config: dict[str, Any] = msgspec.to_builtins(self)
        return config


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")


def parse_duration(text: str, field: str = "budget.wall_time") -> float:
    match = _DURATION.match(text)
    if match is None:
        raise CampaignError(f"{field} {text!r} is not a duration like 90s, 30m or 2h")
    value, unit = float(match.group(1)), match.group(2) or "s"
    seconds = value * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
    if seconds <= 0:
        raise CampaignError(f"{field} {text!r} must be longer than 0 s")
    return seconds


def parse_shapes(text: str) -> list[list[int]]:
    """`4096x4096` or `512x2048,1024x1024` (the first is timed)."""
    shapes = []
    for part in text.split(","):
        try:
            shapes.append([int(extent) for extent in part.strip().lower().split("x")])
        except ValueError:
            raise CampaignError(
                f"shapes {text!r}: write each shape as extents joined by x, shapes by commas "
                "(4096x4096,512x2048)"
            ) from None
    return shapes


def with_overrides(
    spec: CampaignSpec,
    *,
    budget: int | None = None,
    wall_time: str | None = None,
    shapes: str | None = None,
    name: str | None = None,
    writer: str | None = None,
) -> CampaignSpec:
    """The spec with the command line's flags in place of the file's fields."""
    changes: dict[str, Any] = {}
    if writer is not None:
        kinds = WRITER_KINDS
        if writer not in kinds:
            raise CampaignError(f"writer {writer!r} is unknown; use one of {list(kinds)}")
        changes["writer"] = msgspec.structs.replace(spec.writer, kind=writer)
    if budget is not None or wall_time is not None:
        changes["budget"] = msgspec.structs.replace(
            spec.budget,
            candidates=spec.budget.candidates if budget is None else budget,
            wall_time=spec.budget.wall_time if wall_time is None else wall_time,
        )
    if shapes is not None:
        changes["shapes"] = parse_shapes(shapes)
    if name is not None:
        changes["name"] = name
    return validate(msgspec.structs.replace(spec, **changes))


def validate(spec: CampaignSpec) -> CampaignSpec:
    if spec.budget.candidates < 1:
        raise CampaignError(f"budget.candidates = {spec.budget.candidates}: must be at least 1")
    if spec.search.per_generation < 1:
        raise CampaignError(
            f"search.per_generation = {spec.search.per_generation}: must be at least 1"
        )
    if not 0 < spec.budget.stop_at_roofline <= 1.5:
        raise CampaignError(
            f"budget.stop_at_roofline = {spec.budget.stop_at_roofline}: must be in (0, 1.5]"
        )
    spec.budget.wall_seconds()
    for shape in spec.shapes:
        if not shape or any(extent < 1 for extent in shape):
            raise CampaignError(
                f"shapes: {shape} is not a shape; every extent must be a whole number >= 1"
            )
    if spec.writer.timeout_s <= 0 or spec.writer.attempts < 1 or spec.writer.backoff_s < 0:
        raise CampaignError(
            "writer: timeout_s must be > 0, attempts >= 1 and backoff_s >= 0 "
            f"(got {spec.writer.timeout_s}, {spec.writer.attempts}, {spec.writer.backoff_s})"
        )
    agent = spec.writer.agent
    if agent.max_steps < 1 or agent.max_tokens < 1:
        raise CampaignError(
            "writer.agent: max_steps and max_tokens must be at least 1 "
            f"(got {agent.max_steps}, {agent.max_tokens})"
        )
    agent.wall_seconds()
    if spec.target not in TARGET_MAP:
        raise CampaignError(f"target {spec.target!r} is unknown; use one of {list(TARGETS)}")
    target = target_of(spec.target)
    if spec.dtype not in target.dtypes:
        raise CampaignError(
            f"dtype {spec.dtype!r}: {spec.target} kernels take {list(target.dtypes)}"
        )
    if spec.writer.kind == "llm" and target.llm_brief is None:
        written = ", ".join(t.name for t in TARGET_MAP.values() if t.llm_brief is not None)
        raise CampaignError(
            f"writer.kind = 'llm' writes {written} kernels only so far; {spec.target} campaigns "
            "search the templates (writer.kind = 'template')"
        )
    if spec.writer.kind == "evolve" and target.source_language != "c":
        raise CampaignError(
            f"writer.kind = 'evolve' varies C kernels (cpu) only so far; {spec.target} "
            "campaigns search the templates (writer.kind = 'template')"
        )
    if spec.writer.kind == "llm" and not spec.writer.has_endpoint:
        raise CampaignError("writer.base_url and writer.model are needed for writer.kind = 'llm'")
    try:
        spec.campaign_id  # noqa: B018 - validates the name
    except ValueError as exc:
        raise CampaignError(str(exc)) from exc
    return spec


def load_campaign(path: Path) -> CampaignSpec:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CampaignError(f"cannot read {path}: {exc.strerror}") from exc
    try:
        spec = msgspec.toml.decode(data, type=CampaignSpec)
    except msgspec.ValidationError as exc:
        raise CampaignError(f"{path}: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise CampaignError(f"{path} is not valid TOML: {exc}") from exc
    try:
        return validate(with_files_from(spec, path.parent))
    except CampaignError as exc:
        raise CampaignError(f"{path}: {exc}") from None


def with_files_from(spec: CampaignSpec, folder: Path) -> CampaignSpec:
    """The spec with its seed and space files (and a problem file found there) made
    absolute, from `folder`: every actor then finds them wherever it runs."""

    def absolute(file: str) -> str:
        return str((folder / file).resolve())

    problem = spec.problem
    path_text, sep, attr = problem.rpartition(":")
    if sep and not Path(path_text).is_absolute() and (folder / path_text).is_file():
        problem = f"{absolute(path_text)}:{attr}"
    return msgspec.structs.replace(
        spec,
        problem=problem,
        seed=Seed(sources=[absolute(f) for f in spec.seed.sources]),
        spaces=[msgspec.structs.replace(s, file=absolute(s.file)) for s in spec.spaces],
    )


def decode_config(config: dict[str, Any]) -> CampaignSpec:
    """The spec back from a CampaignStarted event's config."""
    return msgspec.convert(config, CampaignSpec)
