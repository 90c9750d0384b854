"""The tandem client: the semantics of the C++ library (client/include/tandem/client.h).

One Client per scheduler endpoint owns a ZeroMQ DEALER and an I/O thread, the only thread that
touches the socket. Public calls from any thread reach it through a command queue and a wake-up
pipe (the gate), until the client closes; from then on they are refused with the reason.

Contract: every request generate() accepted ends with exactly one FinalEvent, last, even when the
scheduler is gone or silent, the connection is lost, or the client is closed first (then the
final event carries error UNAVAILABLE and a message naming the cause).
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import os
import queue
import secrets
import threading
import time
from typing import Any, Callable, Iterable, Optional, Sequence, Union

import zmq
from zmq.utils.monitor import recv_monitor_message

from ._wire import client_pb2, common_pb2
from .prometheus import prometheus_text

PROTOCOL_VERSION = common_pb2.PROTOCOL_VERSION_CURRENT
MAX_REQUEST_ID_BYTES = 256  # runtime/wire.h kMaxRequestIdBytes
MAX_PRINCIPAL_BYTES = 128  # runtime/wire.h kMaxPrincipalBytes
MAX_PROMPT_BYTES = 1 << 20  # kMaxPromptBytes
RECEIVE_LIMIT_BYTES = 64 << 20  # kClientReceiveLimitBytes
NEVER = 100 * 365 * 24 * 3600.0  # seconds: durations past a century mean "never"

_CODES = {
    common_pb2.ERROR_CODE_INVALID_ARGUMENT: "INVALID_ARGUMENT",
    common_pb2.ERROR_CODE_OVERLOADED: "OVERLOADED",
    common_pb2.ERROR_CODE_UNAVAILABLE: "UNAVAILABLE",
    common_pb2.ERROR_CODE_MODEL_FILE: "MODEL_FILE",
    common_pb2.ERROR_CODE_PERMISSION_DENIED: "PERMISSION_DENIED",
}
_REASONS = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_CANCELLED: "cancelled",
    common_pb2.FINISH_REASON_ERROR: "error",
}


class TandemError(Exception):
    """A call that failed: `code` as the C++ library names it (INVALID_ARGUMENT, OVERLOADED,
    UNAVAILABLE, INTERNAL, MODEL_FILE, PERMISSION_DENIED) and the message."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclasses.dataclass
class TokenEvent:
    id: int
    text: str  # whole UTF-8 characters; may be empty while a character is split
    logprob: float = 0.0
    top: list = dataclasses.field(default_factory=list)  # [(token id, logprob)], best first
    final = False


@dataclasses.dataclass
class FinalEvent:
    reason: str  # "stop", "length", "cancelled" or "error"
    error_code: str = ""  # set when reason == "error", e.g. "INVALID_ARGUMENT"
    error_message: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    queue_ms: float = 0.0
    ttft_ms: float = 0.0
    total_ms: float = 0.0
    text: str = ""  # bytes held back until the end (an incomplete character, a partial stop string)
    final = True


Event = Union[TokenEvent, FinalEvent]


def _final_error(code: str, message: str) -> FinalEvent:
    return FinalEvent(reason="error", error_code=code, error_message=message)


def _code(wire_code: int) -> str:
    return _CODES.get(wire_code, "INTERNAL")


def _token_event(t) -> TokenEvent:
    return TokenEvent(t.id, t.text.decode("utf-8", "replace"), t.logprob, [(x.id, x.logprob) for x in t.top])


def _final_event(f) -> FinalEvent:
    reason = _REASONS.get(f.finish_reason, "error")
    e = FinalEvent(reason=reason, error_message=f.error_message)
    if reason == "error":
        e.error_code = _code(f.error_code)
        if f.finish_reason != common_pb2.FINISH_REASON_ERROR and not e.error_message:
            e.error_message = "scheduler sent a final event without a finish reason"
    e.prompt_tokens, e.completion_tokens = f.usage.prompt_tokens, f.usage.completion_tokens
    e.cached_prompt_tokens = f.usage.cached_prompt_tokens
    e.queue_ms, e.ttft_ms, e.total_ms = f.timings.queue_ms, f.timings.ttft_ms, f.timings.total_ms
    e.text = f.text.decode("utf-8", "replace")
    return e


