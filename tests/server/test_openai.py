"""`strata serve` with the official `openai` client, on 127.0.0.1 and a random free port.

The server runs the real serving engine on the tiny fixture model. While the binary reports the
serving engine unavailable (before it is merged), every test that needs it is skipped;
test_cli_lists_serve_flags always runs, so pytest never exits with 5 (no tests collected).

Environment: STRATA_BINARY (the strata executable), STRATA_FIXTURE_DIR (tests/fixtures).
"""
import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
STRATA = os.environ.get("STRATA_BINARY") or os.path.join(ROOT, "build", "strata")
FIXTURES = os.environ.get("STRATA_FIXTURE_DIR") or os.path.join(ROOT, "tests", "fixtures")
MODEL = os.path.join(FIXTURES, "models", "llama")
UNAVAILABLE_MARKERS = ("serving engine unavailable", "unimplemented", "not implemented")

try:
    import openai
except ImportError:  # scripts/test.sh installs it; without it the client tests skip
    openai = None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None, headers=None, timeout=30):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class Server:
    def __init__(self, *extra):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="strata_serve_", suffix=".log", delete=False)
        args = [STRATA, "serve", "-m", MODEL, "--host", "127.0.0.1", "--port", str(self.port),
                "--max-num-seqs", "64", *extra]
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)

    def output(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def wait_ready(self, timeout=180):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                out = self.output()
                if any(m in out.lower() for m in UNAVAILABLE_MARKERS):
                    pytest.skip("serving engine unavailable in this build: " + out.strip().splitlines()[-1])
                pytest.fail(f"strata serve exited with {self.proc.returncode}:\n{out}")
            try:
                status, _ = http("GET", self.url + "/health", timeout=2)
                if status == 200:
                    return self
                assert status == 503, f"/health answered {status} while loading"
            except (urllib.error.URLError, ConnectionError, socket.timeout):
                pass
            time.sleep(0.1)
        self.stop()
        pytest.fail("strata serve did not become ready:\n" + self.output())

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        os.unlink(self.log.name)
        return self.proc.returncode


@pytest.fixture(scope="module")
def server():
    if not os.path.exists(STRATA):
        pytest.skip(f"no strata binary at {STRATA}")
    s = Server().wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    if openai is None:
        pytest.skip("the openai package is not installed")
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def model_name(client):
    return client.models.list().data[0].id


def metric(server, name):
    status, text = http("GET", server.url + "/metrics")
    assert status == 200
    for line in text.splitlines():
        if line.startswith(f"strata:{name}{{") or line.startswith(f"strata:{name} "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"metric strata:{name} missing")


def test_cli_lists_serve_flags():
    """Runs without the engine: the serve and bench-serve subcommands exist with their flags."""
    if not os.path.exists(STRATA):
        pytest.skip(f"no strata binary at {STRATA}")
    out = subprocess.run([STRATA, "serve", "--help"], capture_output=True, text=True).stdout
    for flag in ("--host", "--port", "--api-key", "--max-num-seqs", "--max-model-len",
                 "--max-num-batched-tokens", "--served-model-name", "--threads"):
        assert flag in out, flag
    out = subprocess.run([STRATA, "bench-serve", "--help"], capture_output=True, text=True).stdout
    for flag in ("--num-prompts", "--request-rate", "--max-concurrency", "--dataset", "--input-len",
                 "--output-len", "--range-ratio", "--seed", "--json"):
        assert flag in out, flag


def test_completion_and_chat(client):
    name = model_name(client)
    c = client.completions.create(model=name, prompt="Hello", max_tokens=8, temperature=0)
    assert c.object == "text_completion"
    assert 1 <= c.usage.completion_tokens <= 8
    assert c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens
    assert c.choices[0].finish_reason in ("stop", "length")
    chat = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=8, temperature=0)
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage.prompt_tokens > 0


