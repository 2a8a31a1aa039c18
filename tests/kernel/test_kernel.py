#!/usr/bin/env python3
"""anatomy as a Jupyter kernel, driven by Jupyter's own client.

The kernelspec is installed into a temporary prefix with
`anatomy --install-kernel --prefix`, and jupyter_client (Debian's
python3-jupyter-client) starts it by name, as Jupyter does, then checks:
execute with output and result, an error and then a variable still defined,
completion, inspect, is_complete, an interrupt of a running loop, display of
an autopsy chart as SVG and of an autopsy as HTML, and shutdown. Hostile
input, from a client of its own: connection files with impossible ports are
refused; replayed signed messages are dropped; malformed messages are
answered with an error (or logged) and the kernel goes on.
    test_kernel.py ANATOMY_EXE
"""
import hashlib
import hmac
import json
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
import zlib

try:
    from jupyter_client.manager import start_new_kernel
    from jupyter_client.kernelspec import KernelSpecManager
    import zmq
except ImportError as e:
    print("skipped: jupyter_client is not installed for %s (%s)" % (sys.executable, e))
    sys.exit(77)

exe = os.path.abspath(sys.argv[1])
prefix = tempfile.mkdtemp()
out = subprocess.run([exe, "--install-kernel", "--prefix", prefix], capture_output=True, text=True)
assert out.returncode == 0, out.stderr
os.environ["JUPYTER_PATH"] = os.path.join(prefix, "share", "jupyter")

passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    print(("ok    " if ok else "FAIL  ") + name + ("" if ok else ": " + str(detail)[:2000]))
    passed, failed = passed + bool(ok), failed + (not ok)


specs = KernelSpecManager().find_kernel_specs()
check("the kernelspec is found by name", "anatomy" in specs, specs)
spec = KernelSpecManager().get_kernel_spec("anatomy")
check("kernelspec: argv, language, interrupt mode",
      spec.argv[:2] == [exe, "--kernel"] and spec.language == "lua" and spec.interrupt_mode == "signal", spec.to_dict())



# Connection files with impossible ports (or keys of the wrong type): refused
# before anything is bound, naming the key and the value.
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def refused(changes, drop=()):
    """(rc, stderr) of `anatomy --kernel` on a connection file of free ports with changes; rc None when it ran on"""
    conn = {"transport": "tcp", "ip": "127.0.0.1", "key": "k", "signature_scheme": "hmac-sha256"}
    for name in ("shell_port", "control_port", "stdin_port", "iopub_port", "hb_port"):
        conn[name] = free_port()
    conn.update(changes)
    for name in drop:
        del conn[name]
    path = os.path.join(prefix, "bad-connection.json")
    with open(path, "w") as f:
        json.dump(conn, f)
    try:
        out = subprocess.run([exe, "--kernel", path], capture_output=True, text=True, timeout=30)
        return out.returncode, out.stderr
    except subprocess.TimeoutExpired as e:
        return None, (e.stderr or b"").decode(errors="replace")


for changes, said in [({"shell_port": 99999}, "shell_port must be a port (an integer in 1..65535), not a number (99999)"),
                      ({"control_port": -1}, "control_port must be a port (an integer in 1..65535), not a number (-1)"),
                      ({"stdin_port": 1.5}, "stdin_port must be a port (an integer in 1..65535), not a number (1.5)"),
                      ({"iopub_port": "5555"}, 'iopub_port must be a port (an integer in 1..65535), not a string ("5555")'),
                      ({"hb_port": 0}, "hb_port must be a port (an integer in 1..65535), not a number (0) (0 asks the"),
                      ({"key": 5}, "key must be a string, not a number (5)")]:
    rc, err = refused(changes)
    check("connection file %s: refused, naming the key and the value" % json.dumps(changes),
          rc not in (None, 0) and said in err, (rc, err))
