"""The target on llama.cpp RPC workers: workers started here on loopback ports,
the target split over them and this machine's CPU, and what a lost worker does."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import sys
import time

import pytest

from edgespec.cli import main
from edgespec.engine.events import GenerationParams
from edgespec.engine.runtime import Engine, ModelSettings
from edgespec.errors import WorkerLostError
from edgespec.llama import rpc
from edgespec.net import Endpoint, Split, parse_endpoints
from edgespec.tui.chat_settings import ChatSettings

needs_rpc = pytest.mark.skipif(not rpc.available(), reason="llama.cpp was built without RPC (scripts/install.sh)")

PROMPT = "The history of the printing press begins"


# -- workers started by the tests ----------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_worker(port: int | None = None) -> tuple[subprocess.Popen, Endpoint]:
    """`edgespec worker` on a loopback port, listening when this returns (or the test fails)."""
    endpoint = Endpoint("127.0.0.1", port or free_port())
    proc = subprocess.Popen([sys.executable, "-m", "edgespec", "worker", "--port", str(endpoint.port),
                             "--threads", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"worker on {endpoint} exited: {proc.stderr.read().decode(errors='replace')}")
        if not rpc.unreachable([endpoint], timeout=0.5):
            return proc, endpoint
        time.sleep(0.2)
    stop(proc)
    pytest.fail(f"worker on {endpoint} did not listen within 60 s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


@pytest.fixture
def two_workers():
    started = []
    try:
        started = [start_worker(), start_worker()]
        yield [endpoint for _, endpoint in started]
    finally:
        for proc, _ in started:
            stop(proc)


def generate(engine, tokens, **kw):
    out, last = [], None
    for last in engine.generate(tokens, GenerationParams(**kw)):
        out += last.tokens
    return out, last.stats


# -- pure ------------------------------------------------------------------------------------

def test_endpoints_parse_as_llama_cpp_takes_them():
    assert parse_endpoints("127.0.0.1:50052, gpu-box:6000") == (Endpoint("127.0.0.1", 50052),
                                                                 Endpoint("gpu-box", 6000))
    for bad, says in [("gpu-box", "HOST:PORT"), ("h:0", "port"), ("h:99999", "port"), ("h:x", "port"),
                      ("h:1,h:1", "twice"), (" , ", "no RPC worker"), ("bad host!:50052", "not a host name")]:
        with pytest.raises(ValueError, match=says):
            parse_endpoints(bad)


@pytest.mark.parametrize("workers", ["[::1]:50052", "::1:50052", "[fe80::1]:6000", "127.0.0.1:50052,[::1]:50053"])
def test_an_ipv6_worker_is_refused_on_the_client_as_llama_cpp_rpc_is_ipv4_only(workers, capsys):
    with pytest.raises(ValueError, match="IPv4 only"):
        parse_endpoints(workers)
    with pytest.raises(SystemExit):
        main(["generate", "hi", "--rpc", workers])
    assert "IPv4 only" in capsys.readouterr().err


@pytest.mark.parametrize("host, says", [("::1", "IPv4 only"), ("[::1]", "IPv4 only"), ("::", "IPv4 only"),
                                        ("my-host.example", "not a host name"), ("bad host!", "not a host name")])
def test_a_worker_listens_only_where_llama_cpp_rpc_can(host, says, capsys):
    """ggml-rpc's server binds an IPv4 literal: an IPv6 address or a host name is
    refused before llama.cpp is started (an IPv6 worker started, and no client could name it)."""
    assert main(["worker", "--host", host, "--allow-remote", "--port", str(free_port())]) == 1
    assert says in capsys.readouterr().err


def test_a_port_out_of_range_is_refused_by_the_parser(capsys):
    for argv in (["worker", "--port", "70000"], ["worker", "--port", "0"], ["serve", "--port", "99999"],
                 ["serve", "--port", "-1"]):
        with pytest.raises(SystemExit):
            main(argv)
        assert "expected" in capsys.readouterr().err


def test_a_worker_on_a_non_loopback_address_needs_allow_remote(capsys):
    assert main(["worker", "--host", "0.0.0.0", "--port", str(free_port())]) == 1
    err = capsys.readouterr().err
    assert "refusing to listen on 0.0.0.0" in err and "no authentication" in err and "--allow-remote" in err


def test_rpc_options_are_checked_before_loading(capsys, synth_target):
    assert main(["generate", "hi", "--target", str(synth_target), "--tensor-split", "1,1"]) == 1
    assert "--tensor-split is about the devices of --rpc" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate", "hi", "--rpc", "nohost"])
    assert "expected HOST:PORT" in capsys.readouterr().err
    for weights in ("inf", "1e400", "1,nan", "-1,2", "0,0"):
        with pytest.raises(SystemExit):
            main(["generate", "hi", "--rpc", "127.0.0.1:50052", f"--tensor-split={weights}"])
        assert "the weights must be finite numbers" in capsys.readouterr().err, weights


def test_the_app_settings_hold_workers_and_reload_when_they_change():
    assert ChatSettings.from_dict({"rpc": "127.0.0.1:50052"}).hardware() != ChatSettings().hardware()
    with pytest.raises(ValueError, match="HOST:PORT"):
        ChatSettings.from_dict({"rpc": "127.0.0.1"})
    assert ChatSettings.from_dict({"rpc": "10.0.0.2:50052"}).to_dict()["rpc"] == "10.0.0.2:50052"


def test_workers_out_of_reach_are_worded_for_one_two_and_many():
    """A busy worker (unanswered on this machine) is told apart from one that is not there,
    and the sentence agrees with how many there are."""
    a, b, c, far = (Endpoint("127.0.0.1", 1), Endpoint("127.0.0.1", 2), Endpoint("127.0.0.1", 3),
                    Endpoint("10.0.0.9", 4))
    silent, refused = "no answer within 3 s", "Connection refused"
    assert rpc.unreachable_message({a: silent}).startswith("the RPC worker at 127.0.0.1:1 is busy (no answer within")
    assert rpc.unreachable_message({a: silent, b: silent}).startswith(
        "the RPC workers at 127.0.0.1:1 and 127.0.0.1:2 are busy (no answer within")
    assert rpc.unreachable_message({a: silent, b: silent, c: silent}).startswith(
        "the RPC workers at 127.0.0.1:1, 127.0.0.1:2 and 127.0.0.1:3 are busy")
    assert rpc.unreachable_message({a: refused}).startswith(
        "cannot reach the RPC worker at 127.0.0.1:1 (Connection refused). Start one there")
    assert rpc.unreachable_message({a: refused, b: refused}).startswith(
        "cannot reach the RPC workers at 127.0.0.1:1 (Connection refused) and 127.0.0.1:2 (Connection refused). "
        "Start one on each")
    mixed = rpc.unreachable_message({a: refused, b: silent})
    assert mixed.startswith("cannot reach the RPC worker at 127.0.0.1:1 (Connection refused). ")
    assert "The RPC worker at 127.0.0.1:2 is busy" in mixed and "127.0.0.1:1 is busy" not in mixed
    assert "may also be busy" in rpc.unreachable_message({far: silent})


@pytest.mark.skipif(not hasattr(socket, "TCP_USER_TIMEOUT"), reason="TCP_USER_TIMEOUT is Linux's")
def test_a_workers_connection_gives_up_on_unacknowledged_data_as_on_silence():
    """Keepalive probes only an idle connection: while an upload waits for its
    acknowledgement none is sent, so a vanished worker would hold the upload for the
    kernel's ~15 minutes of retransmissions. TCP_USER_TIMEOUT bounds that wait."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        endpoint = Endpoint("127.0.0.1", server.getsockname()[1])
        with socket.create_connection((endpoint.host, endpoint.port), timeout=5) as client:  # as ggml-rpc's own
            assert rpc.keep_alive([endpoint]) == {endpoint}
            assert client.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 1000 * rpc.SILENT_S
            assert 0 < rpc.SILENT_S <= 60


