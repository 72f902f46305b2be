"""Resolve a run configuration from layers, later winning: (1) the attrs defaults of
:class:`RunConfig` and of the algorithm's / rollout backend's config classes; (2) the algorithm's
``recipe`` (defaults for other sections, e.g. ``trainer.lr``); (3) the checkpoint's
``dare_defaults.yaml`` (its ``common`` section, then the one of the algorithm's workflow kind:
run settings a bundled tiny checkpoint ships); (4) the ``--config`` YAML file; (5) ``key=value``
overrides (values parsed as YAML; dotted keys address nested sections). Plugin-owned sections
(``dare_register_config_sections``) are top-level keys in every layer. Unknown names, unsupported
combinations and a checkpoint of another family fail before any model is loaded; all config
problems are reported together in one :class:`~dare_core.errors.ConfigError`.
"""

from __future__ import annotations

import copy
import os
from typing import Any, Iterable, Optional

import attrs
import yaml

from dare_core.config.schema import RunConfig
from dare_core.config.structure import structure, unstructure
from dare_core.errors import CapabilityError, ConfigError, DareError
from dare_core.models.hub import local_checkpoint
from dare_core.registry import ROLES, declared_names

#: RunConfig fields config resolution sets (never keys of a config file or override)
RESOLVED = ("rollout_backend", "train_rollout", "eval_rollout")

PRESET_FILE = "dare_defaults.yaml"


