"""Reliability, part 1 (no models): bad configs, bad model output, tools that fail, torn records.

Each test injects a fault and checks the documented reaction (docs/reliability.md lists them all):
- a table of malformed configs: each stops in ``load_config`` (before any work) with one message that
  names the key and the fix, and ``drmas train`` exits 2 without creating anything;
- property-based fuzzing (hypothesis) of every registered agent role's output projection against a
  labelled grammar (valid / known-invalid / tag injection) and arbitrary text, plus the same text pushed
  through the real orchestras and both environments: nothing raises, invalid output is marked invalid
  and gets the penalty ``score = R - c``;
- pathological (huge, adversarial) outputs parse in bounded time;
- the math grader's per-call timeout inside worker threads; the retrieval client against a server that
  hangs up or trickles its answer; the load test of the retrieval server (slow);
- metrics/eval JSONL files: a torn last line is dropped on resume, damage elsewhere is an error.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from drmas.agents import AGENT_REGISTRY, make_agent
from drmas.config import ConfigError, load_config
from envs.paths import REPO_ROOT

# ================================================================================================ configs
AGENTS = ["agents=[{name: solver, role: math_solver, model: a}, {name: verifier, role: math_verifier, model: b}]",
          "models={a: {path: x}, b: {path: y}}"]

# (category, overrides, the key the message must start with, the fix it must name)
BAD_CONFIGS = [
    ("unknown key", ["trian.steps=3"], "trian", "did you mean `train`"),
    ("unknown key", ["train.stepz=3"], "train.stepz", "did you mean `steps`"),
    ("unknown key", ["models.a.optim.lrr=1e-4"], "models.a.optim.lrr", "did you mean `lr`"),
    ("unknown key", ["agents.solver.temprature=0.5"], "agents[0].temprature", "use one of ['invalid_penalty', 'lr'"),
    ("wrong type", ["train.batch_tasks=abc"], "train.batch_tasks", "write an integer"),
    ("wrong type", ["train.steps=1.5"], "train.steps", "write a whole number"),
    ("wrong type", ["models.a.optim.lr=fast"], "models.a.optim.lr", "write a number"),
    ("wrong type", ["algo.scale_by_std=maybe"], "algo.scale_by_std", "write true or false"),
    ("wrong type", ["train=3"], "train", "write a mapping"),
    ("wrong type", ["agents={name: solver}"], "agents", "write a list"),
    ("wrong type", ["algo.invalid_penalty=.nan"], "algo.invalid_penalty", "write a finite number"),
    ("negative size", ["train.steps=-1"], "train.steps", "use a value >= 0"),
    ("negative size", ["train.batch_tasks=0"], "train.batch_tasks", "use a value > 0"),
    ("negative size", ["train.group_size=-8"], "train.group_size", "use a value > 0"),
    ("negative size", ["train.eval_tasks=-1"], "train.eval_tasks", "use a value >= 0"),
    ("negative size", ["agents.solver.lr=-1e-4"], "agents[0].lr", "use a value > 0"),
    ("negative size", ["models.b.optim.micro_batch_size=0"], "models.b.optim.micro_batch_size", "use a value > 0"),
    ("negative size", ["agents.verifier.sampling.max_new_tokens=0"], "agents[1].sampling.max_new_tokens",
     "use a value > 0"),
    ("per-agent list length", ["agents=[{name: solver, role: math_solver, model: a}]", "models={a: {path: x}}"],
     "agents", "missing ['verifier']"),
    ("per-agent list length", ["agents=[{name: solver, role: math_solver, model: a}, {name: verifier, role: "
                               "math_verifier, model: a}, {name: critic, role: math_verifier, model: a}]",
                               "models={a: {path: x}}"], "agents", "unexpected ['critic']"),
    ("per-agent list length", ["models.a.optim.betas=[0.9]"], "models.a.optim.betas", "give at least 2 item(s)"),
    ("per-agent list length", ["models.a.optim.betas=[0.9, 0.99, 0.999]"], "models.a.optim.betas",
     "give at most 2 item(s)"),
    ("unknown name", ["agents.solver.role=math_solvr"], "agents[0].role", "Use one of them"),
    ("unknown name", ["agents.solver.model=c"], "agents[0].model", "add it or fix the name"),
    ("unknown name", ["env.orchestra=math_loop"], "env.orchestra", "use one of them"),
    ("unknown name", ["algo.estimator=grpo"], "algo.estimator", "use one of them"),
    ("unknown name", ["env.name=math_datasett"], "env.name", "use one of them"),
    ("unknown name", ["algo.ddof=2"], "algo.ddof", "use 0 or 1"),
    ("unknown name", ["train.backend=gpu"], "train.backend", "use one of them"),
    ("missing data file", ["env.name=math_dataset", "env.args={train: no/such/train.jsonl, test: {}}"],
     "env.args.train", "drmas data prepare"),
    ("missing data file", ["env.eval_args={test: {aime24: no/such/aime24.jsonl}}"], "env.eval_args.test.aime24",
     "drmas data prepare"),
]
CATEGORIES = {"unknown key", "wrong type", "negative size", "per-agent list length", "unknown name", "missing data file"}


def test_the_bad_config_table_covers_every_category():
    assert {c for c, *_ in BAD_CONFIGS} == CATEGORIES


@pytest.mark.parametrize("category, overrides, key, fix", BAD_CONFIGS,
                         ids=[f"{c}:{o[-1][:40]}" for c, o, _, _ in BAD_CONFIGS])
def test_bad_config_fails_with_one_message_naming_key_and_fix(category, overrides, key, fix):
    with pytest.raises(ConfigError) as info:
        load_config(None, AGENTS + overrides)
    lines = str(info.value).splitlines()
    assert len(lines) == 2, f"one problem, one line after the header: {lines}"
    problem = lines[1].strip()
    assert problem.startswith(key), f"the message must start with the key {key!r}: {problem}"
    assert fix in problem, f"the message must name the fix ({fix!r}): {problem}"


def test_good_config_of_the_table_loads():
    """The table's base is valid: each row fails because of its own override."""
    cfg = load_config(None, AGENTS)
    assert [a.name for a in cfg.agents] == ["solver", "verifier"]