def _as_dict(m) -> dict:
    """A message's fields by their proto names (repeated messages as lists of dicts)."""
    out = {}
    for f in m.DESCRIPTOR.fields:
        v = getattr(m, f.name)
        if f.message_type is not None:
            v = [_as_dict(x) for x in v] if f.label == f.LABEL_REPEATED else _as_dict(v)
        elif f.label == f.LABEL_REPEATED:
            v = list(v)
        out[f.name] = v
    return out


class Stream:
    """The events of one request: iterate it (token events, then the final event, last and
    exactly once), or take them one by one with next(timeout). Thread-safe; stays valid (and
    ends) after its Client is closed."""

    def __init__(self, request_id: str, client: "Client"):
        self.id = request_id
        self._client = client
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._final_taken = False

    def _push(self, event: Event) -> None:
        self._events.put(event)

    def __iter__(self):
        return self

    def __next__(self) -> Event:
        event = self.next()
        if event is None:
            raise StopIteration
        return event

    def next(self, timeout: Optional[float] = None) -> Optional[Event]:
        """The next event; None when none came within `timeout` seconds (None: wait for it) or
        the final event was taken already."""
        if self._final_taken:
            return None
        try:
            event = self._events.get(timeout=None if timeout is None else min(max(timeout, 0.0), NEVER))
        except queue.Empty:
            return None
        if event.final:
            self._final_taken = True
        return event

    def cancel(self) -> None:
        """Asks the scheduler to cancel; the stream still ends with its final event (cancelled,
        or the reason it had already finished with). No effect once finished."""
        if not self._final_taken:
            self._client._post(lambda io: io.cancel(self.id))

    @property
    def finished(self) -> bool:
        return self._final_taken


def _chat(messages: Sequence[dict], tools: Any, add_generation_prompt: bool, out) -> None:
    for m in messages:
        w = out.messages.add()
        w.role = m.get("role", "")
        if m.get("content") is not None:
            w.content = m["content"]
        w.name = m.get("name") or ""
        w.tool_call_id = m.get("tool_call_id") or ""
        calls = m.get("tool_calls")
        w.tool_calls_json = calls if isinstance(calls, str) else (json.dumps(calls) if calls else "")
    out.tools_json = tools if isinstance(tools, str) else (json.dumps(tools) if tools else "")
    out.no_generation_prompt = not add_generation_prompt


def _prompt_bytes(prompt, messages, tools) -> int:
    if messages:
        n = len(tools.encode()) if isinstance(tools, str) else len(json.dumps(tools)) if tools else 0
        for m in messages:
            for k in ("role", "content", "name", "tool_call_id", "tool_calls"):
                v = m.get(k)
                n += len(v.encode()) if isinstance(v, str) else len(json.dumps(v)) if v else 0
        return n
    return len(prompt.encode()) if isinstance(prompt, str) else 0


