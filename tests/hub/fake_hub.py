"""A Hugging Face Hub on loopback, for the tests of anatomy's Hub client.

It serves, for repositories held in memory, what the client (and
huggingface_hub) ask of the Hub:
  GET  /api/models/{repo}/revision/{rev}    {"id", "sha", "siblings": [{"rfilename"}]}
  GET  /api/models/{repo}/refs              {"branches": [...], "tags": [...]}
  HEAD/GET /{repo}/resolve/{rev}/{file}     a file kept in git: 200, ETag = git's blob id;
                                            an LFS file (*.safetensors, *.bin, *.model):
                                            302 to the "CDN" with X-Linked-Etag = SHA-256,
                                            X-Linked-Size; X-Repo-Commit on both
  GET  /bridge/{sha256}                     the CDN: another host name (localhost, where the
                                            endpoint is 127.0.0.1), which redirects once more to
  GET  /lfs/{sha256}                        the bytes; Range requests answered 206
Errors as the Hub words them: 404 with X-Error-Code RepositoryNotFound,
RevisionNotFound or EntryNotFound; 401 for a gated repository without a
valid token, 403 for a token without access.

With ?blobs=true the listing gives each file's size and digest (blobId, and
lfs.sha256 for an LFS file), as the Hub does; `listing_blobs = False` leaves
them out (an older server or a mirror).

Faults a test arms (each for the next request that matches): `cut` (an LFS
body ends after N bytes), `slow` (seconds between 16 KiB pieces),
`corrupt` (an LFS body with one byte changed), and hostile answers:
`overlong` (an LFS body with N bytes more than announced), `trickle` (an LFS
body of one byte every N seconds, without end), `hang` (an LFS answer's
headers, then nothing for N seconds), `endless_json` (a listing that never
ends), `protocol_relative` (an LFS file's Location as //host/path). Per file
overrides: `etags[name]` (the ETag or X-Linked-Etag sent), `bodies[name]` (the
bytes a git file is served as), `sizes[name]` (the X-Linked-Size sent). Every
request is logged (method, path, Range, whether it carried a token).
"""
import hashlib
import http.server
import json
import threading
import time
import urllib.parse

LFS_SUFFIXES = (".safetensors", ".bin", ".model", ".msgpack", ".h5")
TOKEN = "hf_fake_valid_token"
NO_ACCESS_TOKEN = "hf_fake_no_access"