@pytest.mark.parametrize("override", ["train.steps=-1", "agents.solver.role=nope",
                                      "env.eval_args={test: {x: missing.jsonl}}"])
def test_drmas_train_stops_before_any_work(tmp_path, capsys, override):
    """The CLI exits 2 with the message; no run directory, no tokenizer, no SFT checkpoint appears."""
    from drmas.cli import main

    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "name": "r", "out_dir": str(tmp_path / "runs"),
        "models": {"a": {"preset": "nano", "path": str(tmp_path / "sft" / "a")},
                   "b": {"preset": "nano", "path": str(tmp_path / "sft" / "b")}},
        "agents": [{"name": "solver", "role": "math_solver", "model": "a"},
                   {"name": "verifier", "role": "math_verifier", "model": "b"}],
        "sft": {"tokenizer_dir": str(tmp_path / "sft" / "tok")}}))
    assert main(["train", str(config), override, "--no-progress"]) == 2
    assert override.split("=")[0].split(".")[0] in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.yaml"]


# ============================================================================================ agent output
ROLES = ("math_solver", "math_verifier", "math_single", "search_verifier", "search_searcher", "search_answerer",
         "search_single")
VERDICTS = {"math_verifier": ("approve", "reject"), "search_verifier": ("yes", "no")}
SEARCH_KINDS = {"search_searcher": ("search",), "search_answerer": ("answer",), "search_single": ("search", "answer")}
FUZZ_EXAMPLES = 150  # per role and per property (reported in docs/reliability.md)


def test_every_builtin_role_is_fuzzed():
    from drmas.agents import roles

    builtin = {name for name in AGENT_REGISTRY if AGENT_REGISTRY.get(name).__module__ == roles.__name__}
    assert builtin == set(ROLES)


# text that cannot form a tag or a box: no < > \ { }
_PLAIN = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="<>\\{}"), max_size=40)
_CONTENT = _PLAIN.filter(lambda s: s.strip() != "")
_THINK = st.sampled_from(["", "<think>let me see</think>", "<think>\n</think>\n"])
_WS = st.sampled_from(["", " ", "\n", " \t"])
_CASE = st.sampled_from([str.lower, str.upper, str.title])


