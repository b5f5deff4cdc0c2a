"""Framework: configs and their validation, registries, orchestras (control flow with scripted agents),
the step table, and a user-defined workflow."""
from __future__ import annotations

import numpy as np
import pytest

from drmas.agents import AGENT_REGISTRY, Agent, AgentView, Parsed, make_agent, register_agent
from drmas.config import ConfigError, load_config
from drmas.orchestra import Episodes, make_orchestra, register_orchestra
from drmas.step_table import ARRAY_COLUMNS, LIST_COLUMNS, StepTable
from envs.base import Task

TWO_AGENTS = ["agents=[{name: solver, role: math_solver, model: a}, {name: verifier, role: math_verifier, model: b}]",
              "models={a: {path: x}, b: {path: y}}"]


# ---------------------------------------------------------------------------------------------- configs
def test_overrides_and_effective_per_agent_config():
    cfg = load_config(None, TWO_AGENTS + ["agents.solver.lr=0.001", "agents.1.sampling.max_new_tokens=8",
                                          "models.b.optim.lr=3e-4", "algo.estimator=trajectory_grpo"])
    assert cfg.effective_optim("a").lr == 0.001
    assert cfg.effective_optim("b").lr == 3e-4
    eff = cfg.effective_agents()
    assert eff["verifier"]["sampling"]["max_new_tokens"] == 8 and eff["solver"]["model"] == "a"
    assert cfg.algo.estimator == "trajectory_grpo"


def test_override_of_a_yaml_alias_changes_only_that_key(tmp_path):
    # search_base.yaml writes `search_model: *nano_base`: an override of one model must not reach the others
    path = tmp_path / "c.yaml"
    path.write_text("models:\n  a: &base {path: x}\n  b: *base\n"
                    "agents: [{name: solver, role: math_solver, model: a}, {name: verifier, role: math_verifier, model: b}]\n")
    cfg = load_config(path, ["models.a.path=y"])
    assert (cfg.models["a"].path, cfg.models["b"].path) == ("y", "x")


@pytest.mark.parametrize("overrides, message", [
    (["train.stepz=3"], "train.stepz: unknown key"),
    (["train.steps=-1"], "train.steps"),
    (["train.batch_tasks=abc"], "train.batch_tasks"),
    (["algo.estimator=nope"], "unknown estimator 'nope'"),
    (["algo.ddof=2"], "algo.ddof"),
    (["agents=[{name: s, role: math_solver, model: missing}]"], "agents[0].model = 'missing' is not defined"),
    (["agents=[{name: s, role: math_solver, model: shared}, {name: s, role: math_solver, model: shared}]"],
     "duplicate agent names"),
    (["agents=[{name: s, role: math_solver, model: shared, lr: 0.1}, {name: v, role: math_verifier, model: shared, lr: 0.2}]"],
     "share model 'shared' but set different `lr`"),
    (TWO_AGENTS + ["agents.nobody.lr=1"], "no entry named 'nobody'"),
    (TWO_AGENTS + ["agents.5.lr=1"], "index 5 out of range"),
    (["train"], "must look like key.sub=value"),
])
def test_bad_configs_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert message in str(info.value), str(info.value)


def test_config_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_sharing_agents_may_agree():
    cfg = load_config(None, ["agents=[{name: solver, role: math_solver, model: shared, lr: 0.1},"
                             " {name: verifier, role: math_verifier, model: shared, lr: 0.1}]"])
    assert cfg.effective_optim("shared").lr == 0.1


# -------------------------------------------------------------------------------------------- registries
def test_agent_registry_rejects_duplicates_and_unknown_names():
    with pytest.raises(ValueError, match="already registered"):
        register_agent("math_solver")(type("Dup", (Agent,), {"render": lambda s, v: "", "parse": lambda s, t: Parsed(True)}))
    with pytest.raises(KeyError, match="registered: \\["):
        make_agent("no_such_role", "x")
    with pytest.raises(KeyError, match="unknown orchestra"):
        make_orchestra("nope")
    with pytest.raises(ValueError, match="max_loops"):
        make_orchestra("math", max_loops=0)
    assert {"math_solver", "math_verifier", "search_verifier", "search_searcher", "search_answerer"} <= set(AGENT_REGISTRY)


@pytest.mark.parametrize("text, valid, action", [
    ("ok <verify>approve</verify>", True, "approve"),
    ("<verify> Reject </verify>", True, "reject"),
    ("<verify>maybe</verify>", False, ""),
    ("<verify>approve</verify><verify>reject</verify>", False, ""),
    ("<verify>approve", False, ""),
    ("", False, ""),
])
def test_verifier_projection(text, valid, action):
    p = make_agent("math_verifier", "verifier").parse(text)
    assert (p.valid, p.action) == (valid, action)


