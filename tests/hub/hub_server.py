"""A stand-in for the Hugging Face Hub over plain HTTP, for the downloader's tests.

It answers the hub's URL layout for models held in memory:
  GET  /api/models/{org}/{name}/revision/{rev}[?blobs=true]  -> {"id", "sha", "siblings": [...]}
  GET|HEAD /{org}/{name}/resolve/{rev}/{path}
        regular files: 200 with ETag "<git blob sha1>" and X-Repo-Commit;
        LFS files (*.safetensors, *.gguf): 302 to /cdn/{sha256} with X-Linked-Etag "<sha256>",
        X-Linked-Size and X-Repo-Commit (as the hub redirects to its CDN)
  GET  /cdn/{sha256}  the bytes, with Range support (206 + Content-Range)
Gated repositories answer 401 (X-Error-Code: GatedRepo) without "Authorization: Bearer TOKEN"
and 403 with a wrong token; unknown repositories and revisions 404 with the hub's error codes.

Faults for the tests: `cut[path] = (n, times)` sends the full Content-Length, n bytes, then
closes the connection (times: how many transfers to cut; -1 always); `corrupt.add(path)` serves
bytes that do not match the advertised sha256; `stall[path] = n` sends n bytes and then nothing.
Every request is logged in `requests` as (method, path, headers dict).
"""

import hashlib
import json
import os
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")