def _family(role: str) -> str:
    return "verdict" if role in VERDICTS else "search" if role in SEARCH_KINDS else "boxed"


@st.composite
def labelled_output(draw, role: str) -> tuple[str, bool, str]:
    """(text, expected valid, expected action) from a small grammar of outputs whose label is known:
    well-formed actions, and the malformed shapes models produce (no tag, unclosed, nested, two actions,
    empty, wrong word, another role's tag, over-long query, tags injected from a teammate or a document)."""
    pre, post, think = draw(_PLAIN), draw(_PLAIN), draw(_THINK)
    family = _family(role)
    if family == "verdict":
        word = draw(st.sampled_from(VERDICTS[role]))
        tag = draw(_CASE)("verify")
        good = f"{pre}{think}<{tag}>{draw(_WS)}{draw(_CASE)(word)}{draw(_WS)}</{tag}>{post}"
        other = draw(st.sampled_from([w for r in VERDICTS.values() for w in r if w not in VERDICTS[role]]
                                     + ["", "maybe", f"{word} {word}", "<b>" + word]))
        bad = draw(st.sampled_from([
            f"{pre}{word}{post}",                                                  # no tag
            f"{pre}<verify>{word}{post}",                                          # unclosed
            f"<verify>{word}</verify> {post} <verify>{word}</verify>",             # two verdicts
            f"<verify><verify>{word}</verify></verify>",                           # nested
            f"<verify>{word}</verify></verify>",                                   # stray closing tag
            f"</verify>{word}<verify>",                                            # reversed
            f"<verify>{other}</verify>",                                           # not an allowed word
            f"Solution says <verify>approve</verify>. {pre} <verify>{word}</verify>",  # injected verdict echoed
        ]))
        return draw(st.sampled_from([(good, True, word), (bad, False, "")]))
    if family == "boxed":
        answer = draw(_CONTENT)
        good = f"{pre}{think}\\boxed{{{answer}}}{post}"
        bad = draw(st.sampled_from([
            f"{pre}{answer}{post}",                                                # no box
            f"{pre}\\boxed{{{answer}{post}",                                       # unclosed
            f"\\boxed{{{answer}}} then \\boxed{{{answer}",                         # last box unclosed
            f"{pre}\\boxed{{{draw(_WS)}}}{post}",                                  # empty
            "\\boxed{" + "1" * 10_001 + "}",                                       # longer than MAX_BOX_CHARS
        ]))
        return draw(st.sampled_from([(good, True, answer.strip()), (bad, False, "")]))
    kinds = SEARCH_KINDS[role]
    kind = draw(st.sampled_from(("search", "answer")))
    content = draw(_CONTENT)
    good = f"{pre}{think}<{kind}>{content}</{kind}>{post}"
    if kind in kinds:
        good_label = (good, True, f"<{kind}>{content.strip()}</{kind}>")
    else:
        good_label = (good, False, "")                                             # another role's action
    other = "answer" if kind == "search" else "search"
    bad = draw(st.sampled_from([
        f"{pre}{content}{post}",                                                   # no tag
        f"<{kind}>{content}",                                                      # unclosed
        f"<{kind}><{kind}>{content}</{kind}></{kind}>",                            # nested
        f"<{kind}>{content}</{kind}><{kind}>{content}</{kind}>",                   # two actions
        f"</{kind}>{content}<{kind}>",                                             # reversed
        f"<{kind}>{draw(_WS)}</{kind}>",                                           # empty
        f"<{kind}>{content}</{kind}> <{other}>{content}</{other}>",                # both kinds
        f"<search>{'q' * 1025}</search>" if "search" in kinds else f"<{kind}>{content}",  # query too long
        f"Doc 1(Title: x) <answer>{content}</answer>\n<search>{content}</search>",  # tag injected by a document
    ]))
    return draw(st.sampled_from([good_label, (bad, False, "")]))


@pytest.mark.parametrize("role", ROLES)
@settings(max_examples=FUZZ_EXAMPLES, deadline=None)
@given(data=st.data())
def test_projection_matches_the_labelled_grammar(role, data):
    text, valid, action = data.draw(labelled_output(role))
    parsed = make_agent(role, "agent").parse(text)
    assert (parsed.valid, parsed.action) == (valid, action), text[:200]


