"""The set-up files agree with each other."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pins(lines):
    out = {}
    for line in lines:
        line = line.strip().lstrip("-").strip()
        m = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s#]+)$", line)
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


def test_environment_yml_matches_requirements():
    req = pins((ROOT / "requirements.txt").read_text().splitlines())
    env = pins((ROOT / "environment.yml").read_text().splitlines())
    assert req, "requirements.txt pins nothing"
    assert req == env


def test_torch_pinned_exactly():
    req = pins((ROOT / "requirements.txt").read_text().splitlines())
    assert req["torch"] == "2.13.0"


def test_readme_opens_with_the_two_commands():
    head = "\n".join((ROOT / "README.md").read_text().splitlines()[:15])
    assert "make lab" in head and "make test" in head


def test_ci_calls_make_test():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
