"""Models by hub id (-m org/name[@REV][:FILE.gguf]) against a local stand-in for the hub.

tests/hub/hub_server.py serves the tiny fixture checkpoints in the hub's URL layout; each test
gets an empty Hugging Face cache (HF_HUB_CACHE) and no token (HF_HOME points at an empty
folder). Environment: STRATA_BINARY (the strata executable), STRATA_FIXTURE_DIR.
"""

import hashlib
import os
import shutil
import socket
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hub_server import HubServer, files_from_dir, git_blob_sha1  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STRATA = os.environ.get("STRATA_BINARY") or os.path.join(ROOT, "build", "strata")
FIXTURES = os.environ.get("STRATA_FIXTURE_DIR") or os.path.join(ROOT, "tests", "fixtures")
LLAMA = os.path.join(FIXTURES, "models", "llama")
SHARDED = os.path.join(FIXTURES, "models", "llama_sharded")
GGUF = os.path.join(FIXTURES, "moe", "mixtral_bf16", "model.gguf")
CHECKPOINT_FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                    "generation_config.json"]
PROMPT = "The quick brown fox"

pytestmark = pytest.mark.skipif(not os.path.exists(STRATA), reason=f"no strata binary at {STRATA}")


@pytest.fixture
def hub():
    h = HubServer()
    yield h
    h.close()


@pytest.fixture
def cache(tmp_path):
    return tmp_path / "hub"


def strata(hub, cache, *args, env=None, cwd=None, timeout=120):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    e.update(HF_HUB_CACHE=str(cache), HF_HOME=str(cache.parent / "hf_home"),
             HF_ENDPOINT=hub.url if hub else "http://127.0.0.1:9", HF_HUB_DOWNLOAD_TIMEOUT="5",
             OMP_NUM_THREADS="1")
    e.update(env or {})
    return subprocess.run([STRATA, *args], env=e, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def info(hub, cache, model, *extra, **kw):
    return strata(hub, cache, "info", "-m", model, *extra, **kw)


def generate(hub, cache, model, *extra, **kw):
    return strata(hub, cache, "run", "-m", model, "-p", PROMPT, "-n", "12", "--temp", "0", "-s",
                  "1", "-q", *extra, **kw)


def error_line(p):
    """The process failed with exactly one 'strata: error:' line (progress lines aside)."""
    assert p.returncode != 0, p.stdout + p.stderr
    errors = [l for l in p.stderr.splitlines() if "error" in l]
    assert len(errors) == 1 and errors[0].startswith("strata: error: "), p.stderr
    return errors[0]


def repo_dir(cache, repo):
    return cache / ("models--" + repo.replace("/", "--"))


def add_llama(hub, repo="org/tiny", names=CHECKPOINT_FILES, **kw):
    r = hub.add_repo(repo, **kw)
    sha = r.add_commit(files_from_dir(LLAMA, names))
    return r, sha


def test_download_layout_then_cache_hit_with_zero_requests(hub, cache):
    _, sha = add_llama(hub, names=["config.json", "model.safetensors", "tokenizer.json",
                                   "tokenizer_config.json"])
    p = info(hub, cache, "org/tiny")
    assert p.returncode == 0, p.stderr
    assert "LlamaForCausalLM" in p.stdout
    assert "model.safetensors" in p.stderr  # the progress line names the file
    root = repo_dir(cache, "org/tiny")
    # huggingface_hub's layout: the ref, relative symlinks into blobs named by their ETag.
    assert (root / "refs" / "main").read_text() == sha
    for name in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]:
        link = root / "snapshots" / sha / name
        data = open(os.path.join(LLAMA, name), "rb").read()
        etag = hashlib.sha256(data).hexdigest() if name.endswith(".safetensors") else git_blob_sha1(data)
        assert link.is_symlink() and os.readlink(link) == f"../../blobs/{etag}"
        assert (root / "blobs" / etag).read_bytes() == data
    # The revision has no generation_config.json: marked as huggingface_hub marks it.
    assert (root / ".no_exist" / sha / "generation_config.json").exists()
    assert not list((root / "blobs").glob("*.incomplete"))
    n = hub.count()
    for cmd in (info, generate):
        p = cmd(hub, cache, "org/tiny")
        assert p.returncode == 0, p.stderr
    assert hub.count() == n, hub.requests[n:]


