"""`kdt serve` ($KDT_BIN, docs/interfaces.md section 3, docs/serve.md) with real clients on 127.0.0.1: the
`openai` package, curl and raw sockets. The built-in model with token id prompts: completions
streamed and not equal `kdt generate` on the same prompt alone, also for 32 clients at once
(no cross-talk between the requests of a batch); a client that hangs up mid-stream frees its
slot; bad bodies get a 4xx OpenAI-style error and change nothing (a table, then random
mutations); body limit, half-sent requests, auth, a full queue; SIGTERM drains and exits 0.
Text and chat run on a fixture checkpoint with a tokenizer.json built here, once the server has
a tokenizer library (skipped, with the reason, while it has none). Every loop is bounded.
"""
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest

ROOT = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)
BIN = os.environ.get("KDT_BIN", "")
pytestmark = pytest.mark.skipif(not BIN or not os.path.exists(BIN), reason="KDT_BIN (the kdt binary) not built")


class Server:
    """A `kdt serve` process on a free loopback port; stderr is kept for the asserts."""

    def __init__(self, *args, wait_health=True):
        args = args if "--model" in args else ("--model", "builtin", *args)
        self.proc = subprocess.Popen([BIN, "serve", "--host", "127.0.0.1", "--port", "0", "--backend", "cpu", *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log = []
        self.port = None
        ready = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.log.append(line)
                m = re.match(r"listening on http://127\.0\.0\.1:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(30) or self.port is None:
            self.stop()
            raise RuntimeError("kdt serve did not start: " + "".join(self.log))
        deadline = time.time() + 60
        while wait_health and time.time() < deadline:
            if self.request("GET", "/health")[0] == 200 and any(" loaded: " in line for line in self.log):
                break
            time.sleep(0.05)

    def request(self, method, path, body=None, headers=None, timeout=60):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
            c.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
            r = c.getresponse()
            return r.status, r.read().decode("utf-8", "replace"), r.getheader("Content-Type", "")
        finally:
            c.close()

    def post(self, path, body, **kw):
        st, text, _ = self.request("POST", path, body, **kw)
        return st, json.loads(text) if text else None

    def metrics(self):
        st, text, ctype = self.request("GET", "/metrics")
        assert st == 200 and ctype.startswith("text/plain")
        return parse_prometheus(text)

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None


def parse_prometheus(text):
    """Prometheus text format 0.0.4: {(name, frozenset(labels)): value}; every line must parse."""
    out = {}
    sample = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
    for line in text.splitlines():
        if not line or line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        m = sample.match(line)
        assert m, "not a Prometheus sample line: %r" % line
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(3) or ""))
        out[(m.group(1), labels)] = float(m.group(4))
    return out


def metric(ms, name, **labels):
    return ms.get((name, frozenset(labels.items())), 0.0)


def generate_alone(prompt, n):
    r = subprocess.run([BIN, "generate", "--model", "builtin", "--backend", "cpu", "--prompt-ids", ",".join(map(str, prompt)), "--max-new", str(n)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [int(t) for t in r.stdout.split()]


def sse_events(raw):
    """The data lines of a server-sent event stream; the last must be [DONE]."""
    events = [line[6:] for line in raw.split("\n") if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]", raw[-300:]
    return [json.loads(e) for e in events[:-1]]


def open_stream(port, body):
    """A streamed completion on a raw socket, so that the test can hang up whenever it likes."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    data = json.dumps(dict(body, stream=True)).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
              % (len(data), data))
    return s


@pytest.fixture(scope="module")
def srv():
    s = Server("--spec", "lookup", "--max-batch", "8", "--ctx", "4096", "--timeout", "2", "--max-body", "65536")
    yield s
    assert s.stop() == 0, "".join(s.log)


def test_health_models_metrics(srv):
    st, text, _ = srv.request("GET", "/health")
    assert st == 200 and json.loads(text)["status"] == "ok"
    st, text, _ = srv.request("GET", "/v1/models")
    models = json.loads(text)
    assert st == 200 and models["object"] == "list" and models["data"][0]["id"] == "kdt-builtin"
    ms = srv.metrics()
    for name in ("kdt_prompt_tokens_total", "kdt_generated_tokens_total", "kdt_tokens_per_second", "kdt_mean_accepted_length",
                 "kdt_batch_size", "kdt_queue_depth", "kdt_cache_blocks_used", "kdt_cache_blocks_total"):
        assert (name, frozenset()) in ms, name
    assert metric(ms, "kdt_cache_blocks_total") > 0
    assert metric(ms, "kdt_requests_total", route="/health", status="200") >= 1


def test_completion_equals_generate(srv):
    prompt = [5, 6, 7, 8, 5, 6, 7]
    want = generate_alone(prompt, 20)
    st, r = srv.post("/v1/completions", {"model": "kdt-builtin", "prompt": prompt, "max_tokens": 20, "temperature": 0})
    assert st == 200, r
    c = r["choices"][0]
    assert c["token_ids"] == want and c["finish_reason"] == "length"
    assert r["object"] == "text_completion" and r["id"].startswith("cmpl-") and isinstance(r["created"], int)
    assert r["usage"] == {"prompt_tokens": 7, "completion_tokens": 20, "total_tokens": 27}
    # A list holding one prompt is the same prompt.
    st, r2 = srv.post("/v1/completions", {"prompt": [prompt], "max_tokens": 20})
    assert st == 200 and r2["choices"][0]["token_ids"] == want


def test_sampling_seeded(srv):
    """temperature > 0 samples (lossless tree acceptance, docs/sampling.md); a request alone on the
    server with a seed gives the same tokens twice, a request at temperature 0 is greedy."""
    body = {"prompt": [5, 6, 7, 9], "max_tokens": 12, "temperature": 0.9, "top_k": 40, "top_p": 0.95, "seed": 11}
    got = []
    for _ in range(2):
        st, r = srv.post("/v1/completions", body)
        assert st == 200, r
        got.append(r["choices"][0]["token_ids"])
    assert got[0] == got[1] and len(got[0]) == 12
    st, r = srv.post("/v1/completions", dict(body, seed=12))
    assert st == 200 and len(r["choices"][0]["token_ids"]) == 12


def test_openai_client(srv):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % srv.port, api_key="unused", max_retries=0, timeout=60)
    prompt = [11, 12, 13, 14]
    want = generate_alone(prompt, 16)
    r = client.completions.create(model="kdt-builtin", prompt=prompt, max_tokens=16, temperature=0)
    assert r.choices[0].model_extra["token_ids"] == want and r.usage.completion_tokens == 16
    got = []
    finish = None
    for chunk in client.completions.create(model="kdt-builtin", prompt=prompt, max_tokens=16, stream=True):
        got += chunk.choices[0].model_extra["token_ids"]
        finish = chunk.choices[0].finish_reason or finish
    assert got == want and finish == "length"
    assert [m.id for m in client.models.list()] == ["kdt-builtin"]
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="kdt-builtin", prompt=prompt, max_tokens=16, n=2)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt=prompt, max_tokens=4)


def test_curl_stream(srv):
    if not shutil.which("curl"):
        pytest.skip("curl not installed")
    prompt = [40, 41, 42]
    want = generate_alone(prompt, 12)
    r = subprocess.run(["curl", "-sN", "--max-time", "60", "http://127.0.0.1:%d/v1/completions" % srv.port, "-H",
                        "Content-Type: application/json", "-d", json.dumps({"prompt": prompt, "max_tokens": 12, "stream": True})],
                       capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stderr
    events = sse_events(r.stdout)
    assert sum((e["choices"][0]["token_ids"] for e in events), []) == want
    assert events[-1]["choices"][0]["finish_reason"] == "length" and events[-1]["usage"]["completion_tokens"] == 12


def test_32_concurrent_clients(srv):
    rng = random.Random(1234)
    prompts = [[rng.randrange(512) for _ in range(rng.randrange(1, 40))] for _ in range(32)]
    n_new = [rng.randrange(1, 24) for _ in range(32)]
    want = [generate_alone(p, n) for p, n in zip(prompts, n_new)]
    got = [None] * 32

    def client(i):
        body = {"prompt": prompts[i], "max_tokens": n_new[i], "stream": i % 2 == 1}
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
        c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        raw = r.read().decode()
        c.close()
        if r.status != 200:
            got[i] = ("status", r.status, raw)
        elif body["stream"]:
            got[i] = sum((e["choices"][0]["token_ids"] for e in sse_events(raw)), [])
        else:
            got[i] = json.loads(raw)["choices"][0]["token_ids"]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    bad = [(i, got[i], want[i]) for i in range(32) if got[i] != want[i]]
    assert not bad, bad[:3]


def test_cancel_mid_stream_frees_the_slot(srv):
    before = srv.metrics()
    s = open_stream(srv.port, {"prompt": [1, 2, 3], "max_tokens": 3000})
    seen = b""
    deadline = time.time() + 30
    while seen.count(b"data: ") < 3 and time.time() < deadline:
        seen += s.recv(4096)
    assert seen.count(b"data: ") >= 3
    assert metric(srv.metrics(), "kdt_requests_running") == 1
    s.close()
    deadline = time.time() + 20
    while time.time() < deadline:
        ms = srv.metrics()
        if metric(ms, "kdt_requests_running") == 0 and metric(ms, "kdt_cache_blocks_used") == 0:
            break
        time.sleep(0.05)
    assert metric(ms, "kdt_requests_running") == 0 and metric(ms, "kdt_cache_blocks_used") == 0
    assert metric(ms, "kdt_cancelled_total") == metric(before, "kdt_cancelled_total") + 1
    assert metric(ms, "kdt_generated_tokens_total") - metric(before, "kdt_generated_tokens_total") < 3000


def is_error(st, r, status):
    return st == status and isinstance(r, dict) and set(r) == {"error"} and isinstance(r["error"]["message"], str) and \
        r["error"]["type"] and "param" in r["error"] and "code" in r["error"]


BAD = [
    (b"{not json", 400), (b"[1,2]", 400), (b'"text"', 400), ({}, 400), ({"prompt": None}, 400), ({"prompt": []}, 400),
    ({"prompt": [1, 2.5]}, 400), ({"prompt": [1, -1]}, 400), ({"prompt": [512]}, 400), ({"prompt": [1], "max_tokens": 0}, 400),
    ({"prompt": [1], "max_tokens": "8"}, 400), ({"prompt": [1], "max_tokens": 4096}, 400), ({"prompt": [1] * 5000}, 400),
    ({"prompt": [1], "n": 2}, 400), ({"prompt": [1], "echo": True}, 400), ({"prompt": [1], "logprobs": 3}, 400),
    ({"prompt": [1], "stream": "yes"}, 400), ({"prompt": [1], "temperature": -1}, 400), ({"prompt": [1], "temperature": 2.5}, 400),
    ({"prompt": [1], "top_p": 0}, 400), ({"prompt": [1], "stop": 5}, 400), ({"prompt": [1], "stop": "x"}, 400),
    ({"prompt": [[1], [2]]}, 400), ({"prompt": "text needs a tokenizer"}, 400), ({"prompt": [1], "model": "gpt-4"}, 404),
    ({"prompt": [1], "model": 7}, 400),
]


def test_bad_requests(srv):
    before = srv.metrics()
    for body, status in BAD:
        st, r = srv.post("/v1/completions", body)
        assert is_error(st, r, status), (body, st, r)
    st, r = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert is_error(st, r, 400) and "tokenizer" in r["error"]["message"]
    st, text, _ = srv.request("GET", "/v1/completions")
    assert st == 405
    st, text, _ = srv.request("GET", "/nope")
    assert st == 404 and "error" in json.loads(text)
    ms = srv.metrics()
    assert metric(ms, "kdt_prompt_tokens_total") == metric(before, "kdt_prompt_tokens_total")
    assert metric(ms, "kdt_requests_running") == 0 and metric(ms, "kdt_queue_depth") == 0


def test_fuzz_bodies(srv):
    rng = random.Random(int(os.environ.get("KDT_SEED", "7")))
    base = {"model": "kdt-builtin", "prompt": [3, 4, 5], "max_tokens": 3, "stream": False, "stop": None, "temperature": 0,
            "top_p": 1, "top_k": 0, "seed": 1, "n": 1}
    values = [None, True, False, 0, -1, 1, 2 ** 31, 2 ** 63, 1e308, -0.5, 0.5, "", "x" * 300, [], [1], [[1, 2]], {}, {"a": 1},
              [None], ["a", "b"], [600], [0] * 4097]
    for i in range(250):
        body = dict(base)
        for _ in range(rng.randrange(1, 4)):
            key = rng.choice(list(base) + ["messages", "extra"])
            if rng.random() < 0.2:
                body.pop(key, None)
            else:
                body[key] = rng.choice(values)
        raw = json.dumps(body).encode()
        if rng.random() < 0.2:
            cut = rng.randrange(len(raw))
            raw = raw[:cut] + bytes([rng.randrange(256)]) + raw[cut + 1:]
        st, text, _ = srv.request("POST", "/v1/completions", raw, timeout=60)
        if st == 200:
            assert "choices" in (sse_events(text)[-1] if text.startswith("data: ") else json.loads(text))
        else:
            assert 400 <= st < 500, (raw, st, text)
            assert is_error(st, json.loads(text), st), (raw, text)
    assert srv.proc.poll() is None
    assert srv.request("GET", "/health")[0] == 200


def test_body_limit_and_half_sent(srv):
    st, r = srv.post("/v1/completions", b'{"prompt": [' + b"1," * 40000 + b"1]}")
    assert is_error(st, r, 413)
    # Headers promise a body that never comes: the server drops the connection after --timeout.
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=20)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\"")
    t0 = time.time()
    assert s.recv(4096) == b"" and time.time() - t0 < 15
    s.close()
    assert srv.request("GET", "/health")[0] == 200


def test_api_key():
    s = Server("--api-key", "sekrit", "--max-batch", "2")
    try:
        assert s.request("GET", "/health")[0] == 200
        st, r = s.post("/v1/completions", {"prompt": [1], "max_tokens": 2})
        assert is_error(st, r, 401)
        st, r = s.post("/v1/completions", {"prompt": [1], "max_tokens": 2}, headers={"Authorization": "Bearer wrong!"})
        assert is_error(st, r, 401)
        st, r = s.post("/v1/completions", {"prompt": [1], "max_tokens": 2}, headers={"Authorization": "Bearer sekrit"})
        assert st == 200 and len(r["choices"][0]["token_ids"]) == 2
        assert s.request("GET", "/v1/models")[0] == 401
    finally:
        assert s.stop() == 0


def test_full_queue_and_queue_timeout():
    s = Server("--max-batch", "1", "--max-queue", "1", "--queue-timeout", "2")
    try:
        long = open_stream(s.port, {"prompt": [1, 2], "max_tokens": 4000})
        deadline = time.time() + 20
        while metric(s.metrics(), "kdt_requests_running") < 1 and time.time() < deadline:
            time.sleep(0.02)
        results = []
        second = threading.Thread(target=lambda: results.append(s.post("/v1/completions", {"prompt": [3], "max_tokens": 2})))
        second.start()
        while metric(s.metrics(), "kdt_queue_depth") < 1 and time.time() < deadline:
            time.sleep(0.02)
        st, r = s.post("/v1/completions", {"prompt": [4], "max_tokens": 2})
        assert is_error(st, r, 429)
        second.join(30)
        assert is_error(*results[0], 503)  # it waited behind the long one past --queue-timeout
        long.close()
        while metric(s.metrics(), "kdt_requests_running") > 0 and time.time() < deadline + 20:
            time.sleep(0.02)
        st, r = s.post("/v1/completions", {"prompt": [4], "max_tokens": 2})
        assert st == 200
    finally:
        assert s.stop() == 0


def test_sigterm_drains_and_exits_0():
    s = Server("--drain-timeout", "30")
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": [9, 8, 7], "max_tokens": 300, "stream": True}),
                 {"Content-Type": "application/json"})
    r = conn.getresponse()
    first = r.readline()
    assert first.startswith(b"data: ")
    s.proc.send_signal(signal.SIGTERM)
    rest = first + r.read()
    events = sse_events(rest.decode())
    assert sum(len(e["choices"][0]["token_ids"]) for e in events) == 300  # finished, not cut
    assert s.proc.wait(60) == 0
    assert any("draining" in line for line in s.log)


# ---- text and chat: a fixture checkpoint with a tokenizer built here ----

def make_text_model(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    fixtures = os.path.join(ROOT, "tests", "fixtures", "model", "tf5")
    if not os.path.isdir(fixtures):
        pytest.skip("no fixture checkpoint")
    d = tmp_path / "textmodel"
    shutil.copytree(fixtures, d)
    vocab = json.load(open(d / "config.json"))["vocab_size"]
    specials = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"]
    # Byte-level BPE (the kind the engine reads) over the few bytes of the training text: the fixture's
    # vocabulary (96) has no room for all 256 bytes.
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials)
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog " * 4, "hello world, how are you today?"], trainer)
    tok.save(str(d / "tokenizer.json"))
    template = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ '<｜User｜>' + m['content'] }}"
                "{% elif m['role'] == 'assistant' %}{{ '<｜Assistant｜>' + m['content'] + '<｜end▁of▁sentence｜>' }}{% endif %}"
                "{% endfor %}{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}")
    json.dump({"bos_token": specials[0], "eos_token": specials[1], "add_bos_token": True, "chat_template": template},
              open(d / "tokenizer_config.json", "w"))
    return d


def test_text_and_chat(tmp_path):
    d = make_text_model(tmp_path)
    s = Server("--model", str(d), "--max-batch", "4")
    try:
        assert not any("no tokenizer" in line for line in s.log), s.log
        r = subprocess.run([BIN, "generate", "--model", str(d), "--backend", "cpu", "--prompt", "hello world", "--max-new", "8"],
                           capture_output=True, text=True, timeout=120)
        st, c = s.post("/v1/completions", {"prompt": "hello world", "max_tokens": 8})
        assert st == 200 and c["usage"]["completion_tokens"] >= 1
        assert r.returncode == 0, r.stderr
        assert c["choices"][0]["text"] == r.stdout.rstrip("\n")
        st, c = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 6})
        assert st == 200 and c["object"] == "chat.completion" and c["choices"][0]["message"]["role"] == "assistant"
        st, c = s.post("/v1/completions", {"prompt": "the quick", "max_tokens": 30, "stop": ["o"]})
        assert st == 200 and "o" not in c["choices"][0]["text"]
    finally:
        assert s.stop() == 0