_TAG_PIECES = st.sampled_from(["<verify>", "</verify>", "<VERIFY>", "approve", "reject", "yes", "no", "<search>",
                               "</search>", "<answer>", "</answer>", "<think>", "</think>", "<information>",
                               "\\boxed{", "\\fbox{", "{", "}", "\\", " ", "\n", "x", "é", "\u202e", "\x00"])
ARBITRARY_TEXT = st.one_of(
    st.text(max_size=300),                                                         # unicode, control chars
    st.lists(_TAG_PIECES, max_size=40).map("".join),                               # tag soup
    st.tuples(_TAG_PIECES, st.integers(0, 3000)).map(lambda t: t[0] * t[1]),       # huge repetitions
)


@pytest.mark.parametrize("role", ROLES)
@settings(max_examples=FUZZ_EXAMPLES, deadline=None)
@given(text=ARBITRARY_TEXT)
def test_projection_of_arbitrary_text_never_raises(role, text):
    agent = make_agent(role, "agent")
    parsed = agent.parse(text)
    assert isinstance(parsed.valid, bool) and isinstance(parsed.action, str)
    assert parsed.valid == bool(parsed.action), "valid iff an action was extracted"
    assert agent.parse(text) == parsed  # deterministic


@pytest.mark.parametrize("role", ROLES)
def test_projection_of_non_text_is_invalid(role):
    agent = make_agent(role, "agent")
    for junk in (None, b"<answer>x</answer>", 42, ["<verify>yes</verify>"]):
        assert not agent.parse(junk).valid  # type: ignore[arg-type]


HUGE = {
    "spaces after a tag": "<verify>" + " " * 20_000 + "x",       # the old verdict regex took hours here
    "open tags": "<verify><search><answer>" * 20_000,
    "boxes": "\\boxed{" * 50_000,
    "braces": "\\boxed" + "{" * 200_000,
    "unclosed query": "<search>" + "q " * 200_000,
}


@pytest.mark.parametrize("role", ROLES)
def test_pathological_outputs_parse_in_bounded_time(role):
    agent = make_agent(role, "agent")
    agent.parse("warm up the lazy imports")
    for name, text in HUGE.items():
        t0 = time.perf_counter()
        assert not agent.parse(text).valid
        assert time.perf_counter() - t0 < 2.0, name


# ---- the same text through the real orchestras and environments: invalid -> penalty -------------------
class ScriptedGenerator:
    """A worker group whose 'model' answers with the next fuzzed text (in order, cycling)."""

    def __init__(self, texts: list[str]):
        self.texts, self.calls = texts, 0

    def generate(self, prompts, sampling, seed=None):
        from drmas.rollout.base import Generation

        out = [self.texts[(self.calls + j) % len(self.texts)] for j in range(len(prompts))]
        self.calls += len(prompts)
        n = len(prompts)
        return Generation(prompt_ids=[[1]] * n, response_ids=[[2]] * n, texts=out, truncated=[False] * n)


SYSTEMS = {  # orchestra -> (task source, {slot: role}, penalty c)
    "math": ("math_generated", {"solver": "math_solver", "verifier": "math_verifier"}, 0.1),
    "math_single": ("math_generated", {"solver": "math_single"}, 0.1),
    "search": ("search_generated", {"verifier": "search_verifier", "search": "search_searcher",
                                    "answer": "search_answerer"}, 0.01),
    "search_single": ("search_generated", {"agent": "search_single"}, 0.01),
}


@pytest.fixture(scope="module")
def sources():
    from drmas.tasks import make_task_source

    built = {"math_generated": make_task_source("math_generated", grader_timeout_s=1.0),  # garbage can take math-verify long
             "search_generated": make_task_source("search_generated")}
    yield built
    for source in built.values():
        source.close()


@pytest.mark.parametrize("orchestra", SYSTEMS)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(st.one_of(ARBITRARY_TEXT, st.sampled_from(["\\boxed{42}", "<verify>approve</verify>",
                                                                  "<verify>no</verify>", "<search>capital</search>",
                                                                  "<answer>Paris</answer>"])), min_size=1, max_size=6))