def git_blob_id(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    def __init__(self, gated=False):
        self.commits = {}   # sha -> {filename: bytes}
        self.branches = {}  # name -> sha
        self.tags = {}
        self.gated = gated

    def commit(self, files, branches=(), tags=()):
        digest = hashlib.sha1()
        for name in sorted(files):
            digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
        digest.update(str(len(self.commits)).encode())
        sha = digest.hexdigest()
        self.commits[sha] = dict(files)
        for b in branches:
            self.branches[b] = sha
        for t in tags:
            self.tags[t] = sha
        return sha

    def resolve(self, rev):
        if rev in self.commits:
            return rev
        return self.branches.get(rev) or self.tags.get(rev)


class FakeHub:
    def __init__(self):
        self.repos = {}
        self.blobs = {}   # sha256 -> bytes (the CDN)
        self.log = []
        self.faults = []  # [kind, value, predicate-on-path]
        self.listing_blobs = True
        self.etags, self.bodies, self.sizes = {}, {}, {}
        self.lock = threading.Lock()
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub.handle(self, head=True)

            def do_GET(self):
                hub.handle(self, head=False)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.cdn = f"http://localhost:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def repo(self, repo_id, gated=False):
        return self.repos.setdefault(repo_id, Repo(gated))

    def arm(self, kind, value, path_part=""):
        with self.lock:
            self.faults.append([kind, value, path_part])

    def take_fault(self, kind, path):
        with self.lock:
            for f in self.faults:
                if f[0] == kind and f[2] in path:
                    self.faults.remove(f)
                    return f[1]
        return None

    def requests(self, method=None, part=""):
        with self.lock:
            return [r for r in self.log if (method is None or r["method"] == method) and part in r["path"]]

    # ---- answers -------------------------------------------------------------

    def send(self, h, status, body=b"", headers=None, head=False):
        h.send_response(status)
        headers = dict(headers or {})
        headers.setdefault("Content-Length", str(len(body)))
        for k, v in headers.items():
            h.send_header(k, v)
        h.end_headers()
        if not head and body:
            h.wfile.write(body)

    def error(self, h, status, code, message, head):
        body = json.dumps({"error": message}).encode()
        if getattr(self, "omit_error_codes", False):  # a 404 that does not say what is missing (a proxy, an older server)
            code = None
        self.send(h, status, body, {"Content-Type": "application/json", "X-Error-Code": code} if code else
                  {"Content-Type": "application/json"}, head)

    def authorized(self, h, repo, head):
        auth = h.headers.get("Authorization", "")
        if not repo.gated:
            return True
        if auth == f"Bearer {TOKEN}":
            return True
        if auth == f"Bearer {NO_ACCESS_TOKEN}":
            self.error(h, 403, "GatedRepo", "Access to this gated repository is restricted.", head)
        else:
            self.error(h, 401, "GatedRepo", "Invalid credentials in Authorization header", head)
        return False

    def handle(self, h, head):
        parsed = urllib.parse.urlparse(h.path)
        path = parsed.path
        h.query = urllib.parse.parse_qs(parsed.query)
        with self.lock:
            self.log.append({"method": h.command, "path": path, "host": h.headers.get("Host", ""),
                             "range": h.headers.get("Range"), "token": h.headers.get("Authorization") is not None})
        if path.startswith("/api/models/"):
            return self.api(h, path[len("/api/models/"):], head)
        if path.startswith("/bridge/"):  # a storage bridge: one more redirect, to the bytes
            return self.send(h, 302, b"", {"Location": f"{self.cdn}/lfs/{path[len('/bridge/'):]}"}, head)
        if path.startswith("/lfs/"):
            return self.lfs(h, path[len("/lfs/"):], head)
        if "/resolve/" in path:
            return self.resolve(h, path, head)
        self.error(h, 404, None, "Not Found", head)

    def lookup(self, h, repo_id, rev, head):
        """(repo, commit) for a request, or None after answering it with the
        Hub's refusal: 401 for an unknown repository (as the Hub answers an
        anonymous request), the gate's 401/403, 404 for an unknown revision.
        rev None: the repository alone (commit None)."""
        repo = self.repos.get(repo_id)
        if repo is None:
            self.error(h, 401 if not h.headers.get("Authorization") else 404, "RepositoryNotFound", "Repository not found", head)
            return None
        if not self.authorized(h, repo, head):
            return None
        sha = repo.resolve(rev) if rev is not None else None
        if rev is not None and sha is None:
            self.error(h, 404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
            return None
        return repo, sha

    def api(self, h, rest, head):
        if "/tree/" in rest:  # huggingface_hub's snapshot_download lists files this way
            repo_id, rev = rest.split("/tree/", 1)
            return self.tree(h, repo_id, urllib.parse.unquote(rev), head)
        if rest.endswith("/refs"):
            repo_id, rev = rest[:-len("/refs")], None
        elif "/revision/" in rest:
            repo_id, rev = rest.split("/revision/", 1)
            rev = urllib.parse.unquote(rev)
        else:
            repo_id, rev = rest, "main"
        found = self.lookup(h, repo_id, rev, head)
        if found is None:
            return
        repo, sha = found
        if rev is None:
            body = {"branches": [{"name": n, "ref": f"refs/heads/{n}", "targetCommit": s} for n, s in sorted(repo.branches.items())],
                    "tags": [{"name": n, "ref": f"refs/tags/{n}", "targetCommit": s} for n, s in sorted(repo.tags.items())],
                    "converts": []}
        else:
            if self.take_fault("endless_json", rest) is not None:
                return self.endless(h)
            blobs = self.listing_blobs and h.query.get("blobs") == ["true"]
            body = {"_id": "x", "id": repo_id, "modelId": repo_id, "sha": sha, "private": False, "gated": repo.gated,
                    "disabled": False, "tags": [],
                    "siblings": [self.sibling(f, data, blobs) for f, data in sorted(repo.commits[sha].items())]}
        self.send(h, 200, json.dumps(body).encode(), {"Content-Type": "application/json"}, head)

    def sibling(self, name, data, blobs):
        entry = {"rfilename": name}
        if blobs:
            entry.update({"blobId": git_blob_id(data), "size": len(data)})
            if name.endswith(LFS_SUFFIXES):
                entry["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 130}
        return entry

    def endless(self, h):
        """A JSON answer that never ends: '{"siblings": [' and then entries."""
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Connection", "close")
        h.end_headers()
        h.close_connection = True
        try:
            h.wfile.write(b'{"sha": "' + b"0" * 40 + b'", "siblings": [')
            piece = b'{"rfilename": "x"},' * 4096
            while True:
                h.wfile.write(piece)
        except (BrokenPipeError, ConnectionResetError, OSError):
            return

    def tree(self, h, repo_id, rev, head):
        found = self.lookup(h, repo_id, rev, head)
        if found is None:
            return
        repo, sha = found
        entries, folders = [], set()
        for name, data in sorted(repo.commits[sha].items()):
            parts = name.split("/")
            for i in range(1, len(parts)):
                folders.add("/".join(parts[:i]))
            entry = {"type": "file", "oid": git_blob_id(data), "size": len(data), "path": name}
            if name.endswith(LFS_SUFFIXES):
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 130}
            entries.append(entry)
        entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": f} for f in sorted(folders)]
        self.send(h, 200, json.dumps(entries).encode(), {"Content-Type": "application/json"}, head)

    def resolve(self, h, path, head):
        repo_id, rest = path[1:].split("/resolve/", 1)
        rev, _, filename = rest.partition("/")
        rev, filename = urllib.parse.unquote(rev), urllib.parse.unquote(filename)
        found = self.lookup(h, repo_id, rev, head)
        if found is None:
            return
        repo, sha = found
        data = repo.commits[sha].get(filename)
        if data is None:
            return self.error(h, 404, "EntryNotFound", f"{filename} does not exist", head)
        common = {"X-Repo-Commit": sha}
        if filename.endswith(LFS_SUFFIXES):
            digest = hashlib.sha256(data).hexdigest()
            self.blobs[digest] = data
            location = f"{self.cdn}/bridge/{digest}?repo={urllib.parse.quote(repo_id)}"
            if self.take_fault("protocol_relative", filename) is not None:
                location = location[len("http:"):]
            common.update({"X-Linked-Etag": self.etags.get(filename, f'"{digest}"'),
                           "X-Linked-Size": self.sizes.get(filename, str(len(data))),
                           "ETag": f'"{git_blob_id(data)[:20]}"', "Location": location})
            return self.send(h, 302, b"", common, head)
        data = self.bodies.get(filename, data)
        common.update({"ETag": self.etags.get(filename, f'"{git_blob_id(data)}"'), "Content-Type": "application/octet-stream"})
        self.send(h, 200, data, common, head)

    def lfs(self, h, digest, head):
        data = self.blobs.get(digest)
        if data is None:
            return self.error(h, 404, None, "Not Found", head)
        start, end = 0, None
        rng = h.headers.get("Range")
        if rng and rng.startswith("bytes="):
            first, _, last = rng[len("bytes="):].partition("-")
            start, end = int(first), (min(int(last), len(data) - 1) if last else None)  # "bytes=0-7": a header's first bytes
            if start >= len(data):
                return self.send(h, 416, b"", {"Content-Range": f"bytes */{len(data)}"}, head)
        body = data[start:] if end is None else data[start:end + 1]
        extra = self.take_fault("overlong", digest)
        if extra is not None:  # more than X-Linked-Size announced, and a Content-Length that says so
            body = body + b"\0" * extra
        headers = {"ETag": f'"{digest}"', "Content-Type": "application/octet-stream", "Content-Length": str(len(body)),
                   "Accept-Ranges": "bytes"}
        if start or end is not None:
            headers["Content-Range"] = f"bytes {start}-{start + len(body) - 1}/{len(data)}"
        h.send_response(206 if start or end is not None else 200)
        for k, v in headers.items():
            h.send_header(k, v)
        h.end_headers()
        if head:
            return
        if not head and self.take_fault("corrupt", digest) is not None:
            body = bytes([body[0] ^ 0xFF]) + body[1:]
        hang = self.take_fault("hang", digest)
        if hang is not None:
            time.sleep(hang)
            return
        trickle = self.take_fault("trickle", digest)
        if trickle is not None:
            try:
                while True:
                    h.wfile.write(body[:1])
                    h.wfile.flush()
                    time.sleep(trickle)
            except (BrokenPipeError, ConnectionResetError, OSError):
                return
        cut = self.take_fault("cut", digest)
        slow = self.take_fault("slow", digest)
        if cut is not None:
            h.wfile.write(body[:cut])
            h.wfile.flush()
            h.close_connection = True
            return
        piece = 16384
        for i in range(0, len(body), piece):
            try:
                h.wfile.write(body[i:i + piece])
                h.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                return
            if slow:
                time.sleep(slow)