def test_generates_the_same_tokens_as_the_local_path(hub, cache):
    add_llama(hub)
    local = generate(None, cache, LLAMA)
    by_id = generate(hub, cache, "org/tiny")
    assert local.returncode == 0 and by_id.returncode == 0, local.stderr + by_id.stderr
    assert local.stdout and by_id.stdout == local.stdout


def test_sharded_checkpoint_downloads_index_and_shards(hub, cache):
    r = hub.add_repo("org/sharded")
    sha = r.add_commit(files_from_dir(SHARDED, [
        "config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors", "tokenizer.json", "tokenizer_config.json"]))
    p = generate(hub, cache, "org/sharded")
    assert p.returncode == 0, p.stderr
    assert p.stdout == generate(None, cache, SHARDED).stdout
    snap = repo_dir(cache, "org/sharded") / "snapshots" / sha
    assert (snap / "model-00002-of-00002.safetensors").exists()


def test_etags_from_head_requests_and_empty_files(hub, cache):
    r = hub.add_repo("org/noblobs")
    files = files_from_dir(LLAMA, CHECKPOINT_FILES)
    files["generation_config.json"] = b""  # an empty file is a file too
    sha = r.add_commit(files)
    hub.no_blob_ids = True
    p = info(hub, cache, "org/noblobs")
    assert p.returncode == 0, p.stderr
    assert any(m == "HEAD" for m, _, _ in hub.requests)
    snap = repo_dir(cache, "org/noblobs") / "snapshots" / sha
    digest = hashlib.sha256(files["model.safetensors"]).hexdigest()
    assert os.readlink(snap / "model.safetensors") == f"../../blobs/{digest}"
    assert (snap / "generation_config.json").read_bytes() == b""


def test_interrupted_transfer_is_resumed_with_a_range_request(hub, cache):
    add_llama(hub)
    size = os.path.getsize(os.path.join(LLAMA, "model.safetensors"))
    cut = size // 3
    hub.cut["model.safetensors"] = (cut, 1)  # the first transfer stops after `cut` bytes
    p = info(hub, cache, "org/tiny")
    assert p.returncode == 0, p.stderr
    ranges = [h.get("Range") for m, _, h in hub.requests if h.get("Range")]
    assert f"bytes={cut}-" in ranges, hub.requests


def test_interrupted_download_resumes_in_the_next_run(hub, cache):
    _, sha = add_llama(hub)
    size = os.path.getsize(os.path.join(LLAMA, "model.safetensors"))
    cut = size // 2
    hub.cut["model.safetensors"] = (cut, -1)  # every transfer breaks: the run gives up
    p = info(hub, cache, "org/tiny")
    line = error_line(p)
    assert "model.safetensors" in line and "resume" in line
    partial = list((repo_dir(cache, "org/tiny") / "blobs").glob("*.incomplete"))
    assert len(partial) == 1 and partial[0].stat().st_size == cut
    hub.cut.clear()
    n = hub.count()
    p = info(hub, cache, "org/tiny")
    assert p.returncode == 0, p.stderr
    assert any(h.get("Range") == f"bytes={cut}-" for _, _, h in hub.requests[n:]), hub.requests[n:]
    model = repo_dir(cache, "org/tiny") / "snapshots" / sha / "model.safetensors"
    assert model.read_bytes() == open(os.path.join(LLAMA, "model.safetensors"), "rb").read()


def test_checksum_mismatch_deletes_the_download(hub, cache):
    _, sha = add_llama(hub)
    hub.corrupt.add("model.safetensors")
    p = info(hub, cache, "org/tiny")
    line = error_line(p)
    assert "model.safetensors" in line and "sha256 mismatch" in line
    root = repo_dir(cache, "org/tiny")
    assert not (root / "snapshots" / sha / "model.safetensors").exists()
    assert not list((root / "blobs").glob("*.incomplete"))
    # A regular (non-LFS) file is checked against its git blob id.
    shutil.rmtree(cache)
    hub.corrupt = {"config.json"}
    line = error_line(info(hub, cache, "org/tiny"))
    assert "config.json" in line and "mismatch" in line


