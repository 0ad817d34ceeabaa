"""The official `openai` client against the real HTTP/OpenAI layer over FakeServingEngine
(strata_fake_serve, built with the tests). Checks client compatibility of every response shape
without a model: the fake's k-th token is 'a' + (sum(prompt ids) + k) % 26, ids = bytes + 3,
BOS = 1 for completions.

Environment: STRATA_FAKE_SERVE (the strata_fake_serve executable).
"""
import concurrent.futures
import json
import os
import socket
import subprocess
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FAKE = os.environ.get("STRATA_FAKE_SERVE") or os.path.join(ROOT, "build", "tests", "strata_fake_serve")

openai = pytest.importorskip("openai")


def expected(prompt, n):
    ids = [1] + [b + 3 for b in prompt.encode()]
    s = sum(ids)
    return "".join(chr(ord("a") + (s + k) % 26) for k in range(n))


@pytest.fixture(scope="module")
def fake():
    if not os.path.exists(FAKE):
        pytest.skip(f"no strata_fake_serve at {FAKE}")
    proc = subprocess.Popen([FAKE, "0", ""], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("listening "), line
    port = int(line.split()[1])
    yield port
    proc.terminate()
    assert proc.wait(timeout=30) == 0


@pytest.fixture(scope="module")
def client(fake):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{fake}/v1", api_key="x", max_retries=0, timeout=30)


def test_models(client):
    assert client.models.list().data[0].id == "fake-model"


def test_completion(client):
    c = client.completions.create(model="fake-model", prompt="hello", max_tokens=5, temperature=0)
    assert c.choices[0].text == expected("hello", 5)
    assert c.choices[0].finish_reason == "length"
    assert (c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.total_tokens) == (6, 5, 11)


def test_completion_stream_with_usage(client):
    chunks = list(client.completions.create(model="fake-model", prompt="hello", max_tokens=5, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == expected("hello", 5)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"


def test_chat_and_chat_stream(client):
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    c = client.chat.completions.create(model="fake-model", messages=msgs, max_tokens=4)
    assert c.choices[0].message.role == "assistant" and len(c.choices[0].message.content) == 4
    chunks = list(client.chat.completions.create(model="fake-model", messages=msgs, max_tokens=4, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == c.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 4


def test_logprobs(client):
    c = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}],
                                       max_tokens=2, logprobs=True, top_logprobs=2)
    assert len(c.choices[0].logprobs.content) == 2
    assert len(c.choices[0].logprobs.content[0].top_logprobs) == 2


def test_errors_map_to_client_exceptions(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="fake-model", prompt="x", max_tokens=-1)
    assert e.value.status_code == 400
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="fake-model", prompt="x", temperature=5)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="fake-model", messages=[{"role": "wizard", "content": "x"}])
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-9", prompt="x")
    with pytest.raises(openai.InternalServerError):
        client.completions.create(model="fake-model", prompt="ENGINE_ERROR")
    assert client.completions.create(model="fake-model", prompt="x", max_tokens=1).usage.completion_tokens == 1


def test_64_concurrent_streams(client):
    prompts = [f"client {i}" for i in range(64)]

    def streamed(p):
        return "".join(ch.choices[0].text for ch in client.completions.create(
            model="fake-model", prompt=p, max_tokens=16, stream=True) if ch.choices)

    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        got = list(pool.map(streamed, prompts))
    assert got == [expected(p, 16) for p in prompts]


def test_killed_client_is_cancelled(fake, client):
    body = json.dumps({"prompt": "x", "max_tokens": 200, "stream": True}).encode()
    s = socket.create_connection(("127.0.0.1", fake))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: ") < 3:
        piece = s.recv(4096)
        assert piece, got
        got += piece
    s.close()
    deadline = time.time() + 10
    running = None
    while time.time() < deadline:
        text = _metrics(fake)
        running = [l for l in text.splitlines() if l.startswith("strata:num_requests_running{")][0]
        if running.endswith(" 0"):
            break
        time.sleep(0.05)
    assert running.endswith(" 0"), running


def _metrics(port):
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def test_bench_serve_against_fake(fake, tmp_path):
    strata = os.environ.get("STRATA_BINARY") or os.path.join(ROOT, "build", "strata")
    if not os.path.exists(strata):
        pytest.skip(f"no strata binary at {strata}")
    out = tmp_path / "bench.json"
    r = subprocess.run([strata, "bench-serve", "--port", str(fake), "--num-prompts", "20", "--request-rate", "50",
                        "--max-concurrency", "8", "--input-len", "16", "--output-len", "8", "--json", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "============ Serving Benchmark Result ============" in r.stdout
    assert "P99 ITL (ms):" in r.stdout
    d = json.loads(out.read_text())
    assert d["completed"] == 20 and d["failed"] == 0 and d["total_output_tokens"] == 160
