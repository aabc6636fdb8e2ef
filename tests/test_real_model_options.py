"""A real model on the command line, in the failure lab and in ``load_model``: the scripted model stays the
default; ``--model`` / ``--base-url`` reach an OpenAI-compatible server through ``langchain_openai``; what
cannot work (a missing key, a server that does not answer, a fault that goes through the script) is one
line on stderr, exit code 2, with no key in it. The server is the recorded one of
``openai_compatible_server.py`` on 127.0.0.1: no network, no key."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from openai_compatible_server import RecordedServer

from agentlab.cli.main import main
from agentlab.lab.runner import Lab
from agentlab.runtime.models import (
    LOCAL_PLACEHOLDER_KEY,
    ModelUnavailable,
    load_model,
    probe_model,
    prompt_for_model,
    safe_url,
    scrub,
)
from conftest import scalar

REFUND_MODEL = "Qwen/Qwen2.5-7B-Instruct-refund"
SECRET = "sk-proj-Sup3rSecretKeyValue0123456789"


def cli(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentlab", *argv], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, **(env or {})})


# ----------------------------------------------------------------- load_model

def test_a_local_server_gets_a_placeholder_key_never_the_openai_one(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    model = load_model("openai:qwen2.5:7b", base_url="http://localhost:11434/v1/")
    assert type(model).__name__ == "ChatOpenAI"
    assert model.model_name == "qwen2.5:7b"  # only the first colon splits
    assert model.openai_api_base == "http://localhost:11434/v1"
    assert model.openai_api_key.get_secret_value() == LOCAL_PLACEHOLDER_KEY
    assert SECRET not in repr(model)
    hosted = load_model("openai:gpt-4o-mini")
    assert hosted.openai_api_key.get_secret_value() == SECRET and SECRET not in repr(hosted)


@pytest.mark.parametrize(("name", "kwargs", "says"), [
    ("gpt-4o-mini", {}, "must look like 'provider:model'"),
    ("nosuch:model", {}, "unknown model provider 'nosuch'"),
    ("openai:qwen", {"base_url": "localhost:11434"}, "must look like http://HOST:PORT/v1"),
    ("openai:qwen", {"base_url": "http://u:Sup3rSecret@host:port/v1"}, "must look like http://HOST:PORT/v1"),
    ("openai:qwen", {"base_url": "http://localhost:8000/v1", "api_key_env": "AGENTLAB_TEST_UNSET"},
     "environment variable AGENTLAB_TEST_UNSET, which is not set"),
    ("openai:gpt-4o-mini", {}, "OPENAI_API_KEY, which is not set; for a local server give a base URL instead"),
    ("anthropic:claude", {"base_url": "http://localhost:8000/v1"}, "a base URL is for an OpenAI-compatible server"),
])
def test_a_model_that_cannot_be_built_is_one_clear_error(monkeypatch, name, kwargs, says):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("AGENTLAB_TEST_UNSET", raising=False)
    with pytest.raises(ModelUnavailable) as info:
        load_model(name, **kwargs)
    assert says in str(info.value) and "Sup3rSecret" not in str(info.value)


def test_a_missing_provider_package_names_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "langchain_mistralai", None)  # as if not installed
    with pytest.raises(ModelUnavailable, match="pip install langchain-mistralai"):
        load_model("mistralai:mistral-small")


def test_texts_shown_hold_no_part_of_a_key(monkeypatch):
    monkeypatch.setenv("MY_KEY", SECRET)
    model = load_model("openai:m", base_url="http://127.0.0.1:9/v1", api_key_env="MY_KEY")
    echo = f"Incorrect API key provided: {SECRET[:8]}************{SECRET[-4:]}. Also {SECRET}."
    shown = scrub(echo, model)
    assert "Sup3r" not in shown and SECRET[:8] not in shown and "6789" not in shown
    assert safe_url("http://user:pw@host:8000/v1?key=abc") == "http://host:8000/v1"


async def test_probe_names_a_server_that_does_not_answer_and_passes_a_live_one():
    with RecordedServer("vllm_refund_story") as server:
        await probe_model(load_model(f"openai:{REFUND_MODEL}", base_url=server.base_url))
        gone = server.base_url
    with pytest.raises(ModelUnavailable, match=r"cannot reach the model server at http://127\.0\.0\.1:\d+/v1 \("):
        await probe_model(load_model("openai:m", base_url=gone), timeout_s=2)


def test_a_real_model_reads_the_ids_the_episode_created():
    from agentlab.domains.billing.scenarios import get_scenario

    sc = get_scenario("refund")
    assert prompt_for_model(sc, [17]) == sc.prompt + "\n\nThe customer ids: Acme Analytics = 17."


# ----------------------------------------------------------------- the command line

def test_demo_through_an_openai_compatible_server(capsys):
    with RecordedServer("vllm_refund_story") as server:
        code = main(["demo", "--model", f"openai:{REFUND_MODEL}", "--base-url", server.base_url, "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert code == 0 and rep["error"] is None
    assert (rep["credit_memos"], rep["refunds"], rep["provider_refunds"]) == (1, 1, 1)
    assert [b["final"] for b in rep["balance_cents"].values()] == [2500]
    assert rep["tool_calls"] == 3 and rep["tool_messages"] == 3 and rep["unanswered_tool_calls"] == 0
    assert server.rejected == [] and len(server.requests) == 2


@pytest.mark.parametrize(("argv", "env", "says"), [
    (["demo", "--model", "openai:m", "--base-url", "http://127.0.0.1:9/v1"], {},
     "agentlab: cannot reach the model server at http://127.0.0.1:9/v1"),
    (["demo", "--model", "openai:gpt-4o-mini"], {"OPENAI_API_KEY": ""}, "OPENAI_API_KEY, which is not set"),
    (["demo", "--base-url", "http://127.0.0.1:9/v1"], {}, "--base-url and --api-key-env go with --model"),
    (["demo", "--scenario", "saga", "--model", "openai:m"], {}, "the saga demo plays scripted steps"),
    (["chaos", "--faults", "wrong_type", "--model", "openai:m", "--base-url", "http://u:Sup3rSecret@127.0.0.1:9/v1"],
     {}, "agentlab chaos: cannot reach the model server at http://127.0.0.1:9/v1"),
])
def test_what_cannot_work_is_one_line_exit_2_and_no_secret(argv, env, says):
    out = cli(*argv, env=env)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [out.stderr.strip()] and says in out.stderr
    assert "Traceback" not in out.stderr and "Sup3r" not in out.stderr + out.stdout


@pytest.mark.slow
def test_chaos_refuses_a_fault_that_goes_through_the_script_with_a_real_model():
    with RecordedServer("vllm_refund_story") as server:
        out = cli("chaos", "--faults", "none", "wrong_type", "--model", f"openai:{REFUND_MODEL}",
                  "--base-url", server.base_url, "--episodes", "1")
    assert out.returncode == 2 and "wrong_type cannot be injected" in out.stderr


# ----------------------------------------------------------------- the failure lab

@pytest.mark.parametrize("fault", ["none", "crash_mid_node", "crash_before_checkpoint", "backend_killed",
                                   "worker_crash"])
async def test_lab_faults_through_the_real_client_keep_every_invariant_under_full(harness, fault):
    with RecordedServer("vllm_refund_story") as server:
        model = load_model(f"openai:{REFUND_MODEL}", base_url=server.base_url)
        async with Lab(harness) as lab:
            run = await lab.run(fault, "full", scenario="refund", seed=2, model=lambda script, seed: model)
    assert run.episode.error is None
    assert run.violations == []
    assert server.rejected == []
    state = await harness.end_state(run.episode, [5000])
    assert state["customers"][0]["final_credit_cents"] == 2500 and state["customers"][0]["provider_refunds"] == 1
    if fault != "none" and fault != "backend_killed":
        assert run.crashed or run.worker_crashed


# ----------------------------------------------------------------- the yardstick

BASELINE_MODEL = "Qwen/Qwen2.5-7B-Instruct-baseline-refund"


async def test_the_prebuilt_toolnode_through_the_real_client_under_a_killed_backend(harness):
    from agentlab.lab.yardstick import Yardstick

    with RecordedServer("vllm_baseline_refund") as server:
        model = load_model(f"openai:{BASELINE_MODEL}", base_url=server.base_url)
        run = await Yardstick(harness, model=lambda script, seed: model).run("toolnode", "backend_killed",
                                                                           scenario="refund")
    assert type(model).__name__ == "ChatOpenAI"
    assert server.rejected == [] and len(server.requests) == 1  # the run raised before a second turn
    sent = server.requests[0]
    (cid,) = run.customer_ids
    assert f"Acme Analytics = {cid}." in sent["messages"][0]["content"]  # the real model is told the ids
    assert {t["function"]["name"] for t in sent["tools"]} >= {"apply_credit", "refund_to_card", "create_credit_memo"}
    assert run.notes["terminated"] and run.raised == "AdminShutdown (57P01)"
    credit = await scalar(harness, "SELECT credit_cents FROM customers WHERE id = %s", (cid,))
    memos = await scalar(harness, "SELECT count(*) FROM credit_memos WHERE customer_id = %s", (cid,))
    refunds = await scalar(harness, "SELECT count(*) FROM refunds WHERE customer_id = %s", (cid,))
    paid = await scalar(harness, "SELECT count(*) FROM provider.payments WHERE customer = %s AND kind = 'refund'",
                         (f"cus_{cid}",))
    # the UPDATE died with its backend; its siblings committed: the refund is paid, nothing deducted
    assert (credit, memos, refunds, paid) == (5000, 1, 1, 1)
    kinds = run.counts()
    assert kinds["balance_mismatch"] == 1 and kinds["unanswered_call"] == 3
    assert sum(kinds.values()) == len(run.violations) > 0


@pytest.mark.slow
def test_chaos_agent_through_an_openai_compatible_server_prints_the_same_violations():
    with RecordedServer("vllm_baseline_refund") as server:
        out = cli("chaos", "--agent", "toolnode", "--faults", "backend_killed", "stray_quote", "lost_update",
                  "--model", f"openai:{BASELINE_MODEL}", "--base-url", server.base_url, "--seed", "0",
                  "--episodes", "1", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    (row,) = [r for r in data["rows"] if r["fault"] == "backend_killed"]
    assert row["scenario"] == "refund"  # seed 0 plays the refund, the story the recording answers
    assert row["raised"] == "AdminShutdown (57P01)"
    assert row["balance_mismatch"] == 1 and row["unanswered_call"] == 3
    assert data["summary"]["toolnode"]["stray_quote"] == "n/a"  # a scripted hallucination
    assert "scripted" in data["not_applicable"]["toolnode"]["lost_update"]
    assert server.rejected == [] and len(server.requests) == 1