# -- real workers ---------------------------------------------------------------------------------

@needs_rpc
@pytest.mark.timeout(60)  # a hang fails here, by name
def test_an_unreachable_worker_is_named_within_seconds(capsys, synth_target):
    port = free_port()
    assert main(["generate", "hi", "--raw", "--target", str(synth_target), "--rpc", f"127.0.0.1:{port}"]) == 1
    err = capsys.readouterr().err
    assert f"cannot reach the RPC worker at 127.0.0.1:{port}" in err and "Traceback" not in err


@needs_rpc
def test_version_says_rpc_is_available(capsys):
    with pytest.raises(SystemExit):
        main(["--version"])
    assert "RPC available" in capsys.readouterr().out


@needs_rpc
@pytest.mark.slow
def test_target_split_over_two_workers_and_the_cpu_decodes_as_on_one_machine(smollm2, two_workers):
    """Plain greedy over the split equals plain greedy here, and every mode
    equals plain over the same split (exact kernels, as on one machine)."""
    settings = dict(n_ctx=512, exact=True)
    with Engine.load(ModelSettings(smollm2, **settings)) as local:
        tokens = local.tokenize(PROMPT, add_bos=True, special=False)
        alone, _ = generate(local, tokens, mode="plain", max_tokens=32)
        n_layer = local.describe().target.n_layer
    split = Split(tuple(two_workers), (1.0, 1.0))
    target = ModelSettings(smollm2, n_gpu_layers=n_layer - 10, rpc=split, **settings)
    with Engine.load(target, ModelSettings(smollm2, n_ctx=512)) as engine:
        info = engine.describe()
        layers = info.target.layers
        assert layers[0].device == "CPU"
        assert [r.worker for r in layers] == [None, str(two_workers[0]), str(two_workers[1])]
        assert sum(r.layers for r in layers) == n_layer + 1  # the output layer counts as one
        assert info.workers == tuple(str(e) for e in two_workers)
        assert info.draft.layers[0].worker is None  # the draft stays here
        plain, _ = generate(engine, tokens, mode="plain", max_tokens=32)
        assert plain == alone
        for mode in ("draft", "lookup", "auto"):
            assert generate(engine, tokens, mode=mode, k=4, max_tokens=32)[0] == plain, mode


