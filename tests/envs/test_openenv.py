"""The OpenEnv adapter against a real OpenEnv server (tests/envs/openenv_server.py), started on 127.0.0.1."""

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("openenv")
pytestmark = pytest.mark.slow  # each test starts an OpenEnv server process

from forge_exp.envs import EpisodeLimits, Sampling, TinyToolFormat, build_chat_format, episode_metrics, run_episodes  # noqa: E402
from forge_exp.envs.openenv import OpenEnvToolEnv, call_tool  # noqa: E402
from forge_exp.models.tokenizer import TOOL_ALPHABET, build_char_tokenizer  # noqa: E402
from forge_exp.rl.types import Problem  # noqa: E402
from tests.envs.helpers import Scripted, template_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = [Problem("12*34=", "408", "12*34"), Problem("99*99=", "9801", "99*99")]


@pytest.fixture(scope="module")
def server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "tests.envs.openenv_server:app", "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "warning"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError("the OpenEnv test server did not start")
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def make_env(url, **kw):
    return lambda: OpenEnvToolEnv(
        url, reset_kwargs=lambda p: {"question": p.question, "target": p.target},
        answer_action=lambda text: call_tool("submit", answer=text), hide_tools=("submit",), **kw)


def test_tiny_model_episodes_through_an_openenv_server(server):
    tok = build_char_tokenizer(TOOL_ALPHABET)

    def agent(context):
        if context.endswith(")"):
            return re.findall(r"\((\d+)\)", context)[-1]
        return "[" + context.removeprefix("<bos>").rstrip("=") + "]"

    groups = asyncio.run(run_episodes(make_env(server), PROBLEMS, 2, Scripted(tok, agent), tok, TinyToolFormat(),
                                      Sampling(max_new_tokens=16), EpisodeLimits(3, 64, 5.0)))
    assert [g.correct for g in groups] == [[True, True], [True, True]]
    assert [g.rewards for g in groups] == [[1.0, 1.0], [1.0, 1.0]]
    c = groups[1].completions[0]
    assert tok.decode(c.token_ids) == "[99*99]<eos>(9801)9801<eos>"  # the server's calculator answered
    assert c.loss_mask == [True] * 8 + [False] * 6 + [True] * 5


def test_wrong_answer_tool_error_and_hanging_tool(server):
    tok, fmt = template_tokenizer("qwen3"), build_chat_format("qwen3")
    seen_tools = []

    def reply(context):
        if "<tool_response>" not in context:
            seen_tools.append(json.dumps([n for n in ("calculator", "submit", "slow", "crash") if f'"name": "{n}"' in context]))
            q = re.search(r"user\n(\d+)\*(\d+)=", context)
            if q.group(1) == "99":
                return '<tool_call>{"name": "slow", "arguments": {"seconds": 5}}</tool_call>'
            return '<tool_call>{"name": "crash", "arguments": {}}</tool_call>'
        return "7"  # after the crash's error: a wrong final answer

    t0 = time.perf_counter()
    groups = asyncio.run(run_episodes(make_env(server), PROBLEMS, 1, Scripted(tok, reply), tok, fmt,
                                      Sampling(max_new_tokens=96), EpisodeLimits(3, 4096, tool_timeout_s=1.0),
                                      failure_reward=-1.0))
    assert time.perf_counter() - t0 < 15
    crashed, hung = groups[0].completions[0], groups[1].completions[0]
    assert crashed.stop_reason == "eos" and groups[0].rewards == [0.0] and crashed.info["tool_errors"] == 1
    assert any("tool exploded" in m["content"] for m in crashed.messages if m["role"] == "tool")
    assert hung.stop_reason == "failed" and groups[1].rewards == [-1.0] and hung.info["failed_turns"] == 1
    assert json.loads(seen_tools[0]) == ["calculator", "slow", "crash"]  # submit is hidden from the model
    assert episode_metrics(groups)["env/failed_turns"] == 1