def load_yaml(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        raise DareError(f"config file {path!r} does not exist; pass an existing YAML file to --config")
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except UnicodeDecodeError as exc:
        raise DareError(f"config file {path!r} is not valid UTF-8 (byte {exc.start}); save it as UTF-8") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise DareError(f"config file {path!r} is not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise DareError(f"config file {path!r} must hold a mapping at the top level, got {type(data).__name__}")
    return data


def parse_overrides(overrides: Iterable[str]) -> tuple[dict[str, Any], list[str]]:
    """``["a.b=1", "c=x"]`` → nested dict; returns ``(dict, problems)``."""
    out: dict[str, Any] = {}
    problems: list[str] = []
    for item in overrides:
        if "=" not in item:
            problems.append(f"override {item!r}: expected key=value (e.g. trainer.lr=1e-5)")
            continue
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key or any(not part for part in key.split(".")):
            problems.append(f"override {item!r}: empty key")
            continue
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            nxt = node.get(part)
            if not isinstance(nxt, dict):
                nxt = {}
                node[part] = nxt
            node = nxt
        node[parts[-1]] = value
    return out, problems


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _section(raw: dict[str, Any], key: str, problems: list[str]) -> dict[str, Any]:
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(f"{key}: expected a mapping, got {value!r}")
        return {}
    return value


def backend_offers(
    rollout_spec: Any, records: frozenset, fields: frozenset = frozenset(), methods: frozenset = frozenset()
) -> bool:
    """Whether the rollout backend records ``records`` and offers the config ``fields`` and the
    ``methods`` an algorithm's training rollout uses."""
    cfg_fields = {f.name for f in attrs.fields(rollout_spec.config_cls)}
    return records <= rollout_spec.records and fields <= cfg_fields and methods <= rollout_spec.methods


def _default_backend(dare: Any, spec: Any, family: Any, preset: dict[str, Any]) -> str:
    """The rollout backend when ``rollout.backend`` is not given: the first that is installed, drives
    the family and serves the algorithm's training rollout (records, config fields, methods) of the
    checkpoint preset's ``rollout.backend``, the family's default and its other backends (else the default)."""
    suggested = (preset.get("rollout") or {}).get("backend") if isinstance(preset.get("rollout"), dict) else None
    candidates = [family.default_rollout] + [n for n in family.rollouts if n != family.default_rollout]
    if suggested:
        candidates = [str(suggested)] + [n for n in candidates if n != suggested]
    # what the algorithm's training rollout needs, as its spec declares it
    rl = spec is not None and spec.workflow == "rl"
    needs = (spec.rollout.records, spec.rollout.fields, spec.rollout.methods) if rl else (frozenset(),) * 3
    for name in candidates:
        if name not in dare.registries.rollouts:
            continue
        rs = dare.registries.rollouts.get(name)
        if name == suggested and misfit("", rs, family, ""):
            continue
        if backend_offers(rs, *needs):
            return name
    return family.default_rollout


def misfit(subject: str, spec: Any, family: Any, hint: str) -> Optional[str]:
    """One line saying why ``spec`` (with ``kinds``/``requires``) cannot serve ``family``, or
    ``None`` when it can."""
    if spec.kinds and family.kind not in spec.kinds:
        return (
            f"{subject} does not support {family.kind}-diffusion models such as {family.name!r} "
            f"(it supports: {', '.join(sorted(spec.kinds))}); {hint}"
        )
    missing = sorted(set(spec.requires) - set(family.capabilities))
    lacks = f"{subject} needs model capability {', '.join(missing)} which {family.name!r} lacks; {hint}"
    return lacks if missing else None


def check_support(dare: Any, algo_name: str, family_name: str) -> tuple[Any, Any]:
    """Look up both names and check the algorithm (and every component it lists) supports the
    family; one-line errors."""
    regs = dare.registries
    algo = regs.algorithms.get(algo_name)
    family = regs.models.get(family_name)
    hint = "see `dare list --matrix` for supported combinations"
    if problem := misfit(f"algorithm {algo.name!r}", algo, family, hint):
        raise CapabilityError(problem)
    for role in algo.components:
        if role not in ROLES:  # a role without a registry: nothing to check
            continue
        registry = regs[ROLES[role]]
        present = [n for n in declared_names(algo.components, role) if n in registry]
        problems = [
            misfit(f"algorithm {algo.name!r} uses {role} {n!r}, which", registry.get(n), family, hint) for n in present
        ]
        if present and all(problems):  # alternatives: one that serves the family is enough
            raise CapabilityError(problems[0])
    return algo, family


def resolve(
    dare: Any,
    *,
    algo: Optional[str] = None,
    model: Optional[str] = None,
    config_file: Optional[str] = None,
    overrides: Iterable[str] = (),
    workflow: Optional[str] = None,
    need_algo: bool = True,
) -> RunConfig:
    """Build the frozen :class:`RunConfig` of a run (see the module docstring for layers).

    :param workflow: if given, the algorithm must run in this workflow (e.g. ``rl``).
    :param need_algo: ``False`` for commands that use only the model (generate, eval).
    """
    raw = load_yaml(config_file) if config_file else {}
    over, problems = parse_overrides(overrides)
    raw = deep_merge(raw, over)
    if algo:
        raw["algo"] = algo
    if model:
        raw["model"] = dict(raw["model"] if isinstance(raw.get("model"), dict) else {}, family=model)
    algo_name = raw.get("algo") or ""
    model_sec = section if isinstance(section := raw.get("model"), dict) else {}
    family_name = model_sec.get("family") or ""
    if not algo_name and need_algo:
        raise DareError("no algorithm given; pass --algo NAME (see `dare list algorithms`)")
    if not family_name:
        raise DareError("no model family given; pass --model NAME (see `dare list models`)")
    if algo_name:
        spec, family = check_support(dare, str(algo_name), str(family_name))
    else:
        spec, family = None, dare.registries.models.get(str(family_name))
    if spec is not None and workflow and spec.workflow != workflow:
        raise DareError(f"algorithm {spec.name!r} runs the {spec.workflow} workflow, not {workflow}")

    if model_sec.get("path") is not None and not str(model_sec["path"]).strip():
        raise ConfigError(["model.path is empty; omit it to use the bundled checkpoint or give a directory"])
    path = local_checkpoint(model_sec.get("path")) or family.default_checkpoint
    if not path:
        raise DareError(f"model family {family.name!r} ships no bundled checkpoint; pass model.path=DIR")
    raw["model"] = dict(model_sec, path=path)
    lora_sec = model_sec.get("lora")
    if isinstance(lora_sec, dict) and isinstance(lora_sec.get("adapter"), str):
        raw["model"]["lora"] = dict(lora_sec, adapter=local_checkpoint(lora_sec["adapter"], "model.lora.adapter"))
    from dare_core.preflight import checkpoint  # whose checkpoint it is, before its preset applies

    saved = (checkpoint(dare, family, str(path)) or ("", {}))[1]  # its config.json
    preset_path = os.path.join(str(path), PRESET_FILE)
    preset: dict[str, Any] = {}
    if os.path.isfile(preset_path):
        data = load_yaml(preset_path)
        preset = deep_merge(data.get("common") or {}, (data.get(spec.workflow) or {}) if spec is not None else {})
        # settings tuned for one algorithm on this checkpoint (``algorithms: {name: {...}}``)
        per_algo = data.get("algorithms") if spec is not None else None
        if isinstance(per_algo, dict) and isinstance(per_algo.get(spec.name), dict):
            preset = deep_merge(preset, per_algo[spec.name])

    rollout_raw = _section(raw, "rollout", [])  # a non-mapping is reported once, below
    backend_name = rollout_raw.get("backend") or _default_backend(dare, spec, family, preset)
    rollout_spec = dare.registries.rollouts.get(str(backend_name))
    backend_hint = f"use one of: {', '.join(family.rollouts) or family.default_rollout}"
    if problem := misfit(f"rollout backend {rollout_spec.name!r}", rollout_spec, family, backend_hint):
        raise CapabilityError(problem)
    # the preset's rollout / algorithm keys apply only where the chosen backend / algorithm has them
    # (the rollout keys also where the evaluation backend has them: eval_rollout_config)
    preset_rollout = dict(preset["rollout"]) if isinstance(preset.get("rollout"), dict) else {}
    for key, cls in (("rollout", rollout_spec.config_cls), ("algorithm", spec.config_cls if spec else None)):
        if isinstance(preset.get(key), dict) and cls is not None:
            preset = dict(preset, **{key: _fields_of(cls, preset[key])})
        elif key == "algorithm":
            preset.pop("algorithm", None)
    recipe = copy.deepcopy(dict(spec.recipe)) if spec is not None else {}
    if isinstance(recipe.get("rollout"), dict):  # so do the recipe's (written for the default backends)
        recipe["rollout"] = _fields_of(rollout_spec.config_cls, recipe["rollout"])
    raw = deep_merge(deep_merge(recipe, preset), raw)
    if raw["model"].get("dtype", "auto") == "auto":  # the checkpoint's own
        raw["model"] = dict(raw["model"], dtype=saved.get("dtype") or saved.get("torch_dtype") or "float32")

    rollout_raw = dict(_section(raw, "rollout", problems))
    rollout_raw.pop("backend", None)
    algorithm_raw = _section(raw, "algorithm", problems)
    owned = plugin_sections(dare)
    top_raw = {k: v for k, v in raw.items() if k not in ("algorithm", "rollout", *RESOLVED, "sections", *owned)}
    problems += [f"{k}: resolved from the rollout and eval sections, not a config key" for k in RESOLVED if k in raw]
    top, top_problems = structure(RunConfig, top_raw, extra_keys=owned)
    problems += top_problems
    if "sections" in raw:
        problems.append(
            "sections: not a config key; plugin-owned sections are top-level keys "
            f"(installed: {', '.join(owned) or 'none'})"
        )
    algo_cfg: Any = {}
    if spec is not None:
        algo_cfg, algo_problems = structure(spec.config_cls, algorithm_raw, "algorithm")
        problems += algo_problems
    elif algorithm_raw:
        problems.append("algorithm: options given but no algorithm selected")
    roll_cfg, roll_problems = structure(rollout_spec.config_cls, rollout_raw, "rollout")
    problems += roll_problems
    sections: dict[str, Any] = {}
    for name, sec in owned.items():
        sections[name], sec_problems = structure(sec.config_cls, raw.get(name), name)
        problems += sec_problems
    if top is not None and top.task.name not in dare.registries.tasks:
        problems.append("task.name: " + dare.registries.tasks.unknown_message(top.task.name))
    if top is not None and top.engine.name not in dare.registries.engines:
        problems.append("engine.name: " + dare.registries.engines.unknown_message(top.engine.name))
    if top is not None and top.eval.backend:
        if top.eval.backend not in dare.registries.rollouts:
            problems.append("eval.backend: " + dare.registries.rollouts.unknown_message(top.eval.backend))
        else:
            problem = misfit(
                f"eval.backend {top.eval.backend!r}",
                dare.registries.rollouts.get(top.eval.backend),
                family,
                backend_hint,
            )
            if not problem and top.eval.backend not in (family.default_rollout, *family.rollouts):
                problem = f"eval.backend {top.eval.backend!r} is not a backend model family {family.name!r} lists; {backend_hint}"
            if problem:
                problems.append(problem)
    # an RL algorithm's advantage estimators (none listed: the loop's group_norm) that compare rollouts
    adv = declared_names(spec.components, "advantage") if spec is not None and spec.workflow == "rl" else ()
    grouped = [n for n in adv if n in dare.registries.advantages]
    if (
        top is not None
        and top.trainer.group_size < 2
        and grouped
        and all(dare.registries.advantages.get(n).needs_groups for n in grouped)
    ):
        problems.append(
            f"trainer.group_size={top.trainer.group_size}: algorithm {spec.name!r} compares the "
            f"rollouts of each prompt (advantage {grouped[0]!r}); set trainer.group_size to 2 or more"
        )
    if problems:
        raise ConfigError(problems)
    top = attrs.evolve(top, algorithm=algo_cfg, rollout=roll_cfg, rollout_backend=rollout_spec.name, sections=sections)
    return derive_rollouts(dare, top, spec, preset_rollout)


def _fields_of(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``values`` that name a field of the attrs class ``cls``."""
    names = {f.name for f in attrs.fields(cls)}
    return {k: v for k, v in values.items() if k in names}


def derive_rollouts(dare: Any, config: RunConfig, spec: Any, preset_rollout: Optional[dict] = None) -> RunConfig:
    """``config`` with its training and evaluation rollout configs derived, once: the training one
    as the RL algorithm's ``RolloutNeeds.adjust`` gives it, the evaluation one by
    :func:`eval_rollout_config` (``preset_rollout``: the checkpoint preset's rollout keys)."""
    train = config.rollout
    if spec is not None and spec.workflow == "rl" and spec.rollout.adjust is not None:
        train = spec.rollout.adjust(config.algorithm, config.rollout)
    return attrs.evolve(config, train_rollout=train, eval_rollout=eval_rollout_config(dare, config, preset_rollout))


def eval_rollout_config(dare: Any, config: RunConfig, preset_rollout: Optional[dict] = None) -> Any:
    """The evaluation rollout config: the run's (another ``eval.backend``: its defaults, the
    checkpoint preset's rollout keys it has, e.g. ``block_length`` where the training backend
    has none, and the fields it shares with the rollout section) at eval's temperature and steps
    (null: gen_length)."""
    rc = config.rollout
    name = config.eval.backend or config.rollout_backend
    if name != config.rollout_backend:
        cls = dare.registries.rollouts.get(name).config_cls
        shared = {**_fields_of(cls, preset_rollout or {}), **_fields_of(cls, attrs.asdict(rc, recurse=False))}
        rc, problems = structure(cls, shared, "eval rollout")
        if problems:
            raise ConfigError([f"eval.backend={name}: {p}" for p in problems])
    names = {f.name for f in attrs.fields(type(rc))}
    changes: dict[str, Any] = {}
    if "temperature" in names:
        changes["temperature"] = config.eval.temperature
    steps = config.eval.steps
    if "steps" in names and steps is None and "gen_length" in names:
        steps = rc.gen_length
    if "steps" in names and steps is not None:
        changes["steps"] = steps
    return attrs.evolve(rc, **changes)


def plugin_sections(dare: Any) -> dict[str, Any]:
    """The registered plugin-owned config sections (name -> ``ConfigSection``), sorted by name;
    a section named like a key of the core's run config is refused."""
    registry = dare.registries.config_sections
    core = {f.name for f in attrs.fields(RunConfig)}
    for name, sec in registry.items():
        owner = registry.owner(name)
        if name in core:
            raise DareError(
                f"plugin {owner!r} registers the config section {name!r}, a key of the "
                f"core's run config; rename the section or disable the plugin "
                f"(DARE_DISABLE_PLUGINS={owner})"
            )
        if not attrs.has(sec.config_cls):
            raise TypeError(
                f"plugin {owner!r}: config section {name!r} needs an attrs class as config_cls, got {sec.config_cls!r}"
            )
    return dict(registry.items())


def to_dict(config: RunConfig) -> dict[str, Any]:
    """Plain data of a resolved config (``rollout.backend`` folded back in, plugin-owned
    sections as top-level keys)."""
    data = unstructure(config)
    data["rollout"] = dict(backend=config.rollout_backend, **(data.get("rollout") or {}))
    for key in RESOLVED:
        data.pop(key, None)
    data.update(data.pop("sections", None) or {})
    return data


def render_with_help(config: RunConfig, dare: Any = None) -> str:
    """YAML of a resolved config with each field's help text as a comment; plugin-owned sections
    last, headed by their registered description (with ``dare``) or their class docstring's first line."""
    lines: list[str] = []

    def emit(obj: Any, indent: int, extra: Optional[dict[str, Any]] = None) -> None:
        pad = "  " * indent
        if extra:
            for k, (v, h) in extra.items():
                lines.append(f"{pad}{k}: {_scalar(v)}  # {h}")
        for f in attrs.fields(type(obj)):
            if isinstance(obj, RunConfig) and f.name in (*RESOLVED, "sections"):
                continue
            value = getattr(obj, f.name)
            help_text = f.metadata.get("help", "")
            if attrs.has(type(value)):
                lines.append(f"{pad}{f.name}:  # {help_text}" if help_text else f"{pad}{f.name}:")
                sub_extra = None
                if f.name == "rollout" and isinstance(obj, RunConfig):
                    sub_extra = {"backend": (obj.rollout_backend, "Rollout backend.")}
                emit(value, indent + 1, sub_extra)
            else:
                comment = f"  # {help_text}" if help_text else ""
                lines.append(f"{pad}{f.name}: {_scalar(value)}{comment}")

    emit(config, 0)
    if config.sections:
        lines.append("# " + attrs.fields(RunConfig).sections.metadata["help"])
        registered = dare.registries.config_sections if dare is not None else None
        for name, value in config.sections.items():
            desc = registered.get(name).description if registered and name in registered else ""
            desc = desc or (type(value).__doc__ or "").strip().split("\n")[0]
            lines.append(f"{name}:  # {desc}" if desc else f"{name}:")
            emit(value, 1)
    return "\n".join(lines) + "\n"


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(unstructure(value), default_flow_style=True, width=10_000).strip()
    return text.replace("\n...", "")  # the end-of-document marker of a scalar