@needs_rpc
@pytest.mark.slow
def test_the_output_layer_can_stay_here_so_that_logits_do_not_cross_the_network(smollm2):
    proc, endpoint = start_worker()
    try:
        # the same attention kernels both ways (by default only an all-CPU model runs without flash attention)
        with Engine.load(ModelSettings(smollm2, n_ctx=512, flash_attn=True)) as local:
            tokens = local.tokenize(PROMPT, add_bos=True, special=False)
            alone, _ = generate(local, tokens, mode="plain", max_tokens=16)
        target = ModelSettings(smollm2, n_ctx=512, n_gpu_layers=-1, rpc=Split((endpoint,), local_output=True),
                               flash_attn=True)
        with Engine.load(target) as engine:
            layers = engine.describe().target.layers
            assert [(r.worker, r.layers) for r in layers] == [(str(endpoint), 30), (None, 1)]
            assert generate(engine, tokens, mode="plain", max_tokens=16)[0] == alone
    finally:
        stop(proc)


@needs_rpc
@pytest.mark.slow
def test_a_call_that_runs_long_on_a_healthy_worker_is_not_taken_for_a_lost_one(smollm2):
    """A worker serves one client at a time: a second connection to it (a liveness
    probe) is never accepted, so probing that way took a busy worker for a dead one
    a few seconds into any long call. The connection in use is watched instead."""
    proc, endpoint = start_worker()
    try:
        target = ModelSettings(smollm2, n_ctx=512, n_gpu_layers=-1, rpc=Split((endpoint,)))
        with Engine.load(target) as engine:
            guard = engine.target_model.guard
            start = time.monotonic()
            guard.call(time.sleep, 12)  # the worker holds our connection, and its backlog is full
            assert time.monotonic() - start >= 12 and guard.lost is None
            tokens = engine.tokenize(PROMPT, add_bos=True, special=False)
            assert len(generate(engine, tokens, mode="plain", max_tokens=4)[0]) == 4
            # the connection in use is watched by TCP keepalive (a vanished machine sends no reset)
            assert rpc.keep_alive([endpoint]) == {endpoint}
    finally:
        stop(proc)