def test_streaming_matches_non_streaming(client):
    name = model_name(client)
    whole = client.completions.create(model=name, prompt="Once upon a time", max_tokens=16, temperature=0)
    chunks = list(client.completions.create(model=name, prompt="Once upon a time", max_tokens=16,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == whole.choices[0].text
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    chat_chunks = list(client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}],
                                                      max_tokens=8, temperature=0, stream=True))
    assert chat_chunks[0].choices[0].delta.role == "assistant"
    assert chat_chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_greedy_equals_strata_run(client):
    prompt = "The capital of France is"
    run = subprocess.run([STRATA, "run", "-m", MODEL, "-p", prompt, "--temp", "0", "-n", "16", "-q"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    expected = run.stdout[:-1] if run.stdout.endswith("\n") else run.stdout
    got = client.completions.create(model=model_name(client), prompt=prompt, max_tokens=16, temperature=0)
    assert got.choices[0].text == expected


def test_64_concurrent_streams_match_single_requests(client):
    name = model_name(client)
    prompts = [f"Request number {i} says" for i in range(64)]
    single = [client.completions.create(model=name, prompt=p, max_tokens=12, temperature=0).choices[0].text
              for p in prompts]

    def streamed(p):
        return "".join(ch.choices[0].text for ch in client.completions.create(
            model=name, prompt=p, max_tokens=12, temperature=0, stream=True) if ch.choices)

    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        got = list(pool.map(streamed, prompts))
    for i, (a, b) in enumerate(zip(got, single)):
        assert a == b, f"request {i}"


def test_bad_requests_get_4xx_and_server_keeps_serving(server, client):
    name = model_name(client)
    bad = [
        dict(model=name, prompt="x", max_tokens=-1),
        dict(model=name, prompt="x", temperature=-1),
        dict(model=name, prompt="x", top_p=2),
        dict(model=name, prompt="x" * 100000, max_tokens=4),
    ]
    for kw in bad:
        with pytest.raises(openai.BadRequestError):
            client.completions.create(**kw)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x")
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=name, messages=[{"role": "wizard", "content": "x"}])
    status, body = http("POST", server.url + "/v1/completions", {"prompt": "x", "max_tokens": "many"})
    assert status == 400 and "error" in json.loads(body)
    ok = client.completions.create(model=name, prompt="still there?", max_tokens=2)
    assert ok.usage.completion_tokens >= 1


def test_killed_client_frees_everything(server, client):
    max_len = client.models.list().data[0].model_extra.get("max_model_len", 64)
    body = json.dumps({"model": model_name(client), "prompt": "Count forever:", "max_tokens": max_len - 16,
                       "ignore_eos": True, "stream": True}).encode()
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: ") < 3:
        piece = s.recv(4096)
        assert piece, got
        got += piece
    s.close()  # the client dies mid-stream
    deadline = time.time() + 30
    while time.time() < deadline:
        if metric(server, "num_requests_running") == 0 and metric(server, "kv_cache_blocks_used") == 0:
            break
        time.sleep(0.1)
    assert metric(server, "num_requests_running") == 0
    assert metric(server, "kv_cache_blocks_used") == 0
    assert metric(server, "kv_cache_usage_perc") == 0


# The bounded soak (issue 16): SOAK_REQUESTS requests from SOAK_CONCURRENCY clients, one in five
# malformed. Measured on this 2-core machine with the tiny fixture model while other builds ran
# (load average 6-8): 5,000 requests took 10.3 s and 25.4 s, and the whole test (server start,
# 400 warm-up requests, checks) 35-43 s, so 5,000 fits well under 2 minutes. SOAK_MAX_SECONDS
# only guards against hangs and gross slowdowns on a shared machine.
# Under the sanitizers (STRATA_SANITIZED=1: several times slower, RSS not asserted) the same mix
# runs 1,000 requests.
SOAK_REQUESTS = 1000 if os.environ.get("STRATA_SANITIZED") else 5000
SOAK_CONCURRENCY = 8
SOAK_MALFORMED_EVERY = 5  # 20%
SOAK_MAX_SECONDS = 240
# RSS after the soak may exceed RSS after the warm-up by at most this (KiB): 16 MiB or 10%,
# whichever is larger (the allocator's arenas and the metrics' histograms settle during the
# warm-up; a leak of even 3 KiB per request would pass 14 MiB here).
def soak_rss_margin_kib(rss_warm):
    return max(16 * 1024, rss_warm // 10)


def malformed_request(i, name):
    """(path, raw body bytes) of the i-th kind of malformed request; each must get a 4xx."""
    long_prompt = "hello " * 2000  # far beyond the fixture's 256-token context
    kinds = [
        ("/v1/completions", b'{"model": "' + name.encode() + b'", "prompt": "x", "max_tok'),  # cut JSON
        ("/v1/completions", b"not json at all"),
        ("/v1/completions", b"[1, 2, 3]"),  # JSON, not an object
        ("/v1/completions", b""),
        ("/v1/completions", {"model": name, "prompt": "x", "max_tokens": "many"}),
        ("/v1/completions", {"model": name, "prompt": 42, "max_tokens": 4}),
        ("/v1/completions", {"model": name, "prompt": "x", "max_tokens": -1}),
        ("/v1/completions", {"model": name, "prompt": "x", "temperature": -1}),
        ("/v1/completions", {"model": name, "prompt": "x", "top_p": 2}),
        ("/v1/completions", {"model": "no-such-model", "prompt": "x", "max_tokens": 4}),
        ("/v1/completions", {"model": name, "prompt": long_prompt, "max_tokens": 4}),
        ("/v1/completions", {"model": name, "prompt": "x", "max_tokens": 1e300}),
        ("/v1/completions", {"model": name, "prompt": "x", "seed": 2**64}),
        ("/v1/completions", b'{"prompt": ' + b"[" * 600 + b"]" * 600 + b"}"),
        ("/v1/chat/completions", {"model": name, "messages": [{"role": "wizard", "content": "x"}]}),
        ("/v1/chat/completions", {"model": name, "messages": "hello"}),
        ("/v1/chat/completions", {"model": name, "messages": [], "max_tokens": 4}),
        ("/v1/chat/completions", {"model": name, "messages": [{"role": "user", "content": long_prompt}]}),
    ]
    path, body = kinds[i % len(kinds)]
    return path, body if isinstance(body, bytes) else json.dumps(body).encode()


def well_formed_request(i, name):
    if i % 3 == 0:
        return "/v1/chat/completions", {"model": name, "max_tokens": 4, "temperature": 0,
                                        "messages": [{"role": "user", "content": f"soak {i}"}],
                                        "stream": i % 2 == 0}
    return "/v1/completions", {"model": name, "prompt": f"soak {i}", "max_tokens": 4,
                               "temperature": 0.7, "seed": i, "stream": i % 4 == 1}


def test_soak_5000_requests_20pct_malformed_rss_flat(server, client):
    import http.client

    name = model_name(client)
    local = threading.local()
    conns = []

    def post(path, body):
        for attempt in range(2):
            conn = getattr(local, "conn", None)
            if conn is None:
                conn = local.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
                conns.append(conn)
            try:
                conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                data = r.read()
                if r.getheader("Connection", "").lower() == "close":
                    conn.close()
                    local.conn = None
                return r.status, data
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # The server closed an idle keep-alive connection: reconnect once.
                conn.close()
                local.conn = None
                if attempt == 1:
                    raise

    def one(i):
        if i % SOAK_MALFORMED_EVERY == SOAK_MALFORMED_EVERY - 1:
            path, body = malformed_request(i // SOAK_MALFORMED_EVERY, name)
            status, data = post(path, body)
            return ("malformed", i, path, body[:80], status, data[:200])
        path, req = well_formed_request(i, name)
        status, data = post(path, json.dumps(req).encode())
        ok = status == 200
        if ok and req.get("stream"):
            ok = data.rstrip().endswith(b"data: [DONE]")
        elif ok:
            ok = json.loads(data)["usage"]["completion_tokens"] >= 1
        return ("good", i, path, req, status if ok else -status, data[:200])

    with concurrent.futures.ThreadPoolExecutor(SOAK_CONCURRENCY) as pool:
        warm = list(pool.map(one, range(400)))
        rss_warm = server.rss_kib()
        t0 = time.time()
        results = list(pool.map(one, range(400, 400 + SOAK_REQUESTS)))
        elapsed = time.time() - t0
    for conn in conns:
        conn.close()
    results += warm
    failed = [r for r in results if r[0] == "good" and r[4] != 200]
    assert not failed, f"{len(failed)} well-formed requests failed, e.g. {failed[:3]}"
    not_4xx = [r for r in results if r[0] == "malformed" and not 400 <= r[4] < 500]
    assert not not_4xx, f"{len(not_4xx)} malformed requests did not get a 4xx, e.g. {not_4xx[:3]}"
    assert sum(r[0] == "malformed" for r in results) == (400 + SOAK_REQUESTS) // SOAK_MALFORMED_EVERY
    print(f"soak: {SOAK_REQUESTS} requests in {elapsed:.1f} s, RSS {rss_warm} KiB after the warm-up")
    assert elapsed < SOAK_MAX_SECONDS, f"{SOAK_REQUESTS} requests took {elapsed:.0f} s"
    deadline = time.time() + 10
    while time.time() < deadline:
        if metric(server, "num_requests_running") == 0 and metric(server, "kv_cache_blocks_used") == 0:
            break
        time.sleep(0.1)
    assert metric(server, "num_requests_running") == 0
    assert metric(server, "kv_cache_blocks_used") == 0
    rss_end = server.rss_kib()
    if os.environ.get("STRATA_SANITIZED"):
        # AddressSanitizer keeps freed memory in its quarantine (256 MB by default), so RSS
        # measures the sanitizer, not the server; the release build asserts the bound.
        return
    margin = soak_rss_margin_kib(rss_warm)
    assert rss_end - rss_warm < margin, f"RSS grew {rss_warm} -> {rss_end} KiB (margin {margin} KiB)"


def test_api_key():
    if openai is None or not os.path.exists(STRATA):
        pytest.skip("needs the openai package and the strata binary")
    s = Server("--api-key", "sekret").wait_ready()
    try:
        bad = openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        good = openai.OpenAI(base_url=s.url + "/v1", api_key="sekret", max_retries=0)
        assert good.models.list().data
    finally:
        s.stop()


def test_sigterm_finishes_in_flight_stream_and_exits_0():
    if openai is None or not os.path.exists(STRATA):
        pytest.skip("needs the openai package and the strata binary")
    s = Server().wait_ready()
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
    name = model_name(c)
    result = {}

    def run():
        chunks = list(c.completions.create(model=name, prompt="Tell a story", max_tokens=64, stream=True,
                                           extra_body={"ignore_eos": True}))
        result["finish"] = [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1]

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.2)
    s.proc.send_signal(signal.SIGTERM)
    t.join(timeout=120)
    assert s.proc.wait(timeout=60) == 0
    assert result.get("finish") == "length"
    s.stop()