rc, err = refused({}, drop=["hb_port"])
check("connection file without hb_port: refused", rc not in (None, 0) and "has no hb_port" in err, (rc, err))
with socket.socket() as taken:  # shell_port is bound first: a kernel that bound before checking fails on it
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    rc, err = refused({"shell_port": taken.getsockname()[1], "hb_port": 70000})
check("an impossible port is refused before any socket is bound", rc not in (None, 0)
      and "hb_port must be a port" in err and "cannot bind" not in err, (rc, err))
fifo = os.path.join(prefix, "fifo-connection.json")
os.mkfifo(fifo)
try:
    out = subprocess.run([exe, "--kernel", fifo], capture_output=True, text=True, timeout=30)
    rc, err = out.returncode, out.stderr
except subprocess.TimeoutExpired:
    rc, err = None, "hung"
check("a FIFO as the connection file is refused, not opened", rc not in (None, 0) and "FIFO" in err, (rc, err))
os.remove(fifo)


def png_pixels(path):
    """(width, height, rows of RGBA tuples) of a PNG of 8-bit RGBA with filter 0 rows, as the logo is written"""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    chunks, at = {}, 8
    while at < len(data):
        n = struct.unpack(">I", data[at:at + 4])[0]
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + n]
        assert struct.unpack(">I", data[at + 8 + n:at + 12 + n])[0] == zlib.crc32(kind + body), "bad CRC"
        chunks[kind] = chunks.get(kind, b"") + body
        at += 12 + n
    w, h, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, colour) == (8, 6), (depth, colour)
    raw = zlib.decompress(chunks[b"IDAT"])
    rows = [raw[y * (1 + 4 * w) + 1:(y + 1) * (1 + 4 * w)] for y in range(h)]
    return w, h, [[tuple(r[4 * x:4 * x + 4]) for x in range(w)] for r in rows]


for size in (32, 64):
    name = "logo-%dx%d" % (size, size)
    try:
        w, h, px = png_pixels(os.path.join(spec.resource_dir, name + ".png"))
        k = size / 64
        ok = (w, h) == (size, size) and px[0][0][3] == 0 and px[int(30 * k)][int(52 * k)] == (0xf2, 0xb1, 0x34, 255) \
            and px[int(5 * k)][int(30 * k)] == (0x1f, 0x3b, 0x57, 255)
        check("kernelspec: %s, a PNG of the logo (transparent corner, ground, bar)" % name, ok, (w, h, px[0][0]))
    except (KeyError, AssertionError, OSError) as e:
        check("kernelspec: %s, a PNG of the logo" % name, False, repr(e))

listed = subprocess.run(["jupyter", "kernelspec", "list"], capture_output=True, text=True)
check("`jupyter kernelspec list` shows it", listed.returncode == 0 and any(
    line.split()[:1] == ["anatomy"] for line in listed.stdout.splitlines()), listed.stdout + listed.stderr)

kernel_log = os.path.join(prefix, "kernel-stderr.txt")
km, kc = start_new_kernel(kernel_name="anatomy", startup_timeout=90, stderr=open(kernel_log, "w"))


def logged():
    """what the kernel wrote to stderr so far"""
    time.sleep(0.2)
    with open(kernel_log, errors="replace") as f:
        return f.read()