def test_solver_projection_and_prompt():
    solver = make_agent("math_solver", "solver")
    assert solver.parse("3+4=7. \\boxed{7}") == Parsed(True, "7")
    assert not solver.parse("no answer here").valid
    task = Task("t", "Compute 3+4.", ("7",))
    first = solver.prompt(AgentView(task))
    retry = solver.prompt(AgentView(task, team={"previous_solution": "\\boxed{8}", "verifier_output": "<verify>reject</verify>"}))
    assert "Compute 3+4." in first and "Previous solution" not in first
    assert "\\boxed{8}" in retry and "reject" in retry


# -------------------------------------------------------------------------------------------- orchestras
MATH_ROLES = {"solver": "math_solver", "verifier": "math_verifier", "drafter": "math_solver", "reviser": "math_solver"}
SEARCH_ROLES = {"verifier": "search_verifier", "search": "search_searcher", "answer": "search_answerer",
                "agent": "search_single"}


class Scripted:
    """Answers each agent call from a function of (slot, view), parses with the real agent classes and
    records the calls (control-flow tests of the orchestras; the real rollout path is tested end to end
    in test_training.py)."""

    def __init__(self, respond, roles):
        self.respond, self.calls = respond, []
        self.agents = {slot: make_agent(role, slot) for slot, role in roles.items()}

    def __call__(self, slot, idx, views, turn):
        texts = [self.respond(slot, v) for v in views]
        self.calls.append((slot, list(idx), turn))
        return texts, [self.agents[slot].parse(t) for t in texts]


def _math_tasks():
    return [Task("a", "Problem: 2+2", ("4",)), Task("b", "Problem: 3+3", ("6",))]


def test_math_loop_retries_only_rejected_and_skips_last_verifier():
    import envs.math  # noqa: F401
    from envs.base import make_env

    def respond(slot, view):
        if slot == "solver":
            wrong = not view.team.get("previous_solution")  # first round wrong, retry right
            answer = {"a": 4, "b": 6}[view.task.task_id] + (1 if wrong and view.task.task_id == "a" else 0)
            return f"\\boxed{{{answer}}}"
        # verifier rejects task a's wrong first solution, approves b
        return "<verify>reject</verify>" if "\\boxed{5}" in view.team["solution"] else "<verify>approve</verify>"

    episodes = Episodes(_math_tasks(), make_env("math"))
    call = Scripted(respond, MATH_ROLES)
    make_orchestra("math", max_loops=2).run(episodes, call)
    assert call.calls == [("solver", [0, 1], 0), ("verifier", [0, 1], 1), ("solver", [0], 2)]
    np.testing.assert_array_equal(episodes.reward, [1.0, 1.0])
    # max_loops=3 with a verifier that always rejects: solver, verifier, solver, verifier, solver (no 3rd verifier)
    episodes = Episodes(_math_tasks(), make_env("math"))
    call = Scripted(lambda slot, v: "\\boxed{0}" if slot == "solver" else "<verify>reject</verify>", MATH_ROLES)
    make_orchestra("math", max_loops=3).run(episodes, call)
    assert [c[0] for c in call.calls] == ["solver", "verifier", "solver", "verifier", "solver"]
    np.testing.assert_array_equal(episodes.reward, [0.0, 0.0])


def test_user_defined_sequential_workflow():
    import envs.math  # noqa: F401
    from envs.base import make_env

    episodes = Episodes(_math_tasks(), make_env("math"))
    call = Scripted(lambda slot, v: "\\boxed{0}" if slot == "drafter" else
                    "\\boxed{" + {"a": "4", "b": "6"}[v.task.task_id] + "}", MATH_ROLES)
    make_orchestra("math_sequential").run(episodes, call)
    assert [c[0] for c in call.calls] == ["drafter", "reviser"]
    np.testing.assert_array_equal(episodes.reward, [1.0, 1.0])


def test_registering_a_new_orchestra_is_a_decorator_away():
    @register_orchestra("test_only_once")
    class Once:  # noqa: D401 - minimal example from docs/extending.md
        slots = ("solver",)

        def run(self, episodes, call):
            everyone = np.arange(len(episodes))
            texts, _ = call("solver", everyone, [AgentView(t) for t in episodes.tasks], turn=0)
            episodes.act(everyone, texts)

    assert isinstance(make_orchestra("test_only_once"), Once)
    with pytest.raises(ValueError, match="already registered"):
        register_orchestra("test_only_once")(Once)