class Client:
    """A connection to a tandem scheduler's client endpoint (ZeroMQ connects lazily: a scheduler
    not up yet is not an error here). Durations are in seconds.

    heartbeat_interval: while requests are in flight a heartbeat goes out this often.
    request_timeout: default timeout of status(), tokenize(), count_tokens(), metrics_text().
    deadline_grace: a request with a timeout that has no final event this long past its deadline
      ends with UNAVAILABLE.
    liveness_timeout: while requests are in flight and the scheduler sent nothing for this long,
      it is probed (a status query); with no answer within twice this, every request in flight
      ends with UNAVAILABLE. 0: off.
    curve_server_key: the scheduler's CurveZMQ public key (Z85, the text of server.pub) when it
      runs with --curve-keys; curve_public_key / curve_secret_key: this client's own pair (the
      text of `tandem keys --name NAME`'s files) when the scheduler lists clients; else a fresh
      pair per connection.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        heartbeat_interval: float = 0.5,
        request_timeout: float = 5.0,
        deadline_grace: float = 1.0,
        liveness_timeout: float = 5.0,
        curve_server_key: str = "",
        curve_public_key: str = "",
        curve_secret_key: str = "",
    ):
        if not endpoint:
            raise TandemError("INVALID_ARGUMENT", "client: an endpoint is required")
        if heartbeat_interval <= 0 or request_timeout <= 0:
            raise TandemError("INVALID_ARGUMENT", "client: heartbeat interval and request timeout must be positive")
        if deadline_grace < 0 or liveness_timeout < 0:
            raise TandemError("INVALID_ARGUMENT", "client: deadline grace and liveness timeout must not be negative")
        self.endpoint = endpoint
        self.request_timeout = min(request_timeout, NEVER)
        self._prefix = f"p{secrets.randbits(64):016x}-"
        self._counter = 0
        self._lock = threading.Lock()  # the gate: _closed and the command queue's admission
        self._closed: Optional[str] = None
        self._commands: collections.deque = collections.deque()
        self._context = zmq.Context()
        try:
            socket = _dealer(self._context, endpoint, curve_server_key, curve_public_key, curve_secret_key)
        except (zmq.ZMQError, ValueError) as e:
            self._context.term()
            raise TandemError("INVALID_ARGUMENT", f"client: {endpoint}: {e}") from None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._io = _Loop(self, socket, heartbeat_interval, deadline_grace, liveness_timeout)
        self._thread = threading.Thread(target=self._io.run, name="tandem-client", daemon=True)
        self._thread.start()

    # ---- any thread ----

    def generate(
        self,
        prompt: Union[str, Sequence[int], None] = None,
        *,
        messages: Optional[Sequence[dict]] = None,
        tools: Any = None,
        add_generation_prompt: bool = True,
        no_bos: bool = False,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        seed: int = 0,
        top_logprobs: int = 0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        logit_bias: Optional[dict] = None,
        max_tokens: int = 16,
        stop: Iterable[str] = (),
        stop_token_sequences: Iterable[Sequence[int]] = (),
        include_stop_string: bool = False,
        ignore_eos: bool = False,
        logprobs: bool = False,
        priority: int = 0,
        principal: str = "",
        timeout: Optional[float] = None,
        stream: bool = True,
        id: Optional[str] = None,
        spec_tokens: Optional[int] = None,
    ) -> Stream:
        """Submits a request; its events arrive on the returned Stream. The prompt is token ids
        (a sequence of ints), text (a str, tokenized by the scheduler, BOS added unless no_bos),
        or `messages` (dicts with role, content, name, tool_call_id, tool_calls; rendered with the
        model's chat template, `tools` a JSON array or its text). Sampling defaults are greedy;
        presence_penalty / frequency_penalty ([-2, 2]) count the tokens generated so far, not the
        prompt; logit_bias maps token ids (int or str, as OpenAI) to biases in [-100, 100].
        A request the library refuses (a duplicate live id, a closed client, over the wire's
        limits) gets its final error event at once. `timeout`: seconds from arrival at the
        scheduler (None: no deadline). `principal`: whom a proxy sends the request for (the
        scheduler's per-client limits count per principal; with --client-keys only a `proxy`
        key may set it). `spec_tokens`: on workers that speculate, at most this many drafts a
        round (0: this request does not speculate; None: the workers' --spec-tokens)."""
        if isinstance(prompt, (bytes, bytearray)):
            raise TypeError("prompt: text (str) or token ids (a sequence of int), not bytes")
        request_id = id if id is not None else self._next_id()
        s = Stream(request_id, self)
        m = client_pb2.ClientMessage(version=PROTOCOL_VERSION)
        sub = m.submit
        sub.request_id = request_id
        if messages:
            _chat(messages, tools, add_generation_prompt, sub.chat)
        elif isinstance(prompt, str):
            sub.text = prompt
        elif prompt is not None:
            sub.tokens.ids.extend(int(t) for t in prompt)
        else:
            sub.text = ""
        sub.no_bos = no_bos
        sp = sub.sampling
        sp.temperature, sp.top_k, sp.top_p, sp.min_p = temperature, top_k, top_p, min_p
        sp.repetition_penalty, sp.seed, sp.top_logprobs = repetition_penalty, seed, top_logprobs
        sp.presence_penalty, sp.frequency_penalty = presence_penalty, frequency_penalty
        for token, bias in (logit_bias or {}).items():
            sp.logit_bias.add(token=int(token), bias=float(bias))
        sub.max_tokens = max_tokens
        for seq in stop_token_sequences:
            sub.stop_token_sequences.add().ids.extend(int(t) for t in seq)
        sub.stop_strings.extend(stop)
        sub.include_stop_string, sub.ignore_eos, sub.logprobs = include_stop_string, ignore_eos, logprobs
        sub.stream, sub.priority, sub.principal = stream, priority, principal
        timeout_ms = 0 if timeout is None else int(round(timeout * 1000))
        if not 0 <= timeout_ms < 2**32:
            s._push(_final_error("INVALID_ARGUMENT", "timeout must be in [0, 2^32) ms"))
            return s
        sub.timeout_ms = timeout_ms
        if spec_tokens is not None:
            sub.spec_tokens = spec_tokens
        too_large = self._over_limits(request_id, principal, prompt, messages, tools)
        if too_large:
            s._push(_final_error("INVALID_ARGUMENT", too_large))
            return s
        wire = m.SerializeToString()
        due = time.monotonic() + timeout + self._io.deadline_grace if timeout else None
        if not self._post(lambda io: io.submit(request_id, wire, due, s._push)):
            s._push(_final_error("UNAVAILABLE", self._why_closed()))
        return s

    def cancel(self, request_id: str) -> None:
        """Asks the scheduler to cancel request `request_id`; its final event follows. Unknown
        ids are ignored. Raises TandemError UNAVAILABLE once the client is closed."""
        if not request_id:
            raise TandemError("INVALID_ARGUMENT", "cancel: empty request id")
        if not self._post(lambda io: io.cancel(request_id)):
            raise TandemError("UNAVAILABLE", self._why_closed())

    def status(self, timeout: Optional[float] = None) -> dict:
        """The scheduler's state: tandem.v1.StatusReply's fields by name (workers: a list of
        dicts of WorkerStatus). Raises TandemError UNAVAILABLE when no reply comes in time."""
        return self._query("status", lambda qid: _message(status=client_pb2.StatusQuery(query_id=qid)), timeout)

    def tokenize(
        self, text: str = "", *, messages=None, tools=None, add_generation_prompt=True, no_bos=False, timeout=None
    ) -> list:
        """The prompt ids the scheduler would make of this text or conversation."""
        return self._tokenize(text, messages, tools, add_generation_prompt, no_bos, False, timeout)[0]

    def count_tokens(
        self, text: str = "", *, messages=None, tools=None, add_generation_prompt=True, no_bos=False, timeout=None
    ) -> int:
        """How many ids tokenize() would return (the ids themselves are not sent)."""
        return self._tokenize(text, messages, tools, add_generation_prompt, no_bos, True, timeout)[1]

    def metrics_text(self, timeout: Optional[float] = None) -> str:
        """The scheduler's metrics in Prometheus' text format (what `tandem status --prometheus`
        prints and a /metrics endpoint serves)."""
        return self._query("metrics", lambda qid: _message(metrics=client_pb2.MetricsQuery(query_id=qid)), timeout)

    def close(self) -> None:
        """Cancels the requests still in flight (their final events: UNAVAILABLE, "client
        closed"), closes the socket and joins the I/O thread. Idempotent."""
        with self._lock:
            if self._closed is None:
                self._closed = "client closed"
            self._wake()
        if threading.current_thread() is self._thread:
            return
        self._thread.join()
        with self._lock:  # no one writes to the pipe any more: the gate is closed
            for fd in (self._wake_r, self._wake_w):
                if fd >= 0:
                    os.close(fd)
            self._wake_r = self._wake_w = -1

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- internals ----

    def _next_id(self) -> str:
        with self._lock:
            self._counter += 1
            return self._prefix + str(self._counter)

    @staticmethod
    def _over_limits(request_id, principal, prompt, messages, tools) -> str:
        n = len(request_id.encode())
        if n > MAX_REQUEST_ID_BYTES:
            return f"request_id: {n} bytes, at most {MAX_REQUEST_ID_BYTES}"
        n = len(principal.encode())
        if n > MAX_PRINCIPAL_BYTES:
            return f"principal: {n} bytes, at most {MAX_PRINCIPAL_BYTES}"
        n = _prompt_bytes(prompt, messages, tools)
        if n > MAX_PROMPT_BYTES:
            what = "messages: conversation of " if messages else "prompt: text of "
            return f"{what}{n} bytes, at most {MAX_PROMPT_BYTES}"
        return ""

    def _tokenize(self, text, messages, tools, add_generation_prompt, no_bos, count_only, timeout):
        def message(qid):
            q = client_pb2.TokenizeQuery(query_id=qid, no_bos=no_bos, count_only=count_only)
            if messages:
                _chat(messages, tools, add_generation_prompt, q.chat)
            else:
                q.text = text
            return _message(tokenize=q)

        return self._query("tokenize", message, timeout)

    def _query(self, what: str, message: Callable[[int], bytes], timeout: Optional[float]):
        if threading.current_thread() is self._thread:
            raise TandemError("INTERNAL", f"{what} called from the client's I/O thread")
        timeout = self.request_timeout if timeout is None else timeout
        if timeout <= 0:
            raise TandemError("INVALID_ARGUMENT", f"{what}: timeout must be positive")
        timeout = min(timeout, NEVER)
        future: concurrent.futures.Future = concurrent.futures.Future()
        due = time.monotonic() + timeout
        if not self._post(lambda io: io.query(what, message, due, future)):
            raise TandemError("UNAVAILABLE", self._why_closed())
        try:
            return future.result(timeout + 1.0)
        except concurrent.futures.TimeoutError:
            raise TandemError("UNAVAILABLE", f"{what}: no reply from the client's I/O thread") from None

    def _post(self, fn: Callable[["_Loop"], None]) -> bool:
        with self._lock:
            if self._closed is not None:
                return False
            self._commands.append(fn)
            self._wake()
        return True

    def _wake(self) -> None:
        """Wakes the I/O thread; with the lock held (close() closes the pipe under it)."""
        try:
            if self._wake_w >= 0:
                os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # the pipe is full: the loop wakes anyway

    def _close_gate(self, why: str) -> bool:
        with self._lock:
            if self._closed is not None:
                return False
            self._closed = why
            return True

    def _why_closed(self) -> str:
        with self._lock:
            return self._closed or ""


def _message(**body) -> bytes:
    return client_pb2.ClientMessage(version=PROTOCOL_VERSION, **body).SerializeToString()


def _dealer(context, endpoint, server_key, public_key, secret_key):
    """A DEALER with the runtime's socket options (runtime/event_loop.h SocketLimits), connected."""
    s = context.socket(zmq.DEALER)
    for option, value in (
        (zmq.LINGER, 200),
        (zmq.SNDHWM, 100000),
        (zmq.RCVHWM, 100000),
        (zmq.MAXMSGSIZE, RECEIVE_LIMIT_BYTES),
        (zmq.HEARTBEAT_IVL, 1000),
        (zmq.HEARTBEAT_TIMEOUT, 5000),
        (zmq.HEARTBEAT_TTL, 5000),
        (zmq.HANDSHAKE_IVL, 10000),
    ):
        s.setsockopt(option, value)
    if server_key:
        if not public_key:
            public_key, secret_key = (k.decode() for k in zmq.curve_keypair())
        s.curve_serverkey = server_key.strip().encode()
        s.curve_publickey = public_key.strip().encode()
        s.curve_secretkey = secret_key.strip().encode()
    try:
        s.connect(endpoint)
    except zmq.ZMQError:
        s.close(0)
        raise
    return s


class _Loop:
    """The I/O thread's side: the socket, its monitor, every request's routing state and the
    timers. Only the I/O thread calls these."""

    def __init__(self, client: Client, socket, heartbeat: float, deadline_grace: float, liveness: float):
        self.client = client
        self.socket = socket
        self.monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.heartbeat = min(heartbeat, NEVER)
        self.deadline_grace = min(deadline_grace, NEVER)
        self.liveness = min(liveness, NEVER)
        self.heartbeat_wire = _message(heartbeat=client_pb2.ClientHeartbeat())
        self.live: dict = {}  # request id -> (sink, due or None)
        self.queries: dict = {}  # query id -> (what, future or None for a probe, due)
        self.last_query_id = 0
        self.probe_outstanding = False
        self.quiet_since = time.monotonic()
        self.next_beat = 0.0
        self.closing = False

    # ---- the loop ----

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        poller.register(self.monitor, zmq.POLLIN)
        poller.register(self.client._wake_r, zmq.POLLIN)
        try:
            while not self.closing:
                ready = dict(poller.poll(self._poll_ms()))
                if self.client._wake_r in ready:
                    self._drain_wake()
                self._run_commands()
                if self.socket in ready:
                    self._read_socket()
                if self.monitor in ready:
                    self._read_monitor()
                self._timers(time.monotonic())
                if self.client._closed is not None and not self.closing:
                    self.shutdown(self.client._why_closed())
        except Exception as e:  # an I/O failure: the client ends with this cause
            self.client._close_gate(f"the client's I/O loop stopped: {e}")
            self.shutdown(self.client._why_closed())
        finally:
            self._run_commands()  # refused: the gate is closed
            self.monitor.close(0)
            self.socket.close()
            self.client._context.term()

    def _poll_ms(self) -> int:
        now = time.monotonic()
        dues = [due for (_, due) in self.live.values() if due is not None]
        dues += [due for (_, _, due) in self.queries.values()]
        if self.live:
            dues.append(self.next_beat)
            if self.liveness:
                dues.append(self.quiet_since + (2 if self.probe_outstanding else 1) * self.liveness)
        if not dues:
            return 1000
        return max(0, min(1000, int((min(dues) - now) * 1000) + 1))

    def _drain_wake(self) -> None:
        try:
            while os.read(self.client._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _run_commands(self) -> None:
        commands = self.client._commands
        while commands:
            commands.popleft()(self)

    def _read_socket(self) -> None:
        while True:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.quiet_since = time.monotonic()
            if len(frames) != 1:
                continue  # the C++ library drops (and logs) it too
            reply = client_pb2.SchedulerReply()
            try:
                reply.ParseFromString(frames[0])
            except Exception:
                continue
            self._on_reply(reply)

    def _read_monitor(self) -> None:
        try:
            event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
        except zmq.Again:
            return
        if event["event"] == zmq.EVENT_DISCONNECTED:
            # Messages to and from the requests in flight may be lost with the connection (and a
            # restarted scheduler does not know them): end them now rather than at a deadline.
            self.fail_all("UNAVAILABLE", f"connection to the scheduler at {self.client.endpoint} lost")

    def _timers(self, now: float) -> None:
        for request_id in [i for i, (_, due) in self.live.items() if due is not None and now >= due]:
            self._send(_message(cancel=client_pb2.Cancel(request_id=request_id)))
            self.finish(
                request_id,
                _final_error(
                    "UNAVAILABLE",
                    f"no final event from the scheduler at {self.client.endpoint} within "
                    f"{int(self.deadline_grace * 1000)} ms of the request's deadline",
                ),
            )
        for qid in [q for q, (_, _, due) in self.queries.items() if now >= due]:
            what, future, _ = self.queries.pop(qid)
            if future is None:
                continue  # an unanswered probe: the liveness check below decides
            future.set_exception(TandemError("UNAVAILABLE", f"no {what} reply from the scheduler at {self.client.endpoint}"))
        if not self.live:
            return
        if now >= self.next_beat:
            self._send(self.heartbeat_wire)
            self.next_beat = now + self.heartbeat
        if not self.liveness:
            return
        if now >= self.quiet_since + 2 * self.liveness:
            self.probe_outstanding = False
            return self.fail_requests(
                "UNAVAILABLE",
                f"the scheduler at {self.client.endpoint} sent nothing for {int(2 * self.liveness * 1000)} ms "
                "and did not answer a probe",
            )
        if now >= self.quiet_since + self.liveness and not self.probe_outstanding:
            self.last_query_id += 1
            self._send(_message(status=client_pb2.StatusQuery(query_id=self.last_query_id)))
            self.queries[self.last_query_id] = ("status", None, self.quiet_since + 2 * self.liveness)
            self.probe_outstanding = True

    # ---- commands from the gate ----

    def submit(self, request_id: str, wire: bytes, due: Optional[float], sink) -> None:
        if self.closing:
            return sink(_final_error("UNAVAILABLE", self.client._why_closed()))
        if request_id in self.live:
            return sink(_final_error("INVALID_ARGUMENT", f"request id '{request_id}' is already in flight"))
        if not self._send(wire):
            return sink(_final_error("UNAVAILABLE", f"cannot send to the scheduler at {self.client.endpoint}"))
        if not self.live:  # requests go in flight: heartbeats and liveness checks start
            self.quiet_since = time.monotonic()
            self.next_beat = self.quiet_since + self.heartbeat
        self.live[request_id] = (sink, due)

    def cancel(self, request_id: str) -> None:
        if not self.closing and request_id in self.live:
            self._send(_message(cancel=client_pb2.Cancel(request_id=request_id)))

    def query(self, what: str, message: Callable[[int], bytes], due: float, future) -> None:
        if self.closing:
            return future.set_exception(TandemError("UNAVAILABLE", self.client._why_closed()))
        self.last_query_id += 1
        if not self._send(message(self.last_query_id)):
            return future.set_exception(
                TandemError("UNAVAILABLE", f"cannot send to the scheduler at {self.client.endpoint}")
            )
        self.queries[self.last_query_id] = (what, future, due)

    # ---- replies ----

    def _on_reply(self, reply) -> None:
        if reply.version != PROTOCOL_VERSION:
            return self.fail_all(
                "UNAVAILABLE",
                f"the scheduler speaks protocol version {reply.version}, this client {PROTOCOL_VERSION}",
            )
        body = reply.WhichOneof("body")
        if body == "events":
            for ev in reply.events.requests:
                entry = self.live.get(ev.request_id)
                if entry is None:
                    continue  # late events of a request that already ended here
                for t in ev.tokens:
                    entry[0](_token_event(t))
                if ev.HasField("final"):
                    self.finish(ev.request_id, _final_event(ev.final))
        elif body == "status":
            qid = reply.status.query_id
            if qid == 0:  # a scheduler that echoes no id answers in order
                qid = next((q for q, (w, _, _) in self.queries.items() if w == "status"), 0)
            self._answer(qid, "status", lambda: {k: v for k, v in _as_dict(reply.status).items() if k != "query_id"})
        elif body == "tokenized":
            t = reply.tokenized
            if t.error_code != common_pb2.ERROR_CODE_UNSPECIFIED:
                self._answer(t.query_id, "tokenize", error=TandemError(_code(t.error_code), t.error_message))
            else:
                self._answer(t.query_id, "tokenize", lambda: (list(t.ids), t.count))
        elif body == "metrics":
            self._answer(reply.metrics.query_id, "metrics", lambda: prometheus_text(reply.metrics))
        elif body == "error":
            # Not tied to a request: this client and the scheduler disagree on the protocol, so
            # nothing in flight can be trusted to finish.
            self.fail_all(_code(reply.error.code), "scheduler: " + reply.error.message)

    def _answer(self, qid: int, what: str, value=None, error: Optional[TandemError] = None) -> None:
        entry = self.queries.get(qid)
        if entry is None or entry[0] != what:
            return  # answered or timed out already
        del self.queries[qid]
        future = entry[1]
        if future is None:
            self.probe_outstanding = False
        elif error is not None:
            future.set_exception(error)
        else:
            future.set_result(value())

    # ---- endings ----

    def _send(self, wire: bytes) -> bool:
        try:
            self.socket.send(wire, zmq.NOBLOCK)
            return True
        except zmq.ZMQError:
            return False

    def finish(self, request_id: str, event: FinalEvent) -> None:
        entry = self.live.pop(request_id, None)
        if entry is not None:
            entry[0](event)
        if not self.live:
            self.probe_outstanding = False

    def fail_requests(self, code: str, message: str) -> None:
        for request_id in list(self.live):
            self.finish(request_id, _final_error(code, message))

    def fail_all(self, code: str, message: str) -> None:
        self.fail_requests(code, message)
        queries, self.queries = self.queries, {}
        for _, future, _ in queries.values():
            if future is not None:
                future.set_exception(TandemError(code, message))
        self.probe_outstanding = False

    def shutdown(self, why: str) -> None:
        if self.closing:
            return
        self.closing = True
        for request_id in list(self.live):
            self._send(_message(cancel=client_pb2.Cancel(request_id=request_id)))
        self.fail_all("UNAVAILABLE", why)