def git_blob_sha1(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    def __init__(self, gated=False):
        self.commits = {}  # sha -> {path: bytes}
        self.refs = {}     # branch -> sha
        self.gated = gated

    def add_commit(self, files, branch="main"):
        """files: {path: bytes}; returns the new commit's sha (made from the content)."""
        h = hashlib.sha1()
        for p in sorted(files):
            h.update(p.encode() + b"\0" + hashlib.sha256(files[p]).digest())
        h.update(str(len(self.commits)).encode())
        sha = h.hexdigest()
        self.commits[sha] = dict(files)
        if branch:
            self.refs[branch] = sha
        return sha


def files_from_dir(path, names=None):
    out = {}
    for n in sorted(os.listdir(path)):
        if names is not None and n not in names:
            continue
        with open(os.path.join(path, n), "rb") as f:
            out[n] = f.read()
    return out


class HubServer:
    def __init__(self, token="hf_test_token"):
        self.repos = {}
        self.token = token
        self.requests = []
        self.cut = {}
        self.corrupt = set()
        self.stall = {}
        self.no_blob_ids = False  # an API answer without blobId / lfs: the client HEADs for ETags
        self.lock = threading.Lock()
        self.blobs = {}  # sha256 -> (bytes, repo path key)
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                hub._handle(self, head=False)

            def do_HEAD(self):
                hub._handle(self, head=True)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def add_repo(self, repo_id, gated=False):
        self.repos[repo_id] = Repo(gated)
        return self.repos[repo_id]

    def count(self):
        with self.lock:
            return len(self.requests)

    # ---- request handling ------------------------------------------------------------------
    def _reply(self, h, status, body=b"", headers=None, head=False):
        h.send_response(status)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if not head:
            h.wfile.write(body)

    def _error(self, h, status, code, message, head):
        body = json.dumps({"error": message}).encode()
        self._reply(h, status, body, {"Content-Type": "application/json", "X-Error-Code": code,
                                      "X-Error-Message": message}, head)

    def _authorized(self, h, repo, head):
        if not repo.gated:
            return True
        auth = h.headers.get("Authorization", "")
        if not auth:
            self._error(h, 401, "GatedRepo", "Access to this model is restricted", head)
            return False
        if auth != f"Bearer {self.token}":
            self._error(h, 403, "GatedRepo", "Your token has no access to this model", head)
            return False
        return True

    def _find(self, h, org, name, rev, head):
        repo = self.repos.get(f"{org}/{name}")
        if repo is None:
            self._error(h, 404, "RepoNotFound", "Repository not found", head)
            return None, None
        if not self._authorized(h, repo, head):
            return None, None
        sha = repo.refs.get(rev, rev if rev in repo.commits else None)
        if sha is None:
            self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
            return None, None
        return repo, sha

    def _handle(self, h, head):
        parsed = urllib.parse.urlsplit(h.path)
        path = urllib.parse.unquote(parsed.path)
        with self.lock:
            self.requests.append((h.command, path, dict(h.headers.items())))
        parts = parsed.path.split("/")
        try:
            if parsed.path.startswith("/api/models/") and len(parts) >= 7 and parts[5] == "revision":
                org, name = parts[3], parts[4]
                rev = urllib.parse.unquote("/".join(parts[6:]))
                return self._api(h, org, name, rev, head)
            if len(parts) >= 6 and parts[3] == "resolve":
                org, name, rev = parts[1], parts[2], urllib.parse.unquote(parts[4])
                file = urllib.parse.unquote("/".join(parts[5:]))
                return self._resolve(h, org, name, rev, file, head)
            if len(parts) == 3 and parts[1] == "cdn":
                return self._cdn(h, parts[2], head)
            self._error(h, 404, "NotFound", "no such route", head)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _api(self, h, org, name, rev, head):
        repo, sha = self._find(h, org, name, rev, head)
        if repo is None:
            return
        siblings = []
        for p, data in sorted(repo.commits[sha].items()):
            s = {"rfilename": p, "size": len(data)}
            if p.endswith(LFS_SUFFIXES):
                pointer = (f"version https://git-lfs.github.com/spec/v1\noid sha256:"
                           f"{hashlib.sha256(data).hexdigest()}\nsize {len(data)}\n").encode()
                s["blobId"] = git_blob_sha1(pointer)
                s["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                            "pointerSize": len(pointer)}
            else:
                s["blobId"] = git_blob_sha1(data)
            if self.no_blob_ids:
                s = {"rfilename": p}
            siblings.append(s)
        body = json.dumps({"_id": "x", "id": f"{org}/{name}", "sha": sha, "private": False,
                           "gated": "manual" if repo.gated else False,
                           "siblings": siblings}).encode()
        self._reply(h, 200, body, {"Content-Type": "application/json"}, head)

    def _resolve(self, h, org, name, rev, file, head):
        repo, sha = self._find(h, org, name, rev, head)
        if repo is None:
            return
        data = repo.commits[sha].get(file)
        if data is None:
            self._error(h, 404, "EntryNotFound", f"{file} does not exist", head)
            return
        common = {"X-Repo-Commit": sha}
        if file.endswith(LFS_SUFFIXES):
            digest = hashlib.sha256(data).hexdigest()
            with self.lock:
                self.blobs[digest] = (data, file)
            common.update({"Location": f"/cdn/{digest}", "X-Linked-Etag": f'"{digest}"',
                           "X-Linked-Size": str(len(data)), "ETag": '"lfs-pointer"'})
            self._reply(h, 302, b"", common, head)
            return
        common["ETag"] = f'"{git_blob_sha1(data)}"'
        self._send_bytes(h, file, data, common, head)

    def _cdn(self, h, digest, head):
        with self.lock:
            entry = self.blobs.get(digest)
        if entry is None:
            self._error(h, 404, "NotFound", "no such blob", head)
            return
        data, file = entry
        self._send_bytes(h, file, data, {"ETag": f'"{digest}"'}, head)

    def _send_bytes(self, h, file, data, headers, head):
        if file in self.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start = 0
        status = 200
        rng = h.headers.get("Range")
        headers = dict(headers)
        headers["Accept-Ranges"] = "bytes"
        if rng and rng.startswith("bytes="):
            first = rng[6:].split("-")[0]
            start = int(first) if first else 0
            if start >= len(data):
                headers["Content-Range"] = f"bytes */{len(data)}"
                self._reply(h, 416, b"", headers, head)
                return
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        body = data[start:]
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if head:
            return
        with self.lock:
            cut = self.cut.get(file)
            if cut is not None and cut[1] != 0:
                self.cut[file] = (cut[0], cut[1] - 1 if cut[1] > 0 else -1)
            else:
                cut = None
            stall = self.stall.get(file)
        if cut is not None:
            n = max(0, cut[0] - start)
            h.wfile.write(body[:n])
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(2)
            return
        if stall is not None:
            h.wfile.write(body[:stall])
            h.wfile.flush()
            time.sleep(30)
            h.close_connection = True
            return
        h.wfile.write(body)
