import json

from workbench.chain import Platform
from workbench.check import check
from workbench.demo import demo_memory_limit, run_demo
from workbench.plan import Plan
from workbench.planners import plan as run_planner
from workbench.profiles import available_profiles, load_profile


def bundled():
    names = [n for n in available_profiles() if "/" not in n]
    assert names, "data/profiles holds no bundled profile"
    return names


def test_demo_limit_binds():
    chain = load_profile(bundled()[0])
    base = Platform(4)
    limit = demo_memory_limit(chain, base)
    free = run_planner(chain, base, "dp")
    tight = run_planner(chain, base.with_(memory=limit), "dp")
    assert tight.feasible and tight.peak_memory <= limit * (1 + 1e-6)
    assert limit < free.peak_memory  # the limit really binds


def test_demo_writes_report_plans_and_gantt(tmp_path):
    name = bundled()[0]
    report = run_demo(tmp_path, devices=2, profiles=[name], methods=("dp", "uniform"))
    text = report.read_text()
    assert f"## {name}" in text and "| dp |" in text
    assert (tmp_path / f"{name}-gantt.html").stat().st_size > 10_000
    chain = load_profile(name)
    plan = Plan.from_dict(json.loads((tmp_path / "plans" / f"{name}-dp.json").read_text()))
    platform = Platform(2, memory=plan.memory_limit, bandwidth="12GB/s")
    assert check(plan, chain, platform) == []