def test_offline_without_and_with_a_cached_copy(hub, cache):
    _, sha = add_llama(hub)
    for extra, env in ((["--offline"], None), ([], {"HF_HUB_OFFLINE": "1"})):
        line = error_line(info(hub, cache, "org/tiny", *extra, env=env))
        assert "offline" in line and "org/tiny" in line
    assert hub.count() == 0
    assert info(hub, cache, "org/tiny").returncode == 0
    n = hub.count()
    p = generate(hub, cache, "org/tiny", env={"HF_HUB_OFFLINE": "1"})
    assert p.returncode == 0, p.stderr
    assert info(hub, cache, "org/tiny", "--offline").returncode == 0
    # A file missing from the cached snapshot: named in the error, still no request.
    (repo_dir(cache, "org/tiny") / "snapshots" / sha / "model.safetensors").unlink()
    line = error_line(info(hub, cache, "org/tiny", "--offline"))
    assert "model.safetensors" in line and "offline" in line
    assert hub.count() == n


def test_revision_by_sha_and_by_branch(hub, cache):
    r = hub.add_repo("org/revs")
    old = r.add_commit(files_from_dir(LLAMA, CHECKPOINT_FILES), branch="main")
    gpt2 = os.path.join(FIXTURES, "models", "gpt2")
    new = r.add_commit(files_from_dir(gpt2, CHECKPOINT_FILES), branch="main")
    assert old != new
    p = info(hub, cache, f"org/revs@{old}")
    assert p.returncode == 0 and "LlamaForCausalLM" in p.stdout, p.stderr
    assert f"snapshots/{old}" in p.stdout
    p = info(hub, cache, "org/revs@main")
    assert p.returncode == 0 and "GPT2LMHeadModel" in p.stdout, p.stderr
    assert (repo_dir(cache, "org/revs") / "refs" / "main").read_text() == new
    n = hub.count()
    assert info(hub, cache, "org/revs").returncode == 0  # main again: from the cache
    assert info(hub, cache, f"org/revs@{old}", "--offline").returncode == 0
    assert hub.count() == n
    line = error_line(info(hub, cache, "org/revs@nope"))
    assert "404" in line and "nope" in line


def test_gated_repo_needs_hf_token(hub, cache):
    add_llama(hub, repo="org/gated", gated=True)
    line = error_line(info(hub, cache, "org/gated"))
    assert "401" in line and "HF_TOKEN" in line
    line = error_line(info(hub, cache, "org/gated", env={"HF_TOKEN": "wrong"}))
    assert "403" in line and "HF_TOKEN" in line
    p = info(hub, cache, "org/gated", env={"HF_TOKEN": hub.token})
    assert p.returncode == 0, p.stderr
    assert any(h.get("Authorization") == f"Bearer {hub.token}" for _, _, h in hub.requests)
    # The CDN (another path here; another host on the real hub) never needs it: the downloads
    # worked. The token file under HF_HOME works as huggingface_hub's does.
    shutil.rmtree(cache)
    (cache.parent / "hf_home").mkdir(exist_ok=True)
    (cache.parent / "hf_home" / "token").write_text(hub.token + "\n")
    assert info(hub, cache, "org/gated").returncode == 0


def test_cache_laid_out_by_hand_as_huggingface_hub_does(tmp_path, cache):
    sha = "0123456789abcdef0123456789abcdef01234567"
    root = repo_dir(cache, "someone/handmade")
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(sha)  # no newline, as huggingface_hub writes it
    (root / "blobs").mkdir()
    snap = root / "snapshots" / sha
    snap.mkdir(parents=True)
    for name in CHECKPOINT_FILES:
        data = open(os.path.join(LLAMA, name), "rb").read()
        etag = hashlib.sha256(data).hexdigest() if name.endswith(".safetensors") else git_blob_sha1(data)
        (root / "blobs" / etag).write_bytes(data)
        os.symlink(f"../../blobs/{etag}", snap / name)
    # The endpoint is a closed port: the cache alone must do.
    p = generate(None, cache, "someone/handmade")
    assert p.returncode == 0, p.stderr
    assert p.stdout == generate(None, cache, LLAMA).stdout
    assert generate(None, cache, f"someone/handmade@{sha}").returncode == 0


