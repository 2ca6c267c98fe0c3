"""`flashd http --model ...` as a user runs it (a subprocess that starts its own daemon), on the
real SmolLM2-135M-Instruct, driven by the openai and anthropic clients."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import anthropic
import httpx
import openai
import pytest

from tests.http.gateway_harness import free_port

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm_gateway(real_model):
    path = real_model("smollm2-135m")
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "flashd.clients.cli", "http", "--model", str(path), "--device", "cpu",
         "--max-ctx", "512", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert process.poll() is None, f"flashd http exited: {process.stderr.read()}"
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "flashd http did not come up"
            time.sleep(0.2)
        yield url, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def test_chat_with_a_real_model(smollm_gateway):
    url, _ = smollm_gateway
    oai = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
    assert [m.id for m in oai.models.list().data] == ["smollm2-135m"]
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    reply = oai.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=12, temperature=0)
    text = reply.choices[0].message.content
    assert "Paris" in text, text  # what the model answers (greedy) on the reference backend
    streamed = oai.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=12, temperature=0,
                                           stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == text
    claude = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=120)
    message = claude.messages.create(model="smollm2-135m", max_tokens=12, messages=messages,
                                     extra_body={"temperature": 0})
    assert message.content[0].text == text
    # SmolLM2's chat template does not show tools: asking for tools is refused, not ignored
    with pytest.raises(openai.BadRequestError, match="tools"):
        oai.chat.completions.create(model="m", messages=messages, max_tokens=4, tools=[
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])


def test_ctrl_c_stops_the_gateway_and_its_daemon(smollm_gateway):
    url, process = smollm_gateway
    process.send_signal(signal.SIGINT)
    assert process.wait(30) == 0
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/health", timeout=2)