class Raw:
    """A client of our own on the kernel's shell, control and stdin sockets (one identity, as a
    frontend has), signing with the connection's key: it sends what jupyter_client would not."""

    def __init__(self, info):
        self.key = info["key"] if isinstance(info["key"], bytes) else info["key"].encode()
        self.session = uuid.uuid4().hex
        ident = uuid.uuid4().hex.encode()
        self.sockets = {}
        for name in ("shell", "control", "stdin"):
            s = zmq.Context.instance().socket(zmq.DEALER)
            s.setsockopt(zmq.IDENTITY, ident)
            s.setsockopt(zmq.LINGER, 0)
            s.connect("%s://%s:%d" % (info["transport"], info["ip"], info[name + "_port"]))
            self.sockets[name] = s

    def sign(self, parts):
        h = hmac.new(self.key, digestmod=hashlib.sha256)
        for p in parts:
            h.update(p)
        return h.hexdigest().encode()

    def message(self, msg_type, content, header=None, parent=b"{}", metadata=b"{}", signature=None):
        """(msg_id, frames) of a signed message; header, parent, metadata and content as bytes are sent as they are"""
        msg_id = uuid.uuid4().hex
        if header is None:
            header = json.dumps({"msg_id": msg_id, "msg_type": msg_type, "session": self.session, "username": "test",
                                 "date": "2024-01-01T00:00:00.000000Z", "version": "5.3"}).encode()
        parts = [header, parent, metadata, content if isinstance(content, bytes) else json.dumps(content).encode()]
        return msg_id, [b"<IDS|MSG>", signature or self.sign(parts)] + parts

    def send(self, channel, frames):
        self.sockets[channel].send_multipart(frames)

    def request(self, channel, msg_type, content, **kw):
        msg_id, frames = self.message(msg_type, content, **kw)
        self.send(channel, frames)
        return msg_id

    def recv(self, channel, timeout=15):
        """the next message on channel as {msg_type, parent_id, content}, or None after timeout seconds"""
        s = self.sockets[channel]
        if not s.poll(timeout * 1000):
            return None
        frames = s.recv_multipart()
        at = frames.index(b"<IDS|MSG>")
        header, parent, _, content = (json.loads(f) for f in frames[at + 2:at + 6])
        return {"msg_type": header["msg_type"], "parent_id": parent.get("msg_id"), "content": content}

    def answers(self, channel, msg_type, content):
        """whether a good request on channel is the next one answered (the kernel lives on)"""
        msg_id = self.request(channel, msg_type, content)
        reply = self.recv(channel)
        return reply is not None and reply["parent_id"] == msg_id and reply["content"].get("status") == "ok"


def execute(code, **fields):
    content = {"code": code, "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False,
               "stop_on_error": True}
    content.update(fields)
    return content


def run(code, timeout=120):
    """execute_reply content and the iopub messages of that request"""
    return finish(kc.execute(code), timeout)


def finish(msg_id, timeout=120):
    """the execute_reply content and the iopub messages of a request sent"""
    reply = kc.get_shell_msg(timeout=timeout)
    msgs = []
    while True:
        m = kc.get_iopub_msg(timeout=timeout)
        if m["parent_header"].get("msg_id") != msg_id:
            continue
        msgs.append(m)
        if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
            break
    return reply["content"], msgs


def unscoped(markup, scope):
    """the selectors of the <style> blocks in markup that do not start with scope"""
    found = re.findall(r"<style>(.*?)</style>", markup, re.S)
    selectors = [sel.strip() for css in found for rule in re.findall(r"([^{}]+)\{[^}]*\}", css)
                 for sel in rule.split(",")]
    return [sel for sel in selectors if not (sel == scope or sel.startswith(scope + " "))] if found else ["(no style)"]


def of(msgs, kind):
    return [m["content"] for m in msgs if m["msg_type"] == kind]