def test_gguf_repos_and_the_file_rule(hub, cache):
    data = open(GGUF, "rb").read()
    r = hub.add_repo("org/only-gguf")
    sha = r.add_commit({"model-Q8_0.gguf": data, "README.md": b"# a model\n"})
    p = info(hub, cache, "org/only-gguf")
    assert p.returncode == 0, p.stderr
    assert f"snapshots/{sha}/model-Q8_0.gguf" in p.stdout
    r = hub.add_repo("org/many-gguf")
    r.add_commit({"m-Q4_K_M.gguf": data, "m-Q8_0.gguf": data, "m-F16.gguf": data})
    p = info(hub, cache, "org/many-gguf")
    assert p.returncode == 0 and "m-Q4_K_M.gguf" in p.stdout, p.stderr
    p = info(hub, cache, "org/many-gguf:m-F16.gguf")
    assert p.returncode == 0 and "m-F16.gguf" in p.stdout, p.stderr
    r = hub.add_repo("org/ambiguous")
    r.add_commit({"a-Q8_0.gguf": data, "b-Q8_0.gguf": data})
    line = error_line(info(hub, cache, "org/ambiguous"))
    assert "a-Q8_0.gguf" in line and ":FILE.gguf" in line
    line = error_line(info(hub, cache, "org/many-gguf:missing.gguf"))
    assert "missing.gguf" in line


def test_local_path_and_alias_win_over_hub_ids(hub, cache, tmp_path):
    add_llama(hub, repo="org/tiny")
    local = tmp_path / "org" / "tiny"
    shutil.copytree(os.path.join(FIXTURES, "models", "gpt2"), local)
    p = info(hub, cache, "org/tiny", cwd=tmp_path)
    assert p.returncode == 0 and "GPT2LMHeadModel" in p.stdout, p.stderr
    assert hub.count() == 0
    # An alias is never looked up on the hub (its error says how to fetch it).
    p = info(hub, cache, "smollm2", env={"STRATA_CACHE_DIR": str(tmp_path / "empty")})
    assert "fetch_model" in p.stderr and hub.count() == 0


def test_unknown_repo_and_unreachable_hub_fail_in_one_line(hub, cache):
    line = error_line(info(hub, cache, "org/missing"))
    assert "404" in line and "org/missing" in line
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    line = error_line(info(hub, cache, "org/tiny", env={"HF_ENDPOINT": f"http://127.0.0.1:{port}"}))
    assert "org/tiny" in line and f"127.0.0.1:{port}" in line


def test_stalled_transfer_times_out(hub, cache):
    add_llama(hub)
    hub.stall["model.safetensors"] = 1000
    p = info(hub, cache, "org/tiny", env={"HF_HUB_DOWNLOAD_TIMEOUT": "1"}, timeout=60)
    line = error_line(p)
    assert "model.safetensors" in line


def test_serve_downloads_and_names_the_model_by_its_hub_id(hub, cache):
    import json
    import signal
    import time
    import urllib.request

    add_llama(hub)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    e = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    e.update(HF_HUB_CACHE=str(cache), HF_HOME=str(cache.parent / "hf_home"), HF_ENDPOINT=hub.url)
    proc = subprocess.Popen([STRATA, "serve", "-m", "org/tiny", "--port", str(port)], env=e,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            assert proc.poll() is None, proc.stderr.read().decode()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
            assert json.loads(r.read())["data"][0]["id"] == "org/tiny"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    assert (repo_dir(cache, "org/tiny") / "refs" / "main").exists()


def test_every_model_subcommand_takes_a_hub_id(hub, cache):
    add_llama(hub)
    assert info(hub, cache, "org/tiny").returncode == 0
    n = hub.count()
    for args, stdin in ((["bench", "-p", "8", "-n", "4", "-r", "1", "--offline"], None),
                        (["chat", "-n", "4", "--offline"], "hello\n"),
                        (["run", "-p", "hi", "-n", "4", "--offline"], None),
                        (["bench-throughput", "--num-prompts", "2", "--input-len", "8",
                          "--output-len", "4"], None)):
        e = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
        e.update(HF_HUB_CACHE=str(cache), HF_HOME=str(cache.parent / "hf_home"),
                 HF_ENDPOINT=hub.url, OMP_NUM_THREADS="1")
        p = subprocess.run([STRATA, args[0], "-m", "org/tiny", *args[1:]], env=e, input=stdin,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, (args, p.stderr)
    assert hub.count() == n


def test_two_processes_downloading_one_model_share_the_cache(hub, cache):
    _, sha = add_llama(hub)
    e = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    e.update(HF_HUB_CACHE=str(cache), HF_HOME=str(cache.parent / "hf_home"), HF_ENDPOINT=hub.url)
    procs = [subprocess.Popen([STRATA, "info", "-m", "org/tiny"], env=e, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    root = repo_dir(cache, "org/tiny")
    assert not list((root / "blobs").glob("*.incomplete"))
    model = root / "snapshots" / sha / "model.safetensors"
    assert model.read_bytes() == open(os.path.join(LLAMA, "model.safetensors"), "rb").read()