@needs_rpc
@pytest.mark.parametrize("others", [1, 3])  # one client being served; and one served plus its full backlog
def test_a_worker_busy_with_another_client_is_said_to_be_busy_not_lost(synth_target, others):
    """In a process of its own: a handshake the worker never answers leaves
    llama.cpp waiting on it for good, and RPC in that process with it."""
    proc, endpoint = start_worker()
    held = [socket.create_connection((endpoint.host, endpoint.port), timeout=5) for _ in range(others)]
    try:
        run = subprocess.run([sys.executable, "-m", "edgespec", "generate", "hi", "--raw", "--target",
                              str(synth_target), "--rpc", str(endpoint)], capture_output=True, text=True, timeout=120)
        assert run.returncode == 1
        assert "serves one client at a time" in run.stderr and "lost" not in run.stderr, run.stderr
        assert "Traceback" not in run.stderr, run.stderr
    finally:
        for connection in held:
            connection.close()
        stop(proc)


def _read(sock: socket.socket, n: int) -> bytes:
    """`n` bytes from `sock`, or fewer if it closes first."""
    data = b""
    while len(data) < n and (more := sock.recv(n - len(data))):
        data += more
    return data


def _impostor(kind: str, worker: Endpoint | None = None) -> tuple[Endpoint, threading.Event]:
    """A loopback port that takes connections but is no RPC worker of this llama.cpp: an HTTP
    server ("http"), a port that closes each connection at once ("close"), one that answers
    bytes of no protocol ("garbage"), or ("version") a proxy to the real `worker` that gives
    the handshake's reply another protocol major version. Set the event returned to end it."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    done = threading.Event()

    def answer(client: socket.socket) -> None:
        client.settimeout(10)
        with client:
            if kind == "close":
                return
            if kind == "version":  # request: command (1 byte), size (8), body; reply: size (8), body
                head = _read(client, 9)
                if len(head) < 9:
                    return
                request = head + _read(client, int.from_bytes(head[1:], "little"))
                with socket.create_connection((worker.host, worker.port), timeout=10) as upstream:
                    upstream.sendall(request)
                    size = _read(upstream, 8)
                    reply = _read(upstream, int.from_bytes(size, "little"))  # major, minor, patch, ...
                client.sendall(size + bytes([reply[0] + 1]) + reply[1:])
                return
            if not client.recv(65536):
                return
            client.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                           if kind == "http" else bytes(range(256)) * 4)

    def serve() -> None:
        with server:
            while not done.is_set():
                try:
                    client, _ = server.accept()
                except socket.timeout:
                    continue
                threading.Thread(target=answer, args=(client,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return Endpoint("127.0.0.1", server.getsockname()[1]), done


@needs_rpc
@pytest.mark.parametrize("kind", ["http", "close", "garbage", "version"])
@pytest.mark.timeout(180)
def test_a_port_that_is_no_rpc_worker_is_said_to_be_one_not_a_lost_worker(synth_target, kind):
    """In a process of its own: a failed handshake leaves llama.cpp's RPC stuck in that
    process. A second load there is told so at once, not left to time out as busy."""
    proc = None
    if kind == "version":
        proc, worker = start_worker()
    impostor, done = _impostor(kind, worker if proc else None)
    script = ("import sys\n"
              "from edgespec.errors import WorkerUnreachableError\n"
              "from edgespec.llama import rpc\n"
              "from edgespec.net import Endpoint\n"
              "for port in sys.argv[1:]:\n"
              "    try:\n"
              "        rpc.add_servers([Endpoint('127.0.0.1', int(port))])\n"
              "    except WorkerUnreachableError as e:\n"
              "        print(e)\n")
    try:
        run = subprocess.run([sys.executable, "-m", "edgespec", "generate", "hi", "--raw", "--target",
                              str(synth_target), "--rpc", str(impostor)], capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
        assert f"at {impostor}" in run.stderr and "lost" not in run.stderr, run.stderr
        says = "speaks another version of llama.cpp's RPC" if kind == "version" else "is not a llama.cpp RPC worker"
        assert says in run.stderr, run.stderr
        started = time.monotonic()
        again = subprocess.run([sys.executable, "-c", script, str(impostor.port), str(free_port())],
                               capture_output=True, text=True, timeout=120)
        first, second = again.stdout.splitlines()[:2]
        assert says in first and "restart edgespec" in second, again.stdout + again.stderr
        assert time.monotonic() - started < rpc.HELLO_TIMEOUT_S, "the second load waited for the stuck one"
    finally:
        done.set()
        if proc is not None:
            stop(proc)


@needs_rpc
@pytest.mark.slow
@pytest.mark.timeout(120)  # a loss that is never noticed fails here, by name
def test_a_worker_killed_mid_reply_is_an_error_the_reply_so_far_kept_and_a_reload_works(smollm2):
    """ggml-rpc ends the process on a broken connection; the engine turns that
    into WorkerLostError naming the worker, and loads again once it is back
    (the surviving worker's connection is reused: it serves one client at a time)."""
    (keep, kept), (proc, endpoint) = start_worker(), start_worker()
    try:
        target = ModelSettings(smollm2, n_ctx=512, n_gpu_layers=20, rpc=Split((kept, endpoint)))
        engine = Engine.load(target)
        tokens = engine.tokenize(PROMPT, add_bos=True, special=False)
        got = []
        with pytest.raises(WorkerLostError, match=f"lost the RPC worker at {endpoint} "):
            for chunk in engine.generate(tokens, GenerationParams(mode="plain", max_tokens=400)):
                got += chunk.tokens
                if len(got) >= 4 and proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
        assert 4 <= len(got) < 400  # what came before the loss stays with the caller
        with pytest.raises(WorkerLostError):  # the engine stays unusable, and says so at once
            generate(engine, tokens, mode="plain", max_tokens=4)
        engine.close()  # abandons the target's native objects instead of waiting on the lost worker
        proc.wait(10)

        proc, _ = start_worker(endpoint.port)
        with Engine.load(target) as again:
            out, _ = generate(again, tokens, mode="plain", max_tokens=8)
            assert len(out) == 8
            assert [r.worker for r in again.describe().target.layers][1:] == [str(kept), str(endpoint)]
    finally:
        stop(proc)
        stop(keep)


@needs_rpc
@pytest.mark.slow
def test_a_chat_keeps_the_partial_reply_of_a_lost_worker(smollm2):
    """What the app shows and stores: the reply so far, marked interrupted."""
    from edgespec.chat import ChatSession, ConversationStore

    proc, endpoint = start_worker()
    try:
        store = ConversationStore(":memory:")
        target = ModelSettings(smollm2, n_ctx=512, n_gpu_layers=-1, rpc=Split((endpoint,)))
        with Engine.load(target) as engine:
            session = ChatSession(engine, store=store, params=GenerationParams(mode="auto", max_tokens=400))
            shown = ""
            with pytest.raises(WorkerLostError, match=str(endpoint)):
                for chunk in session.send("Tell me a long story about a lighthouse keeper."):
                    shown += chunk.text
                    if len(shown) > 20 and proc.poll() is None:
                        proc.kill()
            reply = store.messages(session.conversation_id)[-1]
            assert reply.role == "assistant" and reply.status == "interrupted"
            assert reply.content == shown and len(shown) > 20
    finally:
        stop(proc)


@needs_rpc
@pytest.mark.slow
def test_the_cli_reports_a_lost_worker_and_keeps_the_partial_reply(smollm2):
    proc, endpoint = start_worker()
    cli = None
    try:
        cli = subprocess.Popen([sys.executable, "-m", "edgespec", "generate", "--raw", PROMPT, "--target",
                                str(smollm2), "--rpc", str(endpoint), "--mode", "plain", "--max-tokens", "400",
                                "--ctx", "512"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
        first = cli.stdout.read(20)  # the reply has begun
        proc.kill()
        rest, err = cli.communicate(timeout=60)
        assert cli.returncode == 1, err
        err = err.decode(errors="replace")
        assert f"lost the RPC worker at {endpoint}" in err and "Traceback" not in err
        assert len(first + rest) >= 20
    finally:
        if cli is not None and cli.poll() is None:
            cli.kill()
        stop(proc)



@needs_rpc
@pytest.mark.slow
async def test_the_app_survives_a_lost_worker_and_reloads_once_it_is_back(smollm2, home, tmp_path):
    """The chat app: where the layers are on the status line; a worker killed
    mid-reply leaves the reply so far and an error, the app running; reloading
    works once the worker is back."""
    from edgespec.chat.store import ConversationStore
    from tests.app_helpers import boxes, make_app, send, wait_for

    def load(choice, settings, progress=None):
        split = settings.load.rpc
        return Engine.load(ModelSettings(smollm2, n_ctx=512, n_threads=1, n_gpu_layers=-1, rpc=split))

    proc, endpoint = start_worker()
    try:
        with ConversationStore(tmp_path / "chats.db") as store:
            defaults = ChatSettings.from_dict({"rpc": str(endpoint), "mode": "plain", "max_tokens": 400})
            app = make_app(store, load=load, defaults=defaults)
            async with app.run_test(size=(110, 36)) as pilot:
                await wait_for(pilot, lambda: app.model_state == "ready", timeout=60)
                assert f"@{endpoint} 31" in app.model_label  # all 30 layers + the output
                await send(pilot, "Tell me a long story about a lighthouse keeper.", key=False)
                await wait_for(pilot, lambda: len(boxes(app)) == 2 and len(boxes(app)[1].content) > 20, timeout=60)
                proc.kill()
                await wait_for(pilot, lambda: not app.chat.generating, timeout=30)
                reply = boxes(app)[1]
                assert reply.status in ("interrupted", "error") and len(reply.content) > 20
                assert store.messages(app.chat.conversation_id)[-1].content == reply.content
                proc.wait(10)

                proc, _ = start_worker(endpoint.port)
                app.load_models(app.choice)
                await wait_for(pilot, lambda: app.model_state == "ready", timeout=60)
                await send(pilot, "Hello again", key=False)
                await wait_for(pilot, lambda: len(boxes(app)) == 4 and not app.chat.generating, timeout=120)
                assert boxes(app)[3].status in ("done", "stopped") and boxes(app)[3].content
    finally:
        stop(proc)


@needs_rpc
@pytest.mark.slow
def test_the_server_answers_a_lost_worker_with_503_and_loads_again_once_it_is_back(smollm2):
    """`edgespec serve` over a worker killed mid-stream: the stream ends with an
    error naming it, the server keeps running, and once the worker is back the
    next request loads the model again and is answered."""
    openai = pytest.importorskip("openai", reason="needs the test extra: pip install 'edgespec[test]'")
    pytest.importorskip("fastapi", reason="needs the serve extra: pip install 'edgespec[serve]'")
    from edgespec.server import ServerSettings, create_app
    from tests.server_helpers import ServerThread, http

    proc, endpoint = start_worker()
    split = Split((endpoint,))
    served = ServerThread(create_app(
        lambda: Engine.load(ModelSettings(smollm2, n_ctx=512, n_threads=1, n_gpu_layers=-1, rpc=split)),
        ServerSettings(model_id="smollm2")))
    try:
        served.wait_ready(60)
        client = openai.OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0, timeout=60)
        stream = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=400, stream=True)
        with pytest.raises(openai.APIError, match=f"lost the RPC worker at {endpoint}"):
            for i, _ in enumerate(stream):
                if i == 3:
                    proc.kill()
        proc.wait(10)
        status, body = http("GET", served.url + "/health", key=None)
        assert status == 503 and body["error"]["code"] == "worker_lost"

        proc, _ = start_worker(endpoint.port)
        reply = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=8)
        assert reply.usage.completion_tokens == 8
        assert http("GET", served.url + "/health", key=None)[0] == 200
    finally:
        served.stop()
        stop(proc)