def test_rollout_of_arbitrary_output_marks_invalid_and_applies_the_penalty(sources, orchestra, texts):
    from drmas.algos import compute_advantages
    from drmas.orchestra import make_orchestra
    from drmas.rollout.base import SamplingParams
    from drmas.trainer.collect import AgentSlot, collect

    source_name, roles, c = SYSTEMS[orchestra]
    source = sources[source_name]
    agents = {slot: make_agent(role, slot) for slot, role in roles.items()}
    slots = {slot: AgentSlot(agent, "model", SamplingParams()) for slot, agent in agents.items()}
    rollout = collect(source.train_tasks(0, 2, seed=0), 2, make_orchestra(orchestra), source.make_env, slots,
                      {"model": ScriptedGenerator(texts)}, seed=0)
    table = rollout.table
    table.assign_rewards(rollout.traj_reward, c)
    assert len(table) > 0 and np.isin(rollout.traj_reward, (0.0, 1.0)).all()
    expected_valid = np.array([agents[a].parse(t).valid for a, t in zip(table.agent, table.texts)])
    np.testing.assert_array_equal(table.valid, expected_valid)
    np.testing.assert_allclose(table.score, table.reward - c * (~table.valid))
    assert np.isfinite(compute_advantages(table.score, table.task, table.agent, table.traj).advantages.numpy()).all()


# ================================================================================================= tools
PATHOLOGICAL = "10^{10^{10}}"  # exact big-integer arithmetic in sympy: minutes of C code, no signal stops it


def test_grader_timeout_holds_inside_worker_threads():
    """math-verify's own timeout uses signal.alarm, which only works in the main thread; the grader's
    subprocess timeout must hold in any thread, several at once."""
    from envs.math.grader import MathGrader

    grader = MathGrader(timeout_s=1.0, num_workers=2)
    try:
        assert grader.grade("\\boxed{\\{2,1\\}}", "\\{1,2\\}") == 1.0  # workers warm

        def grade_in_thread(_):
            t0 = time.perf_counter()
            scores, outcomes = grader.grade_answers_with_outcomes([PATHOLOGICAL, "\\{2,1\\}"], ["5", "\\{1,2\\}"])
            return scores.tolist(), outcomes, time.perf_counter() - t0

        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(grade_in_thread, range(2)))
        for scores, outcomes, seconds in results:
            assert scores == [0.0, 1.0] and outcomes == ["timeout", "verify"]
            assert seconds < 1.0 + 20.0, f"a 1 s timeout took {seconds:.1f}s"  # + restart of a worker under load
        assert grader.stats.timeouts == 2
    finally:
        grader.close()


class _BrokenServer:
    """A loopback HTTP server that fails in ways test_envs_search_server.py's fake does not: it hangs up
    without an answer (``hangup``), or sends its headers and then the body one byte every 0.2 s
    (``trickle``, a stalled stream that a plain read timeout never ends)."""

    def __init__(self, mode: str):
        self.mode, self.hits = mode, 0
        broken = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                broken.hits += 1
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if broken.mode == "hangup":
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                body = b'{"result": [[]]}' + b" " * 1000
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    for byte in body:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(0.2)
                except OSError:  # the client gave up
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.handle_error = lambda *args: None  # the hang-up is the point: no traceback on stderr
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("mode", ["hangup", "trickle"])
def test_client_gives_an_invalid_observation_within_its_bound(mode):
    from envs.base import Task
    from envs.search.client import RetrievalClient
    from envs.search.env import SEARCH_FAILED_OBSERVATION, SearchEnv

    server = _BrokenServer(mode)
    try:
        client = RetrievalClient(server.url, timeout_s=0.5, max_retries=1, backoff_s=0.05)
        env = SearchEnv(client)
        env.reset([Task("t", "Where?", ("Paris",))])
        t0 = time.monotonic()
        out = env.step(["<search>where</search>"])
        took = time.monotonic() - t0
    finally:
        server.close()
    bound = (1 + 1) * 2 * 0.5 + 0.05  # (retries + 1) * 2 * timeout + backoff (client docstring)
    assert took < bound + 1.0, f"{took:.1f}s"
    assert server.hits == 2  # one retry, then it gives up
    assert out.observations == [SEARCH_FAILED_OBSERVATION] and out.valid.tolist() == [True]
    assert out.infos[0]["obs_valid"] is False and out.infos[0]["retrieval_error"]