try:
    info = kc.kernel_info(reply=True, timeout=30)["content"]
    check("kernel_info: protocol 5.3, language lua", info["protocol_version"] == "5.3"
          and info["language_info"]["name"] == "lua", info)

    reply, msgs = run("x = torch.arange(1, 7):view(2, 3)\nprint('hello from the cell')\nx:sum()")
    streams = "".join(c["text"] for c in of(msgs, "stream") if c["name"] == "stdout")
    results = of(msgs, "execute_result")
    check("execute: status ok, a count", reply["status"] == "ok" and reply["execution_count"] >= 1, reply)
    check("execute: print streams to stdout", streams == "hello from the cell\n", streams)
    check("execute: the last line's value is the result, as PyTorch prints it",
          len(results) == 1 and "tensor(21)" in results[0]["data"]["text/plain"], results)

    reply, msgs = run("local t = nil\nreturn t.field")
    errors = of(msgs, "error")
    check("an error: status error with name, value and traceback", reply["status"] == "error"
          and "attempt to index" in reply["evalue"] and len(reply["traceback"]) >= 1, reply)
    check("an error: published on iopub", len(errors) == 1 and errors[0]["evalue"] == reply["evalue"], errors)
    reply, msgs = run("x:size(2)")
    check("after the error the session keeps its variables",
          reply["status"] == "ok" and of(msgs, "execute_result")[0]["data"]["text/plain"] == "3", of(msgs, "execute_result"))

    kc.complete("torch.zer", 9)
    c = kc.get_shell_msg(timeout=30)["content"]
    check("complete: torch.zer", "torch.zeros" in c["matches"] and "torch.zeros_like" in c["matches"]
          and c["cursor_start"] == 0 and c["cursor_end"] == 9, c)
    kc.complete("y = x:me", 8)
    c = kc.get_shell_msg(timeout=30)["content"]
    check("complete: a tensor's methods", "x:mean" in c["matches"] and c["cursor_start"] == 4, c)

    kc.inspect("train.fit", 9)
    c = kc.get_shell_msg(timeout=30)["content"]
    check("inspect: train.fit's help", c["found"] and c["data"]["text/plain"].startswith("train.fit(model, corpus, opts)"), c)
    kc.is_complete("for i = 1, 3 do")
    c = kc.get_shell_msg(timeout=30)["content"]
    check("is_complete: an open block is incomplete", c["status"] == "incomplete", c)
    kc.is_complete("print(1)")
    check("is_complete: a statement is complete", kc.get_shell_msg(timeout=30)["content"]["status"] == "complete")

    # history: this session's cells, as jupyter console and JupyterLab's console ask for them
    run("hist_a = 1")
    run("hist_b = 2")
    kc.history(hist_access_type="tail", n=2, output=False, raw=True)
    tail = kc.get_shell_msg(timeout=30)["content"]
    kc.history(hist_access_type="search", pattern="hist_?*", output=False, raw=True, n=10)
    found = kc.get_shell_msg(timeout=30)["content"]
    check("history: the last cells (tail) and a glob search", [h[2] for h in tail["history"]] == ["hist_a = 1", "hist_b = 2"]
          and tail["history"][1][1] == tail["history"][0][1] + 1
          and [h[2] for h in found["history"]] == ["hist_a = 1", "hist_b = 2"], (tail, found))

    # user_expressions: evaluated after the cell, each its mimebundle or its error
    reply, msgs = finish(kc.execute("ue = 41", user_expressions={"next": "ue + 1", "bad": "nothing.here"}))
    ue = reply.get("user_expressions", {})
    check("user_expressions: values after the cell, errors as errors",
          ue.get("next", {}).get("data", {}).get("text/plain") == "42" and ue.get("bad", {}).get("status") == "error"
          and "nothing" in ue.get("bad", {}).get("evalue", ""), ue)

    # Run All: a failing cell aborts the cells queued behind it (as ipykernel does); the next request runs
    slow_error = "local t = os.clock()\nwhile os.clock() - t < 0.3 do end\nerror('stop here')"  # the others are queued by then
    ids = [kc.execute(slow_error), kc.execute("ran_after = true"), kc.execute("ran_after_too = true")]
    replies = {}
    while len(replies) < 3:
        m = kc.get_shell_msg(timeout=60)
        replies[m["parent_header"]["msg_id"]] = m["content"]["status"]
    check("an error aborts the cells queued behind it", [replies[i] for i in ids] == ["error", "aborted", "aborted"],
          [replies.get(i) for i in ids])
    reply, msgs = run("ran_after == nil and ran_after_too == nil")
    check("... which did not run, and the next cell runs", reply["status"] == "ok"
          and of(msgs, "execute_result")[0]["data"]["text/plain"] == "true", of(msgs, "execute_result"))
    ids = [kc.execute(slow_error, stop_on_error=False), kc.execute("ran_after = true")]
    replies = {}
    while len(replies) < 2:
        m = kc.get_shell_msg(timeout=60)
        replies[m["parent_header"]["msg_id"]] = m["content"]["status"]
    check("stop_on_error = false: the next cell runs", [replies[i] for i in ids] == ["error", "ok"],
          [replies.get(i) for i in ids])

    # input: io.read asks the notebook (input_request on stdin, answered by input_reply)
    msg_id = kc.execute("io.write('your name? ')\nname = io.read()\nlocal n = io.stdin:read('*n')\n"
                        "local mark = io.lines()()\nreturn name .. ' ' .. n * 2 .. mark", allow_stdin=True)
    asked = []
    for answer in ["Ada", "21", "!"]:
        request = kc.get_stdin_msg(timeout=30)
        asked.append((request["msg_type"], request["content"]["password"], request["parent_header"].get("msg_id")))
        kc.input(answer)
    reply, msgs = finish(msg_id)
    said = "".join(c["text"] for c in of(msgs, "stream"))
    check("io.read: an input_request on stdin for each read, for this cell",
          asked == [("input_request", False, msg_id)] * 3, asked)
    check("io.read, io.stdin:read, io.lines(): the lines typed are the values (a line, a number, a line)",
          reply["status"] == "ok" and "Ada 42!" in of(msgs, "execute_result")[0]["data"]["text/plain"]
          and said == "your name? ",
          (reply, of(msgs, "execute_result"), said))
    reply, msgs = finish(kc.execute("v = io.read()", allow_stdin=False))
    check("io.read where the frontend takes no input: an error that says why", reply["status"] == "error"
          and "io.read" in reply["evalue"] and "allow_stdin = false" in reply["evalue"], reply)
    msg_id = kc.execute("waiting = true\nv = io.read()", allow_stdin=True)
    kc.get_stdin_msg(timeout=30)
    sent = time.time()
    km.interrupt_kernel()
    reply, msgs = finish(msg_id)
    check("interrupt while io.read waits: the cell stops within 2 s", reply["status"] == "error"
          and reply["ename"] == "Interrupted" and time.time() - sent < 2, reply)
    kc.input("too late")  # a reply after the cell ended is dropped
    reply, msgs = run("waiting and v == nil")
    check("... and the kernel goes on", reply["status"] == "ok"
          and of(msgs, "execute_result")[0]["data"]["text/plain"] == "true", of(msgs, "execute_result"))

    # a long loop, interrupted: by SIGINT (the kernelspec's interrupt mode)
    started = time.time()
    msg_id = kc.execute("n = 0\nwhile true do n = n + torch.ones(1):item() end")
    time.sleep(1.0)
    sent = time.time()
    km.interrupt_kernel()
    reply = kc.get_shell_msg(timeout=30)["content"]
    took = time.time() - sent
    check("interrupt: the loop stops within 2 s", reply["status"] == "error" and reply["ename"] == "Interrupted"
          and took < 2, (reply, took))
    reply, msgs = run("n > 0")
    check("interrupt: the kernel is alive and kept what the loop did", km.is_alive()
          and of(msgs, "execute_result")[0]["data"]["text/plain"] == "true", of(msgs, "execute_result"))

    # ... and by an interrupt_request on the control channel (interrupt_mode 'message')
    msg_id = kc.execute("m = 0\nwhile true do m = m + torch.ones(1):item() end")
    time.sleep(1.0)
    sent = time.time()
    request = kc.session.msg("interrupt_request", {})
    kc.control_channel.send(request)
    control = kc.get_control_msg(timeout=30)
    reply = kc.get_shell_msg(timeout=30)["content"]
    check("interrupt_request on control: replied, and the loop stops within 2 s",
          control["msg_type"] == "interrupt_reply" and reply["ename"] == "Interrupted" and time.time() - sent < 2,
          (control["msg_type"], reply))

    # Hostile input, from a client of our own
    raw = Raw(km.get_connection_info())
    # a replayed message is dropped: once on shell, control and stdin
    msg_id, frames = raw.message("execute_request", execute("replayed = (replayed or 0) + 1"))
    raw.send("shell", frames)
    first = raw.recv("shell")
    raw.send("shell", frames)
    later = raw.request("shell", "execute_request", execute("assert(replayed == 1, 'replayed ran ' .. replayed .. ' times')"))
    second = raw.recv("shell")
    check("replay: an execute_request sent twice runs once, and the replay gets no reply",
          first and first["parent_id"] == msg_id and first["content"]["status"] == "ok"
          and second and second["parent_id"] == later and second["content"]["status"] == "ok", (first, second))
    check("replay: logged as a Duplicate Signature", "shell: Duplicate Signature" in logged(), logged()[-2000:])
    msg_id, frames = raw.message("kernel_info_request", {})
    raw.send("control", frames)
    first = raw.recv("control")
    raw.send("control", frames)
    check("replay: a control request sent twice is answered once", first and first["parent_id"] == msg_id
          and raw.answers("control", "kernel_info_request", {}), first)
    cell = raw.request("shell", "execute_request", execute("local a, b = io.read(), io.read()\n"
                                                           "assert(a .. '|' .. b == 'first|second', a .. '|' .. b)",
                                                           allow_stdin=True))
    asked = raw.recv("stdin")
    _, frames = raw.message("input_reply", {"value": "first"}, parent=json.dumps({"msg_id": cell}).encode())
    raw.send("stdin", frames)
    raw.send("stdin", frames)
    asked_again = raw.recv("stdin")
    raw.request("stdin", "input_reply", {"value": "second"})
    reply = raw.recv("shell")
    check("replay: an input_reply sent twice answers one io.read", asked and asked_again
          and asked_again["msg_type"] == "input_request" and reply and reply["content"]["status"] == "ok",
          (asked, asked_again, reply))

    # messages that are not what the protocol says: dropped and logged where no reply can be addressed
    # (each message once per channel with its own content: the same parts again would be a replay)
    for what, make, said in [
            ("a header that is an array", lambda c: raw.message("", c, header=b"[1, 2]")[1],
             "header is an array ([1,2])"),
            ("a header that is not JSON", lambda c: raw.message("", c, header=b"{nope")[1], "header is not JSON"),
            ("a header whose msg_type is a number", lambda c: raw.message("", c, header=b'{"msg_type": 7}')[1],
             "header.msg_type is a number (7), not a string"),
            ("a header without msg_type", lambda c: raw.message("", c, header=b'{"msg_id": "x"}')[1],
             "msg_type is missing"),
            ("too few frames", lambda c: raw.message("kernel_info_request", c)[1][:4], "4 frames after its identities"),
            ("a wrong signature", lambda c: raw.message("execute_request", execute("bad_signature_ran = true"),
                                                        signature=b"0" * 64)[1], "wrong signature")]:
        for channel in ("shell", "control"):
            raw.send(channel, make({"on": channel}))
            check("malformed on %s: %s is logged, and the next request answered" % (channel, what),
                  raw.answers(channel, "kernel_info_request", {}) and any(
                      line.startswith("anatomy --kernel: %s: " % channel) and said in line
                      for line in logged().splitlines()), logged()[-1000:])
    # ... and answered with an error reply where the header names a request
    bad_fields = [
        ("execute_request", {"content": b"[1]"}, "execute_request: content must be an object, not an array ([1])"),
        ("execute_request", {"content": execute("1"), "parent": b"5"},
         "execute_request: parent_header must be an object, not a number (5)"),
        ("execute_request", {"content": execute("1"), "metadata": b"{oops"}, "execute_request: metadata is not JSON"),
        ("execute_request", {"content": execute(5)}, "execute_request: content.code must be a string, not a number (5)"),
        ("execute_request", {"content": execute("stop_ran = true; error('x')", stop_on_error="no")},
         'execute_request: content.stop_on_error must be a boolean, not a string ("no")'),
        ("execute_request", {"content": execute("1", silent=1)}, "content.silent must be a boolean, not a number (1)"),
        ("execute_request", {"content": execute("1", user_expressions={"a": 5})},
         "content.user_expressions must be an object of strings"),
        ("complete_request", {"content": {"code": "x", "cursor_pos": "1"}},
         'complete_request: content.cursor_pos must be an integer >= 0, not a string ("1")'),
        ("inspect_request", {"content": {"code": ["x"], "cursor_pos": 1}},
         "inspect_request: content.code must be a string, not an array or object"),
        ("is_complete_request", {"content": {"code": False}}, "content.code must be a string, not a boolean (false)"),
        ("history_request", {"content": {"hist_access_type": "tail", "n": "ten"}},
         'history_request: content.n must be an integer >= 0, not a string ("ten")'),
        ("shutdown_request", {"content": {"restart": "yes"}},
         'shutdown_request: content.restart must be a boolean, not a string ("yes")'),
    ]
    for msg_type, parts, said in bad_fields:
        content = parts.pop("content")
        msg_id = raw.request("shell", msg_type, content, **parts)
        reply = raw.recv("shell")
        check("malformed on shell: %s: an error reply that says why (%s)" % (msg_type, said),
              reply and reply["parent_id"] == msg_id and reply["msg_type"] == msg_type.replace("_request", "_reply")
              and reply["content"]["status"] == "error" and reply["content"]["ename"] == "MalformedMessage"
              and said in reply["content"]["evalue"], reply)
    check("... none of them ran, and the kernel answers the next request",
          raw.answers("shell", "execute_request", execute("assert(stop_ran == nil and bad_signature_ran == nil)")))
    for msg_type, content, said in [
            ("shutdown_request", {"restart": "yes"}, 'shutdown_request: content.restart must be a boolean, not a string'),
            ("interrupt_request", b"[]", "interrupt_request: content must be an object, not an array"),
            ("kernel_info_request", b'"x"', "kernel_info_request: content must be an object, not a string")]:
        msg_id = raw.request("control", msg_type, content)
        reply = raw.recv("control")
        check("malformed on control: %s: an error reply that says why, and the kernel goes on" % msg_type,
              reply and reply["parent_id"] == msg_id and reply["content"]["status"] == "error"
              and said in reply["content"]["evalue"] and raw.answers("control", "kernel_info_request", {})
              and km.is_alive(), reply)
    cell = raw.request("shell", "execute_request", execute("v = io.read()", allow_stdin=True))
    raw.recv("stdin")
    raw.request("stdin", "input_reply", {"value": 5})
    reply = raw.recv("shell")
    check("malformed input_reply: the cell's io.read fails, saying why", reply and reply["parent_id"] == cell
          and reply["content"]["status"] == "error"
          and "input_reply: content.value must be a string, not a number (5)" in reply["content"]["evalue"], reply)
    reply, msgs = run("1 + 1")
    check("after the hostile input the kernel runs cells for its own client", km.is_alive() and reply["status"] == "ok"
          and of(msgs, "execute_result")[0]["data"]["text/plain"] == "2", reply)

    km.restart_kernel(now=False)
    kc.wait_for_ready(timeout=90)
    reply, msgs = run("x == nil")
    check("restart: a fresh kernel, without the old globals", km.is_alive()
          and of(msgs, "execute_result")[0]["data"]["text/plain"] == "true", of(msgs, "execute_result"))

    code = "\n".join([
        "local c = data.from_string(('to be or not to be, that is the question. '):rep(40))",
        "torch.manual_seed(1)",
        "m = models.gpt{vocab = c.vocab_size, dim = 16, heads = 2, layers = 2, seq = 16, ffn = 32}",
        "local run = train.fit(m, c, {steps = 20, batch = 4, seq = 16})",
        "a = autopsy.run(m, c, {history = run, batch = 4, seq = 16})",
        "display(a:chart('grad_norm'))",
    ])
    reply, msgs = run(code)
    shown = of(msgs, "display_data")
    progress = "".join(c["text"] for c in of(msgs, "stream"))
    check("... the chart's styles touch only the chart (HTML and SVG)", len(shown) == 1
          and unscoped(shown[0]["data"]["text/html"], ".anatomy-output") == []
          and unscoped(shown[0]["data"]["image/svg+xml"], "svg.anatomy-chart") == [], shown[0]["data"].keys())
    check("display(a:chart(...)): the chart arrives as SVG (and text)", reply["status"] == "ok" and len(shown) == 1
          and shown[0]["data"].get("image/svg+xml", "").startswith("<svg")
          and "grad_norm per layer" in shown[0]["data"]["text/plain"], (reply, [list(s["data"]) for s in shown]))
    check("training progress streams, rewriting its line with a carriage return",
          "step 20/20" in progress and "\r" in progress and "\x1b" not in progress, repr(progress[-300:]))
    # Interrupt in the middle of training: the run stops at a step boundary and keeps what was learned
    code = "\n".join([
        "local c = data.from_string(('to be or not to be, that is the question. '):rep(40))",
        "long = train.fit(m, c, {steps = 10 ^ 6, batch = 4, seq = 16, eval_every = 10 ^ 9})",
        "long.interrupted",
    ])
    msg_id = kc.execute(code)
    time.sleep(3.0)
    km.interrupt_kernel()
    reply = kc.get_shell_msg(timeout=30)["content"]
    msgs = []
    while True:
        m = kc.get_iopub_msg(timeout=30)
        if m["parent_header"].get("msg_id") != msg_id:
            continue
        msgs.append(m)
        if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
            break
    said = "".join(c["text"] for c in of(msgs, "stream"))
    check("interrupt during train.fit: the cell ends normally, the run says it was interrupted",
          reply["status"] == "ok" and "interrupted after step" in said
          and of(msgs, "execute_result")[0]["data"]["text/plain"] == "true", (reply, said[-300:]))
    reply, msgs = run("long.steps > 1 and #long.train == long.steps")
    check("... and keeps the steps it trained", of(msgs, "execute_result")[0]["data"]["text/plain"] == "true",
          of(msgs, "execute_result"))

    reply, msgs = run("a")
    data = of(msgs, "execute_result")[0]["data"]
    check("an autopsy as a cell's result: its HTML report and its table",
          "<svg" in data.get("text/html", "") and "grad_norm" in data["text/plain"], list(data))
    html = data.get("text/html", "")
    check("... as a fragment (no page of its own) whose style touches only itself",
          html.startswith('<div class="anatomy-output">') and "<body" not in html
          and unscoped(html, ".anatomy-output") == [], unscoped(html, ".anatomy-output")[:5])
    reply, msgs = run("a:attention(1, 2)")
    data = of(msgs, "execute_result")[0]["data"]
    check("an attention map as a cell's result: a heatmap (SVG) and its text",
          'data-kind="attention"' in data.get("image/svg+xml", "") and "head 2" in data["text/plain"], list(data))
finally:
    try:
        km.shutdown_kernel(now=False)
    except Exception as e:  # noqa: BLE001 - the check below says what happened
        print("shutdown raised", e)
    check("shutdown: the kernel process ends", not km.is_alive())
    kc.stop_channels()

if failed:
    print("the kernel's stderr, last lines:\n" + logged()[-3000:])
print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