def test_a_search_orchestra_on_an_env_without_history_says_what_it_needs():
    import envs.math  # noqa: F401
    from envs.base import make_env

    episodes = Episodes(_math_tasks(), make_env("math"))
    call = Scripted(lambda slot, v: "<verify>no</verify>", MATH_ROLES)
    with pytest.raises(TypeError, match=r"environment with history\(i\) \(envs\.base\.HistoryEnv\); MathEnv has none"):
        make_orchestra("search").run(episodes, call)


@pytest.fixture(scope="module")
def search_source():
    from drmas.tasks import make_task_source

    return make_task_source("search_generated")


def test_search_hierarchy_routes_and_ends_with_zero_when_never_enough(search_source):
    tasks = search_source.train_tasks(0, 2, seed=0)

    def respond(slot, view):
        if slot == "verifier":
            return "<verify>yes</verify>" if "<information>" in view.history else "<verify>no</verify>"
        if slot == "search":
            return f"<search>{view.task.question}</search>"
        return f"<answer>{view.task.answers[0]}</answer>"

    episodes = Episodes(tasks, search_source.make_env())
    call = Scripted(respond, SEARCH_ROLES)
    make_orchestra("search", max_turns=4).run(episodes, call)
    assert [c[0] for c in call.calls] == ["verifier", "search", "verifier", "answer"]
    np.testing.assert_array_equal(episodes.reward, [1.0, 1.0])
    # a verifier that always says no: search on turns 0..2, no search on the last turn, reward 0
    episodes = Episodes(tasks, search_source.make_env())
    call = Scripted(lambda slot, v: "<verify>no</verify>" if slot == "verifier" else "<search>x</search>",
                    SEARCH_ROLES)
    make_orchestra("search", max_turns=4).run(episodes, call)
    assert [c[0] for c in call.calls] == ["verifier", "search"] * 3 + ["verifier"]
    np.testing.assert_array_equal(episodes.reward, [0.0, 0.0])
    assert episodes.done.all()


def test_search_single_agent(search_source):
    tasks = search_source.train_tasks(1, 3, seed=0)
    episodes = Episodes(tasks, search_source.make_env())
    call = Scripted(lambda slot, v: f"<answer>{v.task.answers[0]}</answer>" if "<information>" in v.history
                    else f"<search>{v.task.question}</search>", SEARCH_ROLES)
    make_orchestra("search_single", max_turns=3).run(episodes, call)
    assert [c[0] for c in call.calls] == ["agent", "agent"]
    assert episodes.reward.tolist() == [1.0, 1.0, 1.0]


# -------------------------------------------------------------------------------------------- step table
def test_step_table_rewards_penalty_and_select():
    t = StepTable(task=np.array([0, 0, 1]), traj=np.array([0, 1, 2]), agent=np.array(["s", "v", "s"], object),
                  wg=np.array(["m", "m", "m"], object), turn=np.zeros(3, np.int64), valid=np.array([True, False, True]),
                  truncated=np.zeros(3, bool), reward=np.zeros(3), score=np.zeros(3), advantage=np.full(3, np.nan),
                  prompt_ids=[[1], [2], [3]], response_ids=[[4], [5, 6], [7]], texts=["a", "b", "c"])
    t.assign_rewards(np.array([1.0, 0.0, 1.0]), invalid_penalty=0.1)
    np.testing.assert_allclose(t.score, [1.0, -0.1, 1.0])
    sub = t.select(np.array([False, True, True]))
    assert len(sub) == 2 and sub.response_ids == [[5, 6], [7]] and sub.texts == ["b", "c"]
    both = StepTable.concat([t, sub])
    assert len(both) == 5 and both.response_len.tolist() == [1, 2, 1, 2, 1]
    assert set(StepTable.__dataclass_fields__) == {*ARRAY_COLUMNS, *LIST_COLUMNS}  # concat/select see every column


def test_cli_data_prepare_math(shared_data, tmp_path, capsys):
    from drmas.cli import main

    assert main(["data", "prepare", "math", "--out", str(tmp_path)]) == 0
    report = capsys.readouterr().out
    assert '"overlap_rows_removed": 10' in report  # DAPO-17k holds 10 test problems
    assert (tmp_path / "dapo17k.jsonl").exists() and (tmp_path / "aime24.jsonl").exists()


def test_cli_reports_config_errors(capsys):
    from drmas.cli import main

    assert main(["train", "/nonexistent/config.yaml"]) == 2
    assert "does not exist" in capsys.readouterr().err
