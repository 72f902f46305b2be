"""Each distribution under plugins/ lives in the directory of its role (plugins/README.md)."""

import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
# the registration hook a distribution of each role implements; integrations implement none of them
ROLE_HOOK = {
    "families": "dare_register_model_wrappers",
    "algorithms": "dare_register_algorithms",
    "workflows": "dare_register_workflows",
    "engines": "dare_register_engines",
    "rollouts": "dare_register_rollout_backends",
    "integrations": None,
}
# a family may ship its own sampler as a rollout backend
ALSO = {"families": {"rollouts"}}
DISTRIBUTIONS = sorted(p.parent for p in REPO.glob("plugins/*/*/pyproject.toml"))


def _entry_sources(dist: pathlib.Path) -> str:
    """The text of the modules a distribution's ``dare`` entry points name ('' if it has none)."""
    text = (dist / "pyproject.toml").read_text()
    block = re.search(r"\[project\.entry-points\.dare\]\n(.*?)(\n\[|\Z)", text, re.S)
    sources = []
    for module in re.findall(r'=\s*"([\w.]+)"', block.group(1)) if block else []:
        base = dist / "src" / module.replace(".", "/")
        path = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
        sources.append(path.read_text())
    return "\n".join(sources)


def test_plugins_holds_only_role_directories():
    found = {p.name for p in (REPO / "plugins").iterdir() if p.is_dir()}
    assert found == set(ROLE_HOOK), sorted(found ^ set(ROLE_HOOK))
    assert all(p.parent.name in ROLE_HOOK for p in DISTRIBUTIONS)
    assert len(DISTRIBUTIONS) == len(list(REPO.glob("plugins/**/pyproject.toml")))


@pytest.mark.parametrize("dist", DISTRIBUTIONS, ids=lambda p: p.name)
def test_distribution_registers_what_its_role_says(dist):
    sources = _entry_sources(dist)
    role = dist.parent.name
    if ROLE_HOOK[role] is not None:
        assert f"def {ROLE_HOOK[role]}(" in sources, f"{dist.name} is under {role}/ but has no {ROLE_HOOK[role]}"
    allowed = {role} | ALSO.get(role, set())
    others = {hook for r, hook in ROLE_HOOK.items() if hook and r not in allowed}
    assert not [hook for hook in others if f"def {hook}(" in sources], f"{dist.name} registers another role's kind"


def test_readme_lists_every_distribution():
    readme = (REPO / "plugins" / "README.md").read_text()
    for dist in DISTRIBUTIONS:
        row = next(line for line in readme.splitlines() if line.startswith(f"| `{dist.parent.name}/`"))
        assert dist.name.removeprefix("dare-plugin-") in row, f"plugins/README.md: {dist.name} not in its row"