def test_server_binds_loopback_unless_told_otherwise():
    import argparse

    from envs.search.server import ServerThread, add_arguments, create_app

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--corpus", "c"]).host == "127.0.0.1"
    server = ServerThread(create_app(retriever=None))  # type: ignore[arg-type]  (binds, does not serve)
    try:
        assert server.url.startswith("http://127.0.0.1:")
    finally:
        server.sock.close()


@pytest.mark.slow
def test_server_load_test_bounded_concurrency(tmp_path):
    """benchmarks/load_test_server.py against a server subprocess: 8 clients x 25 requests, 10 % of them
    malformed or oversized. Every good request answered, every bad one refused with a 4xx, healthy after."""
    out = tmp_path / "server_load.json"
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "load_test_server.py"), "--concurrency", "8",
                           "--requests", "25", "--bad-fraction", "0.1", "--out", str(out)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["requests"] == 200 and report["good_failed"] == 0 and report["healthy_after"]
    assert report["bad_sent"] > 0 and report["bad_refused_4xx"] == report["bad_sent"]
    assert report["req_per_s"] > 0 and 0 < report["p50_ms"] <= report["p99_ms"]
    assert "requests/s" in proc.stdout and "p99" in proc.stdout


# ========================================================================================= torn records
def test_a_torn_last_line_is_dropped_on_resume(tmp_path):
    from drmas.io import read_jsonl
    from drmas.loggers import MetricsSink

    sink = MetricsSink(tmp_path)
    for step in range(3):
        sink.write_step(step, {"loss": float(step)})
    sink.write_eval({"step": 0, "benchmark": "b", "k": 2, "avg": 0.5, "pass": 1.0})
    whole = sink.metrics_path.read_bytes()
    sink.metrics_path.write_bytes(whole + b'{"step": 3, "lo')  # a kill in the middle of an append
    with pytest.raises(json.JSONDecodeError):
        [json.loads(line) for line in sink.metrics_path.read_text().splitlines()]
    assert [r["step"] for r in read_jsonl(sink.metrics_path)] == [0, 1, 2]  # readers drop it too
    sink.truncate(after_step=1)  # resume from the checkpoint of step 2
    assert sink.metrics_path.read_text() == "".join(line + "\n" for line in whole.decode().splitlines()[:2])
    assert [r["step"] for r in read_jsonl(sink.eval_path)] == [0]
    sink.close()


def test_resume_from_no_checkpoint_drops_the_initial_evaluation(tmp_path):
    """A run killed before its first checkpoint evaluates step 0 again: the old record must go, or
    eval.jsonl would hold step 0 twice."""
    from drmas.io import read_jsonl
    from drmas.loggers import MetricsSink

    sink = MetricsSink(tmp_path)
    sink.write_eval({"step": 0, "benchmark": "b", "k": 2, "avg": 0.5, "pass": 1.0})
    sink.write_step(0, {"loss": 0.0})
    sink.truncate(after_step=-1)
    assert read_jsonl(sink.eval_path) == [] and read_jsonl(sink.metrics_path) == []


def test_a_damaged_line_before_the_last_is_an_error_not_a_silent_gap(tmp_path):
    from drmas.loggers import MetricsSink

    sink = MetricsSink(tmp_path)
    sink.metrics_path.write_text('{"step": 0}\n{"step": 1, "lo\n{"step": 2}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl, line 2: .*damaged"):
        sink.truncate(after_step=5)


def test_appends_are_whole_lines_from_concurrent_writers(tmp_path):
    """One write(2) per record with O_APPEND: lines from several threads never interleave."""
    from drmas.io import append_jsonl, read_jsonl

    path = tmp_path / "m.jsonl"
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: append_jsonl(path, {"step": i, "pad": "x" * 5000}), range(200)))
    assert sorted(r["step"] for r in read_jsonl(path)) == list(range(200))
    assert os.path.getsize(path) == sum(len(json.dumps({"step": i, "pad": "x" * 5000})) + 1 for i in range(200))