def _stalling_proxy(target: Endpoint, after_bytes: int) -> tuple[Endpoint, threading.Event]:
    """A loopback proxy to `target` that stops passing the client's bytes on after
    `after_bytes` (a worker hung mid-upload: stopped, or its machine stuck), keeping the
    connection open; set the event returned to end it."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    done = threading.Event()

    def pump(source, sink, limit):
        sent = 0
        try:
            while not done.is_set():
                data = source.recv(65536)
                if not data:
                    return
                sent += len(data)
                if limit and sent > limit:
                    done.wait(120)
                    return
                sink.sendall(data)
        except OSError:
            pass

    def serve():
        while not done.is_set():
            try:
                client, _ = server.accept()
            except socket.timeout:
                continue
            upstream = socket.create_connection((target.host, target.port))
            threading.Thread(target=pump, args=(client, upstream, after_bytes), daemon=True).start()
            threading.Thread(target=pump, args=(upstream, client, 0), daemon=True).start()
        server.close()

    threading.Thread(target=serve, daemon=True).start()
    return Endpoint("127.0.0.1", server.getsockname()[1]), done


@needs_rpc
def test_ctrl_c_ends_a_load_whose_worker_stopped_answering(qwen_pair):  # noqa: F811
    """A load over RPC runs on the guard's thread while this one waits in Python: Ctrl+C
    is raised there, not noted for llama.cpp's progress report (as a local load's is, so
    that its callbacks do not drop it), which a worker that stopped answering mid-upload
    may never let come. (Reported hanging; here the report came and the load stopped.)"""
    import signal

    _, _, model = qwen_pair  # tensors of tens of MB: the upload blocks inside one, not between two
    proc, endpoint = start_worker()
    proxy, done = _stalling_proxy(endpoint, after_bytes=50 << 20)
    cli = None
    try:
        cli = subprocess.Popen([sys.executable, "-m", "edgespec", "generate", "--raw", PROMPT, "--target",
                                str(model), "--rpc", str(proxy), "--max-tokens", "4", "--ctx", "512",
                                "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        time.sleep(6)  # connected, and the upload of the weights stalled
        assert cli.poll() is None, cli.communicate()[1]
        cli.send_signal(signal.SIGINT)
        _, err = cli.communicate(timeout=20)
        assert cli.returncode == 130, err
        assert b"Traceback" not in err
    finally:
        done.set()
        if cli is not None and cli.poll() is None:
            cli.kill()
        stop(proc)


@needs_rpc
def test_one_ctrl_c_ends_a_reply_whose_worker_stopped_answering(smollm2):
    """A worker stopped (SIGSTOP: not gone, not answering) mid-reply: the first Ctrl+C left
    the decode waiting on the guard's thread, and the cleanup that followed queued its own
    calls behind it, deaf to the next Ctrl+C; three were needed. One now ends the command,
    the worker named as no longer answering."""
    import signal

    proc, endpoint = start_worker()
    cli = None
    try:
        cli = subprocess.Popen([sys.executable, "-m", "edgespec", "generate", "--raw", PROMPT, "--target",
                                str(smollm2), "--rpc", str(endpoint), "--mode", "plain", "--max-tokens", "400",
                                "--ctx", "512", "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"},
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        cli.stdout.read(20)  # the reply has begun
        proc.send_signal(signal.SIGSTOP)
        time.sleep(1.0)
        cli.send_signal(signal.SIGINT)
        _, err = cli.communicate(timeout=30)
        assert cli.returncode in (1, 130), err
        assert b"Traceback" not in err
    finally:
        if cli is not None and cli.poll() is None:
            cli.kill()
        proc.send_signal(signal.SIGCONT)
        stop(proc)


def test_a_call_sigterm_leaves_running_does_not_hold_up_the_next_one(monkeypatch):
    """SIGTERM ends a command as Ctrl+C does (Terminated): the call it left running on the
    guard's thread is waited for only STUCK_WAIT_S by the next (the engine's close), and a
    worker that never answers is lost, as after Ctrl+C, instead of a close that hangs."""
    from edgespec.errors import Terminated

    monkeypatch.setattr(rpc, "_install_abort_callback", lambda: None)  # no worker: the guard's calls are Python's
    monkeypatch.setattr(rpc, "STUCK_WAIT_S", 0.1)
    guard = rpc.Guard([Endpoint("127.0.0.1", 1)])
    stuck = threading.Event()

    def terminated(signum, frame):
        raise Terminated(signum)

    previous = signal.signal(signal.SIGUSR1, terminated)
    try:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        with pytest.raises(Terminated):
            guard.call(stuck.wait, 30)
        with pytest.raises(WorkerLostError, match="did not return"):
            guard.call(lambda: 1, timeout=5)
    finally:
        signal.signal(signal.SIGUSR1, previous)
        stuck.set()
